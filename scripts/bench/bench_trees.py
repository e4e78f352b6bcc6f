#!/usr/bin/env python3
"""Cost per tree: checkpoint and restart of N separately launched trees on
one host, against raw CRIU on the same kind of trees, in one run (issue 20).

For each N in --trees (1, 8, 32, 64), a coordinator of its own (fresh
--ckptdir) and N trees, each `dmtcp-launch --join` of an idle Python program
(a tick on stdout every 0.1 s, tagged with the tree's number).  Beside them,
N copies of the same program started plainly (own session, stdio on
/dev/null).  Each of --runs rounds measures, ours and raw interleaved (which
goes first alternates):

  ours -bc        wall time of `dmtcp-command -bc` (leave-running)
  raw dump        `criu dump --leave-running --shell-job` of the N trees,
                  one after another and all N at once; the faster is the
                  baseline (both are shown); also with an fsync of every
                  image file, as our publication does (bench_checkpoint)
  ours restart    every tree killed by pid, then the generated
                  dmtcp_restart_script.sh until the coordinator has N
                  processes under control and running; then every restored
                  program must tick again
  raw restore     the N raw trees killed, `criu restore -d --shell-job` of
                  all N at once and one after another (faster = baseline)

The coordinator's status ("dmtcp-command -s --json": num_peers, running) is
asked in-process, as bench_checkpoint does, so that polling costs no CLI
start-up.  Also measured: the CPU seconds our processes spent per tree (agents with their criu
children, the coordinator, the restart command), from /proc, to see where
the time goes.  The next round checkpoints the restored trees (both sides).

The table gives the medians, the ratios, and the slope: seconds per extra
tree (least squares over N, per round; the target of the issue is ours'
slope at most 20 ms above raw CRIU's: the checkpoint's against dump +
fsync, the restart's against restore).  A size that fails (64 trees did not
restart) is a finding: its error goes into the table, the other sizes go on.

Everything lives under /var/tmp/dmtcp-bench-trees-<pid>-<random> (or the
workspace of run.py) and is removed at the end, also on failure or Ctrl-C;
only processes started here are killed, by pid.  Coordinators use ports
7960-7979.  Progress goes to stderr, the table to stdout.

    .venv/bin/python scripts/bench/bench_trees.py [--trees 1,8,32,64] [--runs 3]
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

import bench_checkpoint as bc  # helpers shared with the other benchmarks
from bench_checkpoint import BenchError, progress, settle, wait_until
from benchlib import raise_nofile
from report import Row, Target

from dmtcp_py.client import coordinator_alive
from dmtcp_py.paths import criu_binary

PORTS = range(7960, 7980)
SIZES = (1, 8, 32, 64)
TIME_BUDGET = 1500          # seconds for the whole standalone run
READY_TIMEOUT = 120.0       # N trees launched and under control
OP_TIMEOUT = 180.0          # one checkpoint, restart, or N dumps/restores
TICK_TIMEOUT = 10.0         # every restored program ticked again
GONE_TIMEOUT = 20.0         # killed trees gone, and the coordinator saw it
MIB_PER_TREE = 16           # what settle() writes and frees per tree (images ~ RSS)
QUIET_WINDOW = 0.3          # wait_quiet: an agent is idle when it used
QUIET_CPU = 0.002           # less than this much CPU over the window
QUIET_TIMEOUT = 30.0
SLOPE_SLACK = 0.020         # the issue: at most 20 ms per tree beyond restore's own
TREE_NAMES = ("dmtcp_tree_init", "python3")   # processes of a tree, not of ours
SECTION = "many trees (one idle Python process each)"

# the idle program: a tick with its tag every 0.1 s (argv[1] is the tag),
# one write per line: print() under PYTHONUNBUFFERED writes the text and
# the newline apart, and the restored trees, released at once, tick at
# once into one output; a line cut by another's was not seen as a tick,
# and "until all tick" grew by a tick or two
PROGRAM = ("import sys, time\n"
           "n = 0\n"
           "while True:\n"
           "    n += 1\n"
           "    sys.stdout.write(f'tick {sys.argv[1]} {n}\\n')\n"
           "    sys.stdout.flush()\n"
           "    time.sleep(0.1)\n")


class Workspace(bc.Workspace):
    """bench_checkpoint's workspace, named for this benchmark."""

    port_range = PORTS
    name = "dmtcp-bench-trees"


# ---- processes: CPU time, and killing exactly ours ---------------------------------

def cpu_of(procs: list[psutil.Process]) -> float:
    """user+system seconds of these processes and of their reaped children."""
    total = 0.0
    for proc in procs:
        try:
            t = proc.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def descendants(pids: list[int]) -> list[psutil.Process]:
    out = []
    for pid in pids:
        try:
            root = psutil.Process(pid)
            out += [root, *root.children(recursive=True)]
        except psutil.Error:
            pass
    return out


def is_tree(proc: psutil.Process) -> bool:
    try:
        return proc.name() in TREE_NAMES
    except psutil.Error:
        return False


def kill_all(procs: list[psutil.Process]) -> None:
    """SIGKILL all at once (psutil checks each is still the same process),
    then wait for each to go."""
    for proc in procs:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=GONE_TIMEOUT)


def marked(marker: str) -> list[psutil.Process]:
    """Processes whose command line holds this run's unique marker (the
    tag of every program, the workspace path in every command we start):
    the last resort of cleanup, for processes orphaned by a kill."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if proc.pid != os.getpid() and any(marker in a for a in proc.info["cmdline"] or ()):
            found.append(proc)
    return found


# ---- one size: the computation and the plain trees ----------------------------------

@dataclass
class Samples:
    n: int
    values: dict[str, list[float]] = field(default_factory=dict)
    error: str | None = None

    def add(self, key: str, value: float) -> None:
        self.values.setdefault(key, []).append(value)

    def median(self, key: str) -> float | None:
        vals = self.values.get(key)
        return statistics.median(vals) if vals else None


@dataclass
class Ours:
    port: int
    ckptdir: Path
    coordinator: subprocess.Popen
    launcher: list[subprocess.Popen]      # dmtcp-launch of each tree, or the restart script
    out: Path                             # where the restored programs' ticks go

    def procs(self) -> list[psutil.Process]:
        return descendants([p.pid for p in self.launcher])

    def agents(self) -> list[psutil.Process]:
        return [p for p in self.procs() if not is_tree(p)]

    def trees(self) -> list[psutil.Process]:
        return [p for p in self.procs() if is_tree(p)]


def status(port: int) -> dict:
    return bc.coordinator_status(port) or {}


def under_control(ours: Ours, n: int, what: str) -> None:
    def ready() -> bool:
        for proc in ours.launcher:
            if proc.poll() is not None:
                raise BenchError(f"{what}: {proc.args[0]} exited with {proc.returncode} "
                                 f"(status {status(ours.port)})")
        st = status(ours.port)
        return st.get("num_trees") == n and st.get("num_peers") == n and bool(st.get("running"))

    wait_until(ready, f"{what}: {n} trees under control and running", OP_TIMEOUT)


def start_coordinator(ws: bc.Workspace, n: int) -> Ours:
    port = ws.free_port(PORTS)
    ckptdir = ws.base / f"trees-{n}"
    ckptdir.mkdir()
    port_file = ws.base / f"coordinator-{n}.port"
    coord = ws.spawn([str(bc.BIN / "dmtcp-coordinator"), "-p", str(port), "--port-file",
                      str(port_file), "--ckptdir", str(ckptdir), "-q"],
                     ws.base / f"coordinator-{n}.out")
    wait_until(lambda: port_file.exists() or coord.poll() is not None,
               "the coordinator to listen", 30)
    if coord.poll() is not None:
        raise BenchError(f"dmtcp-coordinator exited with {coord.returncode}")
    return Ours(port, ckptdir, coord, [], ws.base / f"restart-{n}.out")


def launch(ws: bc.Workspace, ours: Ours, n: int, marker: str) -> None:
    # each dmtcp-launch is a Python interpreter starting: launched one after
    # another, a few at a time, so 64 of them do not fight for 2 cores
    for i in range(n):
        ours.launcher.append(ws.spawn(
            [str(bc.BIN / "dmtcp-launch"), "--join", "-p", str(ours.port), "python3", "-c",
             PROGRAM, f"{marker}-{n}-{i}"], ws.base / f"launch-{n}-{i}.out", cwd=ws.base))
        if i % 4 == 3:
            wait_until(lambda: (status(ours.port).get("num_peers") or 0) >= i + 1,
                       f"tree {i + 1} of {n} under control", READY_TIMEOUT)
    under_control(ours, n, "launch")


def start_direct(ws: bc.Workspace, n: int, marker: str) -> list[psutil.Process]:
    procs = []
    for i in range(n):
        proc = subprocess.Popen(["python3", "-c", PROGRAM, f"{marker}-raw-{n}-{i}"],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        ws.children.append(proc)
        procs.append(ws.adopt(proc.pid))
    wait_until(lambda: all(ticked(p) for p in procs), f"{n} plain programs to tick", READY_TIMEOUT)
    return procs


def ticked(proc: psutil.Process) -> bool:
    """The program has written something (its stdout is /dev/null): /proc/PID/io."""
    try:
        return proc.io_counters().write_chars > 0
    except psutil.Error:
        return False


# ---- the measurements ------------------------------------------------------------------

def wait_quiet(procs: list[psutil.Process]) -> None:
    """Until these processes use (almost) no CPU: an agent imports what
    checkpoints need a moment after it starts (runner.WARM_UP_AFTER), which
    is not the checkpoint's work."""
    deadline = time.monotonic() + QUIET_TIMEOUT
    last = cpu_of(procs)
    while time.monotonic() < deadline:
        time.sleep(QUIET_WINDOW)
        now = cpu_of(procs)
        if now - last < QUIET_CPU * len(procs):
            return
        last = now


def checkpoint_ours(ours: Ours, n: int, s: Samples) -> None:
    wait_quiet(ours.agents())
    settle(n * MIB_PER_TREE)
    agents, coord = ours.agents(), psutil.Process(ours.coordinator.pid)
    trees = ours.trees()
    before = cpu_of(agents), cpu_of([coord]), cpu_of(trees)
    wall, reported = bc.timed(bc.our_checkpoint, bc.Computation(ours.port, ours.coordinator))
    after = cpu_of(agents), cpu_of([coord]), cpu_of(trees)
    s.add("ckpt", wall)
    s.add("ckpt_reported", reported)
    s.add("ckpt_cpu_agent", (after[0] - before[0]) / n)
    s.add("ckpt_cpu_coord", after[1] - before[1])
    s.add("ckpt_cpu_tree", (after[2] - before[2]) / n)
    progress(f"  ours: -bc {wall:.3f} s (coordinator says {reported:.3f} s); CPU per agent "
             f"{(after[0] - before[0]) / n * 1e3:.0f} ms, per program "
             f"{(after[2] - before[2]) / n * 1e3:.0f} ms, coordinator "
             f"{(after[1] - before[1]) * 1e3:.0f} ms")


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _criu(argv: list[str], images: Path) -> subprocess.Popen:
    return subprocess.Popen([criu_binary(), *argv, "-D", str(images), "--shell-job"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def _finish(procs: list[subprocess.Popen], what: str, dirs: list[Path]) -> None:
    errors = []
    for proc, images in zip(procs, dirs):
        try:
            _, err = proc.communicate(timeout=OP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            err = "no answer"
        if proc.returncode != 0:
            errors.append(f"{images.name}: {err.strip().splitlines()[-1:] or proc.returncode}")
    if errors:
        raise BenchError(f"criu {what} failed for {len(errors)} trees: {errors[0]} "
                         f"(log in {dirs[0].parent})")


def criu_all(argv: list[str], dirs: list[Path], what: str, parallel: bool,
             per_tree: list[list[str]] | None = None) -> None:
    """criu ARGV -D DIR --shell-job for each DIR, one after another or all at once."""
    extra = per_tree or [[] for _ in dirs]
    if parallel:
        _finish([_criu(argv + e, d) for d, e in zip(dirs, extra)], what, dirs)
    else:
        for d, e in zip(dirs, extra):
            _finish([_criu(argv + e, d)], what, [d])


def dump_raw(ws: bc.Workspace, direct: list[psutil.Process], n: int, s: Samples) -> None:
    for mode, parallel in (("serial", False), ("parallel", True)):
        dirs = [ws.base / f"raw-{mode}" / str(i) for i in range(n)]
        bc._remove(ws.base / f"raw-{mode}")
        for d in dirs:
            d.mkdir(parents=True)
        settle(n * MIB_PER_TREE)
        cpu = _children_cpu()
        seconds = bc.timed(criu_all, ["dump", "--leave-running", "-o", "dump.log"],
                           dirs, "dump", parallel,
                           [["-t", str(p.pid)] for p in direct])[0]
        s.add(f"raw_dump_cpu_{mode}", (_children_cpu() - cpu) / n)
        # what publication does to make our images durable (bench_checkpoint)
        durable = seconds + bc.timed(lambda: [bc.fsync_all(d) for d in dirs])[0]
        s.add(f"raw_dump_{mode}", seconds)
        s.add(f"raw_dump_fsync_{mode}", durable)
        progress(f"  raw:  {n} dumps, {mode}: {seconds:.3f} s (+ fsync {durable - seconds:.3f} s), "
                 f"CPU per tree {(_children_cpu() - cpu) / n * 1e3:.0f} ms")
    for key in ("raw_dump", "raw_dump_fsync"):
        s.add(key, min(s.values[f"{key}_serial"][-1], s.values[f"{key}_parallel"][-1]))


def kill_ours(ours: Ours) -> None:
    """Every tree killed by pid (agents, programs, and a restart command's
    processes), then the coordinator has seen them go."""
    kill_all(ours.procs())
    for proc in ours.launcher:
        proc.wait(GONE_TIMEOUT)
    wait_until(lambda: status(ours.port).get("num_trees") == 0,
               "the coordinator to see the killed trees go", GONE_TIMEOUT)


def restart_ours(ws: bc.Workspace, ours: Ours, n: int, s: Samples) -> None:
    script = ours.ckptdir / "dmtcp_restart_script.sh"
    if not script.exists():
        raise BenchError(f"no {script.name} in {ours.ckptdir}")
    ours.out.write_bytes(b"")
    settle(n * MIB_PER_TREE)
    start = time.monotonic()
    ours.launcher = [ws.spawn(["bash", str(script)], ours.out, cwd=ws.base)]
    try:
        under_control(ours, n, "restart")
    except BenchError as exc:
        raise BenchError(f"{exc}; restart output: "
                         f"{ours.out.read_text(errors='replace').strip()[-800:]!r}") from None
    wall = time.monotonic() - start
    procs = ours.procs()
    for proc in procs:
        ws.adopt_if_alive(proc.pid)  # (a helper of the restart may have ended since)
    mine = [p for p in procs if not is_tree(p)]
    cpu = cpu_of(mine)
    coord = status(ours.port)
    s.add("restart", wall)
    s.add("restart_cpu", cpu / n)
    tags = {f"{t}" for t in _tags(ws, n)}

    def all_ticked() -> bool:
        seen = {ln.split()[1] for ln in ours.out.read_text(errors="replace").splitlines()
                if ln.startswith("tick ") and len(ln.split()) == 3}
        return tags <= seen

    wait_until(all_ticked, "every restored program to tick again", TICK_TIMEOUT)
    ticks = time.monotonic() - start
    s.add("restart_ticks", ticks)
    progress(f"  ours: restart {wall:.3f} s (all {n} ticking after {ticks:.3f} s); CPU of "
             f"the restart's processes per tree {cpu / n * 1e3:.0f} ms; coordinator "
             f"generation {coord.get('generation')}")


def _tags(ws: bc.Workspace, n: int) -> list[str]:
    return [f"{ws.marker}-{n}-{i}" for i in range(n)]


def restore_raw(ws: bc.Workspace, direct: list[psutil.Process], n: int,
                s: Samples) -> list[psutil.Process]:
    """Each mode restores its own images of the same trees; what the serial
    restore gave back runs on into the next round."""
    restored: list[psutil.Process] = []
    for mode, parallel in (("parallel", True), ("serial", False)):
        kill_all(restored or direct)
        dirs = [ws.base / f"raw-{mode}" / str(i) for i in range(n)]
        for d in dirs:
            (d / "restored.pid").unlink(missing_ok=True)
        settle(n * MIB_PER_TREE)
        cpu = _children_cpu()
        seconds = bc.timed(criu_all, ["restore", "-d", "-o", "restore.log"], dirs, "restore",
                           parallel, [["--pidfile", str(d / "restored.pid")] for d in dirs])[0]
        s.add(f"raw_restore_{mode}", seconds)
        s.add(f"raw_restore_cpu_{mode}", (_children_cpu() - cpu) / n)
        restored = [ws.adopt(int((d / "restored.pid").read_text())) for d in dirs]
        progress(f"  raw:  {n} restores, {mode}: {seconds:.3f} s, CPU per tree "
                 f"{(_children_cpu() - cpu) / n * 1e3:.0f} ms")
    s.add("raw_restore", min(s.values["raw_restore_serial"][-1],
                             s.values["raw_restore_parallel"][-1]))
    counts = {p.pid: p.io_counters().write_chars for p in restored}
    wait_until(lambda: all(p.io_counters().write_chars > counts[p.pid] for p in restored),
               "every raw restored program to tick again", TICK_TIMEOUT)
    return restored


def measure(ws: bc.Workspace, n: int, runs: int) -> Samples:
    """Every round of one size; the error instead of the figures if one failed."""
    s = Samples(n)
    started = time.time()
    raise_nofile(4 * n + 256)
    ours: Ours | None = None
    direct: list[psutil.Process] = []
    try:
        progress(f"{n} trees: launching")
        ours = start_coordinator(ws, n)
        launch(ws, ours, n, ws.marker)
        direct = start_direct(ws, n, ws.marker)
        for run in range(runs):
            ours_first = run % 2 == 0
            progress(f"{n} trees, round {run + 1} of {runs} "
                     f"({'ours' if ours_first else 'raw CRIU'} first)")
            bc.in_order(ours_first, lambda: checkpoint_ours(ours, n, s),
                        lambda: dump_raw(ws, direct, n, s))
            kill_ours(ours)
            kill_all(direct)

            def raw_side() -> None:
                direct[:] = restore_raw(ws, direct, n, s)   # they run on into the next round

            bc.in_order(ours_first, lambda: restart_ours(ws, ours, n, s), raw_side)
    except BenchError as exc:
        if "time budget" in str(exc):
            raise       # the whole run gives up, not just this size
        s.error = str(exc)
        progress(f"{n} trees: FAILED: {exc}")
        _collect_errors(ws, started, s)
    finally:
        _end_size(ws, ours, direct)
    return s


def _collect_errors(ws: bc.Workspace, since: float, s: Samples) -> None:
    """The error lines of this size's agent, coordinator and CRIU logs (the
    run directory, DMTCP_TMPDIR): on stderr, the first ones in the table."""
    lines = []
    for log in sorted(ws.run_dir.rglob("*.log")):
        try:
            if log.stat().st_mtime < since:
                continue
            for ln in log.read_text(errors="replace").splitlines():
                if ("ERROR" in ln or "WARNING" in ln or "Error" in ln) \
                        and "RLIMIT_NOFILE" not in ln:
                    lines.append(f"{log.name}: {ln}")
        except OSError:
            pass
    if lines:
        progress(f"{len(lines)} error/warning lines in the logs, the first ones:")
        for ln in lines[:20]:
            progress(f"    {ln[:300]}")
        s.error = f"{s.error}; logs: " + " | ".join(ln[:200] for ln in lines[:3])


def _end_size(ws: bc.Workspace, ours: Ours | None, direct: list[psutil.Process]) -> None:
    """Nothing of this size stays: trees, coordinator, images."""
    if ours is not None:
        kill_all(ours.procs())
        if coordinator_alive("127.0.0.1", ours.port):
            bc._quit_coordinator(ours.port)
        try:
            ours.coordinator.wait(GONE_TIMEOUT)
        except subprocess.TimeoutExpired:
            ours.coordinator.kill()
            ours.coordinator.wait()
        for proc in ours.launcher:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    kill_all(direct)
    kill_all(marked(ws.marker))   # orphans of a killed agent, if any
    for name in ("raw-serial", "raw-parallel"):
        bc._remove(ws.base / name)
    if ours is not None:
        bc._remove(ours.ckptdir)


# ---- the table ---------------------------------------------------------------------

def slope(ns: list[int], ts: list[float]) -> float:
    """Least-squares seconds per extra tree."""
    if len(ns) < 2:
        return float("nan")
    mn, mt = statistics.fmean(ns), statistics.fmean(ts)
    den = sum((x - mn) ** 2 for x in ns)
    return sum((x - mn) * (t - mt) for x, t in zip(ns, ts)) / den


def slopes(results: list[Samples], key: str) -> list[float]:
    """One slope per round index (rounds of every size done), over the sizes."""
    good = [r for r in results if key in r.values and not r.error]
    if len(good) < 2:
        return []
    runs = min(len(r.values[key]) for r in good)
    return [slope([r.n for r in good], [r.values[key][i] for r in good]) for i in range(runs)]


def _f(v: float | None, scale: float = 1.0, digits: int = 3) -> str:
    return "—" if v is None else f"{v * scale:.{digits}f}"


def table(results: list[Samples], runs: int) -> str:
    lines = [
        f"Idle Python programs, each its own tree, one host; {runs} rounds; medians, seconds.",
        "raw dump/restore: the faster of one-after-another (ser) and all-at-once (par).",
        "",
        "| N | ours -bc | raw dump (ser / par) | ratio | raw dump + fsync | ours restart "
        "| raw restore (ser / par) | ratio | ours slope | raw slope |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    prev = None
    for r in results:
        if r.error:
            lines.append(f"| {r.n} | FAILED: {r.error[:300]} | | | | | | | | |")
            continue
        m = r.median
        ck, rd, rs, rr = m("ckpt"), m("raw_dump"), m("restart"), m("raw_restore")
        if prev is not None:
            dn = r.n - prev.n
            pm = prev.median
            sl = (f"{(ck - pm('ckpt')) / dn * 1e3:.0f} / {(rs - pm('restart')) / dn * 1e3:.0f} ms",
                  f"{(rd - pm('raw_dump')) / dn * 1e3:.0f} / "
                  f"{(rr - pm('raw_restore')) / dn * 1e3:.0f} ms")
        else:
            sl = ("", "")
        lines.append(
            f"| {r.n} | {_f(ck)} | {_f(rd)} ({_f(m('raw_dump_serial'))} / "
            f"{_f(m('raw_dump_parallel'))}) | {ck / rd:.1f}x | {_f(m('raw_dump_fsync'))} | "
            f"{_f(rs)} | {_f(rr)} "
            f"({_f(m('raw_restore_serial'))} / {_f(m('raw_restore_parallel'))}) | "
            f"{rs / rr:.1f}x | {sl[0]} | {sl[1]} |")
        prev = r
    lines += ["", "slope columns: (checkpoint / restart) seconds per extra tree from the "
              "previous N, in ms.", ""]
    for what, ours, raw in (("checkpoint", "ckpt", "raw_dump_fsync"),
                            ("checkpoint (against the bare dump)", "ckpt", "raw_dump"),
                            ("restart", "restart", "raw_restore")):
        o, w = slopes(results, ours), slopes(results, raw)
        if o and w:
            lines.append(f"- {what}: least-squares slope over N, median of rounds: ours "
                         f"{statistics.median(o) * 1e3:.1f} ms/tree, raw CRIU "
                         f"{statistics.median(w) * 1e3:.1f} ms/tree; target ours ≤ raw + "
                         f"{SLOPE_SLACK * 1e3:.0f} ms: "
                         + ("PASS" if statistics.median(o) <= statistics.median(w) + SLOPE_SLACK
                            else "MISS"))
    lines += ["", "CPU seconds per tree (medians, ms): ours checkpoint = agent with its criu; "
              "ours restart = every process of the restart but the programs (dmtcp_restart, "
              "agents, criu), divided by N; raw = the criu processes.", "",
              "| N | ours ckpt agent | program (shim) | coordinator (total) | raw dump ser / par "
              "| ours restart | raw restore ser / par | restart until all tick |",
              "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in results:
        if r.error:
            continue
        m = r.median
        lines.append(
            f"| {r.n} | {_f(m('ckpt_cpu_agent'), 1e3, 0)} | {_f(m('ckpt_cpu_tree'), 1e3, 0)} | "
            f"{_f(m('ckpt_cpu_coord'), 1e3, 0)} | {_f(m('raw_dump_cpu_serial'), 1e3, 0)} / "
            f"{_f(m('raw_dump_cpu_parallel'), 1e3, 0)} | {_f(m('restart_cpu'), 1e3, 0)} | "
            f"{_f(m('raw_restore_cpu_serial'), 1e3, 0)} / "
            f"{_f(m('raw_restore_cpu_parallel'), 1e3, 0)} | {_f(m('restart_ticks'))} s |")
    return "\n".join(lines)


INF = [float("inf")]
SLOPE_TARGET = Target(1.0, SLOPE_SLACK, f"≤ raw + {SLOPE_SLACK * 1e3:.0f} ms/tree")


def rows(results: list[Samples]) -> list[Row]:
    """The rows of run.py's table: per size, checkpoint and restart against
    raw CRIU (a failed size: inf, and a MISS); the slopes against raw's."""
    out = []
    for r in results:
        v = r.values
        failed = r.error is not None or "restart" not in v
        out += [
            Row(SECTION, f"{r.n} trees: checkpoint (-bc)", INF if failed else v["ckpt"],
                v.get("raw_dump_fsync") or INF,
                "criu dump of each + fsync (faster of serial, parallel)", "s"),
            Row(SECTION, f"{r.n} trees: checkpoint (-bc)", INF if failed else v["ckpt"],
                v.get("raw_dump") or INF, "criu dump of each (faster of serial, parallel)", "s"),
            Row(SECTION, f"{r.n} trees: restart" + (" (FAILED)" if failed else ""),
                INF if failed else v["restart"], v.get("raw_restore") or INF,
                "criu restore of each (faster of serial, parallel)", "s"),
        ]
    for what, ours, raw, base, target in (
            ("checkpoint", "ckpt", "raw_dump_fsync", "criu dump + fsync", SLOPE_TARGET),
            ("checkpoint", "ckpt", "raw_dump", "criu dump", None),
            ("restart", "restart", "raw_restore", "criu restore", SLOPE_TARGET)):
        o, w = slopes(results, ours), slopes(results, raw)
        if o and w:
            out.append(Row(SECTION, f"{what}: cost per extra tree", o, w,
                           f"{base}: cost per extra tree", "ms", target))
    return out


def measure_all(ws: bc.Workspace, sizes: list[int], runs: int) -> list[Samples]:
    if not hasattr(ws, "marker"):
        ws.marker = f"dmtcp-bench-trees-{os.getpid()}-{ws.base.name[-8:]}"
    return [measure(ws, n, runs) for n in sizes]


# ---- main ------------------------------------------------------------------------------

def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trees", type=bc.positive_ints, default=",".join(map(str, SIZES)),
                   help="comma-separated numbers of trees")
    p.add_argument("--runs", type=int, default=3, help="rounds per number of trees")
    p.add_argument("--budget", type=int, default=TIME_BUDGET, help="seconds before giving up")
    p.add_argument("--keep-logs", action="store_true",
                   help="keep the agent, coordinator and CRIU logs (the run directory)")
    args = p.parse_args()
    if args.runs < 1 or args.budget < 1:
        p.error("--runs and --budget must be at least 1")
    return args


def main() -> int:
    args = parse_args()
    ws = Workspace(keep_logs=args.keep_logs)

    def work() -> str:
        return table(measure_all(ws, args.trees, args.runs), args.runs)

    return bc.run_guarded("bench_trees", ws, work, args.budget)


if __name__ == "__main__":
    sys.exit(main())
