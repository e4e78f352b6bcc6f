#!/usr/bin/env python3
"""Stop time of a checkpoint that continues, as the application sees it.

For each N in --procs, a tree of N processes runs under `dmtcp-launch` with
a coordinator of its own.  Every process holds MIB MiB of touched,
non-repeating memory (the first one fills its buffer and forks N-1 children,
which fill it again with data of their own, so no page stays shared) and
then loops on clock_gettime(CLOCK_MONOTONIC) + nanosleep(1 ms), keeping the
largest gap between two consecutive iterations.  On SIGUSR1 a process writes
"gap <pid> <max_gap_ns>" (one write(2)) to the stdout all of them share, and
starts a new maximum.  Each of --runs rounds then measures

  baseline   the largest gap of any process over ~0.5 s without checkpoint:
             what the scheduling of this machine gives (includes the 1 ms sleep)
  stop       the largest gap of any process over a window holding one
             `dmtcp-command -bc` (leave-running): how long the program's
             threads stayed stopped, as the program itself sees it
  -bc wall   the wall time of that `dmtcp-command -bc`
  frozen     CRIU's frozen_time from its stats-dump (the agent's CRIU work
             directory is the run directory, as in bench_checkpoint.py)

and the table adds, per run, stop - frozen of the same dump ("beyond": what
is added around CRIU), stop time per MiB of the whole tree and the ratio to the
first N, to judge the target "stop time grows with memory, not with the
number of processes" (total memory grows with N here).

Everything lives under /var/tmp/dmtcp-bench-<pid>-<random> (images, logs via
DMTCP_TMPDIR, the test program) and is removed at the end, also on failure
or Ctrl-C; the computation is stopped with `dmtcp-command -k` and `-q`, then
what is left of the processes started here is killed by pid.  Coordinators
use ports 7960-7999.  Progress goes to stderr, the table to stdout.  The
whole run gives up after TIME_BUDGET seconds.

    .venv/bin/python scripts/bench/bench_stop.py [--procs 1,8,32] [--mib 64] [--runs 3] [--precopy]
"""
from __future__ import annotations

import argparse
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

import bench_checkpoint as bc  # helpers shared with the checkpoint benchmark
from bench_checkpoint import BenchError, progress, run_checked, settle, wait_until

from dmtcp_py import procfs
from dmtcp_py.client import coordinator_alive
from dmtcp_py.paths import run_dir

PORTS = range(7960, 8000)
TIME_BUDGET = 280           # seconds for the whole run: it must end by itself
READY_TIMEOUT = 60.0        # every process filled its memory and is under control
REPORT_TIMEOUT = 10.0       # every process answered SIGUSR1
EXIT_TIMEOUT = bc.EXIT_TIMEOUT
BASELINE_S = 0.5
PROGRAM_NAME = "stop_gap"   # also its process name (under 16 characters)

# what every gap-measuring program has (bench_migrate's too): SIGUSR1 asks
# for the largest gap, now_ns() reads the clock, say() writes one line
GAP_C_COMMON = r"""
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t report;
uint64_t *volatile keep;    /* the buffer escapes: no store is optimised away */

static void on_usr1(int sig)
{
    (void)sig;
    report = 1;
}

static int64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* one line, one write(2): lines of different processes do not interleave */
static void say(const char *what, long long value)
{
    char line[96];
    int len = snprintf(line, sizeof line, "%s %d %lld\n", what, (int)getpid(), value);

    if (write(1, line, (size_t)len) != len)
        _exit(3);
}
"""

PROGRAM_C = GAP_C_COMMON + r"""

static void fill(uint64_t *buf, size_t words)
{
    uint64_t x = 0x9e3779b97f4a7c15ull ^ ((uint64_t)getpid() << 20) ^ (uint64_t)getpid();

    for (size_t i = 0; i < words; i++) {    /* xorshift64: never 0, never repeats */
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        buf[i] = x;
    }
    keep = buf;
}

int main(int argc, char **argv)
{
    size_t bytes = strtoull(argc > 1 ? argv[1] : "64", NULL, 10) << 20;
    long procs = strtol(argc > 2 ? argv[2] : "1", NULL, 10);
    struct sigaction sa;
    struct timespec tick = { 0, 1000000 };
    int64_t prev, now, gap, max_gap = 0;
    uint64_t *buf;

    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;    /* no SA_RESTART: SIGUSR1 cuts the sleep short */
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGUSR1, &sa, NULL) < 0) {
        perror("sigaction");
        return 1;
    }
    buf = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    fill(buf, bytes / 8);
    for (long i = 1; i < procs; i++) {
        pid_t pid = fork();

        if (pid < 0) {
            perror("fork");
            return 1;
        }
        if (pid == 0) {
            fill(buf, bytes / 8);   /* every page its own: nothing shared with the parent */
            break;
        }
    }
    say("ready", 0);
    prev = now_ns();
    for (;;) {
        nanosleep(&tick, NULL);     /* EINTR (a checkpoint, SIGUSR1): just look at the time */
        now = now_ns();
        gap = now - prev;
        if (gap > max_gap)
            max_gap = gap;
        prev = now;
        if (report) {
            report = 0;
            say("gap", max_gap);
            max_gap = 0;
            prev = now_ns();        /* the write is not a gap of the program's */
        }
    }
}
"""


# ---- what the benchmark creates, and its removal ------------------------------

class Workspace(bc.Workspace):
    """bench_checkpoint's workspace, with our ports and a `-k` before `-q`."""

    port_range = PORTS

    def cleanup(self) -> None:
        for port in self.ports:
            if coordinator_alive("127.0.0.1", port):
                try:
                    subprocess.run([str(bc.BIN / "dmtcp-command"), "-p", str(port), "-k"],
                                   capture_output=True, timeout=EXIT_TIMEOUT, check=False)
                except subprocess.TimeoutExpired:
                    pass  # -q and the kills by pid follow
        for child in self.children:
            try:
                child.wait(EXIT_TIMEOUT / 4)
            except subprocess.TimeoutExpired:
                pass      # killed by the base class
        super().cleanup()   # -q, then by pid, then the directory


def compile_program(workdir: Path) -> Path:
    source, binary = workdir / f"{PROGRAM_NAME}.c", workdir / PROGRAM_NAME
    source.write_text(PROGRAM_C)
    run_checked(["cc", "-O2", "-pthread", "-o", str(binary), str(source)])
    return binary


# ---- the tree under test ---------------------------------------------------------

def new_lines(path: Path, offset: int) -> tuple[list[list[str]], int]:
    """The complete lines of path after offset, split in words, and the
    offset after them."""
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read()
    end = data.rfind(b"\n") + 1
    return [ln.split() for ln in data[:end].decode(errors="replace").splitlines()], offset + end


@dataclass
class Tree:
    comp: bc.Computation | None     # None: the tree outside our control (start_direct)
    out: Path                       # the program's shared stdout
    procs: list[psutil.Process]     # the program's processes, the root first if direct
    starter: subprocess.Popen       # dmtcp-launch, or the direct tree's root
    offset: int = 0                 # of out: what was read already

    def lines(self) -> list[list[str]]:
        """Complete lines written since the last call, split in words."""
        words, self.offset = new_lines(self.out, self.offset)
        return words

    def gaps(self) -> dict[int, int]:
        """SIGUSR1 to every process; each one's largest gap (ns) since the last time."""
        self.lines()                # nothing pending counts for this request
        for proc in self.procs:
            try:
                proc.send_signal(signal.SIGUSR1)   # psutil: only if still the same process
            except psutil.NoSuchProcess:
                raise BenchError(f"process {proc.pid} of the program exited") from None
        # each says its getpid(): its id in the tree's PID namespace, if any
        pids = {procfs.ns_pid(p.pid) for p in self.procs}
        got: dict[int, int] = {}

        def all_answered() -> bool:
            for words in self.lines():
                if len(words) == 3 and words[0] == "gap" and int(words[1]) in pids:
                    got[int(words[1])] = int(words[2])
            if self.starter.poll() is not None:
                raise BenchError(f"{Path(self.starter.args[0]).name} exited with "
                                 f"{self.starter.returncode}")
            return len(got) == len(pids)

        wait_until(all_answered, "every process to report its gap", REPORT_TIMEOUT)
        return got


def coordinator_pid(port: int) -> int | None:
    """The pid of the process listening on port (the coordinator the launch
    started for us), to kill it by pid if -q fails."""
    for conn in psutil.net_connections("tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid:
            return conn.pid
    return None


def launch(ws: Workspace, program: Path, procs: int, mib: int, options: tuple[str, ...] = (),
           label: str = "") -> Tree:
    """options: more of dmtcp-launch's; label: names its files (default: procs)."""
    port = ws.free_port()
    label = label or str(procs)
    out, err = ws.base / f"gaps-{label}.out", ws.base / f"launch-{label}.err"
    ckptdir = ws.base / f"ckpt-{label}"
    with open(out, "ab") as o, open(err, "ab") as e:
        agent = subprocess.Popen(
            [str(bc.BIN / "dmtcp-launch"), "-p", str(port), "--new-coordinator",
             "--ckptdir", str(ckptdir), *options, str(program), str(mib), str(procs)],
            stdin=subprocess.DEVNULL, stdout=o, stderr=e, cwd=ws.base)
    ws.children.append(agent)
    comp = bc.Computation(port, agent)
    ready: set[int] = set()
    tree = Tree(comp, out, [], agent)

    def all_ready() -> bool:
        if agent.poll() is not None:
            raise BenchError(f"dmtcp-launch exited with {agent.returncode}: "
                             f"{err.read_text(errors='replace').strip()[-500:]}")
        ready.update(int(w[1]) for w in tree.lines() if len(w) == 3 and w[0] == "ready")
        if len(ready) < procs:
            return False
        st = bc.coordinator_status(port)
        return bool(st and st["num_peers"] == procs and st["running"])

    wait_until(all_ready, f"{procs} processes filled and under control", READY_TIMEOUT)
    pid = coordinator_pid(port)
    if pid is not None:
        ws.adopt(pid)
    for proc in psutil.Process(agent.pid).children(recursive=True):
        ws.adopt_if_alive(proc.pid)
        try:
            if proc.name() == PROGRAM_NAME:   # not dmtcp_tree_init, nor a criu of the agent
                tree.procs.append(proc)
        except psutil.NoSuchProcess:
            pass
    # (the program says its getpid(): its id in the tree's PID namespace)
    if {procfs.ns_pid(p.pid) for p in tree.procs} != ready:
        raise BenchError(f"expected the processes {sorted(ready)} below dmtcp-launch, "
                         f"found {sorted(p.pid for p in tree.procs)}")
    return tree


def start_direct(ws: Workspace, program: Path, procs: int, mib: int) -> Tree:
    """The same tree outside our control, in a session of its own (so raw
    CRIU needs no --shell-job), once all its processes filled their memory."""
    out = ws.base / f"direct-{procs}.out"
    out.unlink(missing_ok=True)
    root = ws.spawn([str(program), str(mib), str(procs)], out, start_new_session=True)
    tree = Tree(None, out, [], root)
    ready: set[int] = set()

    def all_ready() -> bool:
        if root.poll() is not None:
            raise BenchError(f"the directly started tree exited with {root.returncode}")
        ready.update(int(w[1]) for w in tree.lines() if len(w) == 3 and w[0] == "ready")
        return len(ready) == procs

    wait_until(all_ready, f"{procs} direct processes to fill their memory", READY_TIMEOUT)
    tree.procs = [ws.adopt(root.pid)] + [ws.adopt(pid) for pid in sorted(ready - {root.pid})]
    return tree


def raw_dump_tree(direct: Tree, images: Path) -> tuple[float, float, float, float]:
    """`criu dump --leave-running` of a whole tree (start_direct's):
    (wall seconds, the same plus an fsync of every image file, CRIU frozen
    seconds, the largest gap any of its processes saw meanwhile); the
    images are removed afterwards."""
    direct.gaps()                         # a fresh maximum from here
    seconds = bc.timed(bc.raw_dump, direct.procs[0].pid, images)[0]
    stop = max(direct.gaps().values()) / 1e9
    durable = seconds + bc.timed(bc.fsync_all, images)[0]
    frozen = bc.criu_seconds(images / "stats-dump", "dump", "frozen_time")
    bc._remove(images)
    return seconds, durable, frozen, stop


# ---- the measurements --------------------------------------------------------------

@dataclass
class Result:
    procs: int
    mib: int
    stop: list[float] = field(default_factory=list)       # seconds
    baseline: list[float] = field(default_factory=list)
    wall: list[float] = field(default_factory=list)
    frozen: list[float] = field(default_factory=list)     # may stay empty

    @property
    def total_mib(self) -> int:
        return self.procs * self.mib


def frozen_time() -> float | None:
    try:
        return bc.criu_seconds(run_dir() / "stats-dump", "dump", "frozen_time")
    except BenchError:
        return None


def one_run(tree: Tree, result: Result, index: int, runs: int) -> None:
    settle(result.total_mib)
    tree.gaps()                           # a fresh maximum from here
    time.sleep(BASELINE_S)
    baseline = max(tree.gaps().values())
    (run_dir() / "stats-dump").unlink(missing_ok=True)
    wall, reported = bc.timed(bc.our_checkpoint, tree.comp)
    gaps = tree.gaps()
    stop = max(gaps.values())
    frozen = frozen_time()
    result.stop.append(stop / 1e9)
    result.baseline.append(baseline / 1e9)
    result.wall.append(wall)
    if frozen is not None:
        result.frozen.append(frozen)
    progress(f"  N={result.procs} run {index + 1}/{runs}: stop {stop / 1e6:.1f} ms "
             f"(least-stopped process {min(gaps.values()) / 1e6:.1f} ms), "
             f"baseline {baseline / 1e6:.1f} ms, -bc {wall:.3f} s "
             f"(coordinator says {reported:.3f} s), CRIU frozen "
             + (f"{frozen:.3f} s" if frozen is not None else "n/a"))


def measure(ws: Workspace, program: Path, procs: int, mib: int, runs: int,
            options: tuple[str, ...] = ()) -> Result:
    progress(f"N={procs}: launching {procs} x {mib} MiB")
    tree = launch(ws, program, procs, mib, options)
    result = Result(procs, mib)
    for index in range(runs):
        one_run(tree, result, index, runs)
    bc.stop(tree.comp)
    for proc in tree.procs:
        bc._kill(proc)    # normally gone with -k already
    bc._remove(ws.base / f"ckpt-{procs}")
    return result


# ---- the table -------------------------------------------------------------------------

def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:8.1f}"


def table(results: list[Result], runs: int) -> str:
    ref = results[0]
    ref_stop = statistics.median(ref.stop)
    lines = [
        f"{ref.mib} MiB of touched memory per process, {runs} runs per N; ms unless said",
        "stop = largest gap between 1 ms ticks of any process during the window holding "
        "`dmtcp-command -bc`",
        "",
        f"{'N':>3} {'MiB':>5} | {'stop':>8} {'min':>8} {'max':>8} | {'base max':>8} | "
        f"{'-bc wall':>8} {'frozen':>8} {'beyond':>8} | {'stop/MiB':>8} {'frz/MiB':>8} | "
        f"{'stop/':>6} {'per-MiB':>7}",
        f"{'':>3} {'total':>5} | {'median':>8} {'':>8} {'':>8} | {'median':>8} | "
        f"{'median':>8} {'median':>8} {'median':>8} | {'median':>8} {'median':>8} | "
        f"{f'stop({ref.procs})':>6} {'ratio':>7}",
    ]
    for r in results:
        stop = statistics.median(r.stop)
        frozen = statistics.median(r.frozen) if r.frozen else None
        per_mib = stop / r.total_mib
        lines.append(
            f"{r.procs:>3} {r.total_mib:>5} | {_ms(stop)} {_ms(min(r.stop))} {_ms(max(r.stop))} | "
            f"{_ms(statistics.median(r.baseline))} | {_ms(statistics.median(r.wall))} "
            + (_ms(frozen) if frozen is not None else f"{'n/a':>8}") + " "
            + (_ms(statistics.median(s - f for s, f in zip(r.stop, r.frozen)))
               if len(r.frozen) == len(r.stop) else f"{'n/a':>8}")
            + f" | {per_mib * 1e3:8.3f} "
            + (f"{frozen / r.total_mib * 1e3:8.3f}" if frozen is not None else f"{'n/a':>8}")
            + f" | {stop / ref_stop:6.2f} {per_mib / (ref_stop / ref.total_mib):7.2f}")
    lines.append("")
    if len(results) > 1:
        lines.append(f"stop/stop({ref.procs}): ratio of median stop times; memory grows "
                     f"{results[-1].total_mib / ref.total_mib:g}x from N={ref.procs} "
                     f"to N={results[-1].procs}.")
    lines += [
        f"per-MiB ratio: (stop/MiB at N) / (stop/MiB at N={ref.procs}); about 1 or below: the stop "
        "time follows the memory, no extra cost per process; above 1: each process adds its own.",
        "base max: median of the largest gap without checkpoint (scheduling noise, incl. the 1 ms tick).",
        "beyond: median over the runs of stop - frozen of the same dump (what is added around CRIU).",
    ]
    return "\n".join(lines)


# ---- main ------------------------------------------------------------------------------

def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--procs", type=bc.positive_ints, default="1,8,32",
                   help="comma-separated tree sizes")
    p.add_argument("--mib", type=int, default=64, help="touched memory per process")
    p.add_argument("--runs", type=int, default=3, help="checkpoints per tree size")
    p.add_argument("--keep-logs", action="store_true",
                   help="keep the agent, coordinator and CRIU logs (the run directory)")
    p.add_argument("--precopy", action="store_true", help="launch the trees with --precopy")
    args = p.parse_args()
    if args.mib < 1 or args.runs < 1:
        p.error("--mib and --runs must be at least 1")
    return args


def main() -> int:
    args = parse_args()
    ws = Workspace(keep_logs=args.keep_logs)

    def work() -> str:
        program = compile_program(ws.base)
        options = ("--precopy",) if args.precopy else ()
        results = [measure(ws, program, procs, args.mib, args.runs, options)
                   for procs in args.procs]
        return table(results, args.runs)

    return bc.run_guarded("bench_stop", ws, work, TIME_BUDGET)


if __name__ == "__main__":
    sys.exit(main())
