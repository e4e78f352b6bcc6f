#!/usr/bin/env python3
"""Failures benchmark (MPICH-V's experiment, scaled to this machine): the
MPI solver's time to solution while its processes are killed at random.

  the job          tests/e2e/programs/mpi_solver.c built with Open MPI's
                   mpicc, `mpirun --oversubscribe -np 2`, sized from short
                   native runs (the fastest of three) so that a failure-free
                   run takes about --seconds (60) on a quiet machine
  baselines        the same job natively (no dmtcp), and under dmtcp with
                   no failures (rate 0) in each interval mode
  under failures   `dmtcp-coordinator --auto-restart` with a fixed
                   --interval (10 s) and with `--interval auto` (when the
                   installed coordinator has it), the job started with
                   `dmtcp-launch --join`; failures at 0, 1, 2 and 4 per
                   minute, exponential inter-arrival times drawn from
                   --seed (the same draws for both interval modes); a
                   failure is SIGKILL of one rank chosen at random (or of
                   mpirun, if a killed rank is not restarted: checked first)

A failure is never injected while a recovery is under way, before the first
checkpoint, nor before the previous one's recovery was seen: it waits.  For
each run: time to solution (from the launch until the job printed its
answer, which must be the native run's), failures injected, the restarts and
time lost the coordinator reports, and for each failure the time from the
kill until the coordinator reports the computation running again with all
its processes (status polled in-process every 0.1 s).

Everything lives under /var/tmp/dmtcp-bench-failures-<pid>-<random> (the MPI
session directories too, through TMPDIR) and is removed at the end, also on
failure or Ctrl-C; the Open MPI shared-memory segments our ranks mapped are
removed from /dev/shm; only processes started here are killed, by pid.
Coordinators use ports 7980-7989.  Progress on stderr; a Markdown table on
stdout; a PNG plot (--png).  A product failure (the job never comes back, a
wrong answer, its answer lost) is reported with the end of the coordinator's
log and of the recovery's output (all logs kept with --keep-logs), and the
exit status is then 3.

    .venv/bin/python scripts/bench/bench_failures.py [--seconds 60] [--runs 1] [--seed 1]
    .venv/bin/python scripts/bench/bench_failures.py --quick     # ~2 minutes
    .venv/bin/python scripts/bench/bench_failures.py --json F    # and --from-json F: table
                                                                 # and plot again, no runs
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(1, str(REPO))  # the tests' MPI definitions and solver
import bench_checkpoint as bc  # noqa: E402  (helpers shared with the checkpoint benchmark)
from bench_checkpoint import BenchError, progress, settle, wait_until  # noqa: E402

from dmtcp_py.client import CoordinatorClient  # noqa: E402
from dmtcp_py.errors import UserError  # noqa: E402
from dmtcp_py.paths import run_dir  # noqa: E402
from dmtcp_py.protocol.messages import Cmd  # noqa: E402
from tests.e2e import mpi  # noqa: E402

PORTS = range(7980, 7990)
RANKS = 2
POINTS = 65536               # grid points per rank: two arrays of 0.5 MiB
POLL = 0.1                   # seconds between two looks at the status and the output
RECOVERY_TIMEOUT = 60.0      # a killed job not running again by then never comes back
ENDED_GRACE = 5.0            # a job gone without an answer and without a recovery this long
TARGET_RATE, TARGET_FACTOR = 1.0, 1.5
RATES = (0.0, 1.0, 2.0, 4.0)
QUICK = {"seconds": 20.0, "rates": (0.0, 2.0), "modes": ("fixed",)}
DEFAULT_PNG = REPO / "docs" / "bench_failures.png"
OPENMPI = mpi.OPENMPI


# ---- the workspace ----------------------------------------------------------------

class Workspace(bc.Workspace):
    """bench_checkpoint's, under /var/tmp/dmtcp-bench-failures-<pid>-<random>."""
    port_range = PORTS
    name = "dmtcp-bench-failures"

    def cleanup(self) -> None:
        # below our children (coordinators, launchers) are the restored jobs
        for child in self.children:
            if child.poll() is None:
                for proc in _descendants(child.pid):
                    self.adopted.append(proc)
        super().cleanup()


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _marked(marker: str) -> list[psutil.Process]:
    """Processes whose command line holds the workspace's path (our solver's
    and every command we start): the last resort, for orphans of a kill."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if proc.pid != os.getpid() and any(marker in a for a in proc.info["cmdline"] or ()):
                found.append(proc)
        except psutil.Error:
            pass
    return found


# ---- the job ----------------------------------------------------------------------

@dataclass
class Job:
    exe: Path
    iterations: int
    points: int
    tmpdir: Path                  # Open MPI's session directories go here (TMPDIR)
    segments: set[str] = field(default_factory=set)   # /dev/shm files our ranks mapped

    def argv(self, iterations: int | None = None) -> list[str]:
        return [OPENMPI.mpirun, *OPENMPI.options, "-np", str(RANKS), str(self.exe),
                str(iterations or self.iterations), "0", str(self.points)]

    @property
    def env(self) -> dict:
        return {**os.environ, **OPENMPI.env, "TMPDIR": str(self.tmpdir)}

    def note_segments(self, pids: list[int]) -> bool:
        """Remember the shared-memory files these ranks map: a job killed
        for good leaves them in /dev/shm, and they are ours to remove.
        Whether they map any (not before MPI_Init)."""
        found = False
        for pid in pids:
            try:
                with open(f"/proc/{pid}/maps") as f:
                    for line in f:
                        parts = line.split(maxsplit=5)
                        if len(parts) == 6 and parts[5].startswith("/dev/shm/"):
                            self.segments.add(parts[5].strip().removesuffix(" (deleted)"))
                            found = True
            except OSError:
                pass
        return found

    def remove_segments(self) -> None:
        for path in sorted(self.segments):
            if any(_maps(path)):
                continue    # still mapped: a job of ours that is not over yet
            try:
                os.unlink(path)
            except OSError:
                pass
        self.segments = {p for p in self.segments if os.path.exists(p)}


def _maps(path: str):
    """Processes that map this file."""
    for proc in psutil.process_iter():
        try:
            with open(f"/proc/{proc.pid}/maps") as f:
                if path in f.read():
                    yield proc.pid
        except OSError:
            pass


class Output:
    """New complete lines of a file that grows (and may start again)."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.rest = path, 0, b""
        self.answer: str | None = None
        self.failed: str | None = None

    def read(self) -> None:
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < self.offset:            # written anew
                    self.offset, self.rest = 0, b""
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return
        self.offset += len(data)
        lines = (self.rest + data).split(b"\n")
        self.rest = lines.pop()
        for raw in lines:
            line = raw.decode(errors="replace")
            found = re.match(r"^checksum ([0-9a-f]+)$", line)
            if found and self.answer is None:
                self.answer = found.group(1)
            elif line.startswith("FAIL") and self.failed is None:
                self.failed = line


def build(ws: bc.Workspace, points: int) -> Job:
    tmpdir = ws.base / "tmp"
    tmpdir.mkdir(exist_ok=True)
    return Job(Path(mpi.build(OPENMPI, ws.base)), 0, points, tmpdir)


def native(ws: bc.Workspace, job: Job, iterations: int, timeout: float,
           label: str) -> tuple[float, str]:
    """(seconds until the answer was printed, the answer) of a native run."""
    out = ws.base / f"native-{label}.out"
    out.unlink(missing_ok=True)
    settle()
    start = time.monotonic()
    proc = ws.spawn(job.argv(iterations), out, env=job.env)
    watch = Output(out)
    noted = False
    try:
        while True:
            watch.read()
            now = time.monotonic()
            if watch.answer:
                break
            if proc.poll() is not None:
                watch.read()
                if watch.answer:
                    break
                raise BenchError(f"native mpirun exited with {proc.returncode} without an "
                                 f"answer: {out.read_text(errors='replace')[-300:]!r}")
            if now - start > timeout:
                raise BenchError(f"native mpirun: no answer in {timeout:.0f} s")
            if not noted and now - start > 1.0:
                noted = job.note_segments([p.pid for p in _descendants(proc.pid)])
            time.sleep(POLL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            for p in _descendants(proc.pid):
                bc._kill(p)
            proc.kill()
            proc.wait(30)
    return now - start, watch.answer


def calibrate(ws: bc.Workspace, job: Job, seconds: float) -> int:
    """Iterations for about `seconds` of solving: from a run of 200
    iterations (mpirun's start-up) and three of 20,000, the fastest: other
    people's work on this machine's two cores slows two spinning ranks by
    up to 4x, and changes by the minute; the job is sized for a quiet
    machine."""
    short, _ = native(ws, job, 200, 120, "calibrate-short")
    longer = min(native(ws, job, 20000, 120, f"calibrate-{i}")[0] for i in range(3))
    per_iteration = max(longer - short, 0.05) / (20000 - 200)
    iterations = max(1000, round((seconds - short) / per_iteration / 1000) * 1000)
    progress(f"calibration: mpirun start-up {short:.2f} s, {per_iteration * 1e6:.0f} us an "
             f"iteration: {iterations} iterations for about {seconds:.0f} s")
    return iterations


# ---- the coordinator, in-process --------------------------------------------------

def status(port: int) -> dict | None:
    return bc.coordinator_status(port)


def listing(port: int) -> list[dict]:
    try:
        with CoordinatorClient("127.0.0.1", port, timeout=5.0) as client:
            return client.command(Cmd.LIST).body.get("trees", [])
    except UserError:
        return []


def procs_of(port: int) -> list[list]:
    """[pid, name] or [pid, name, rank] of every process of the computation."""
    return [p for tree in listing(port) for p in tree.get("procs", [])]


def auto_supported() -> bool:
    """Whether the installed coordinator documents `--interval auto`."""
    proc = subprocess.run([str(bc.BIN / "dmtcp-coordinator"), "--help"], capture_output=True,
                          text=True, timeout=60, check=False)
    return bool(re.search(r"--interval\b[^\n]*\bauto\b", proc.stdout))


def log_excerpt(port: int, lines: int = 40) -> str:
    """The end of the coordinator's log and of the recovery's output."""
    parts = []
    for path, n in ((run_dir() / f"coordinator-{port}.log", lines),
                    (run_dir() / f"recovery-{port}.out", 10)):
        try:
            tail = path.read_text(errors="replace").splitlines()[-n:]
        except OSError:
            tail = ["(none)"]
        parts.append(f"--- {path} (last {n} lines):\n" + "\n".join(tail))
    return "\n".join(parts)


# ---- one run under dmtcp ----------------------------------------------------------

@dataclass
class Run:
    rate: float
    mode: str                       # "fixed" or "auto"
    tts: float | None = None        # seconds until the answer was printed
    answer: str | None = None
    failures: int = 0               # kills injected
    restarts: int = 0               # as the coordinator reports them
    time_lost: float = 0.0
    back: list[float] = field(default_factory=list)   # kill -> running again, each failure
    postponed: float = 0.0          # seconds kills waited (recovery, no checkpoint yet)
    generations: int = 0
    interval: float | None = None   # the interval at the end (auto: the coordinator's choice)
    problem: str | None = None      # a failure of ours: what happened
    stdout: str = ""                # where the restored job wrote, when not to a file we watch
    load: float = 0.0               # the machine's load average (1 min) at the end


@dataclass
class Plan:
    seconds: float
    interval: float
    victim: str                     # "rank" or "mpirun"
    seed: int
    timeout: float
    output_mode: int = 0o644        # of the launched job's stdout file


def _kill_victim(port: int, job: Job, victim: str, rng: random.Random) -> tuple[int, str] | None:
    """SIGKILL one rank chosen at random (or mpirun); (pid, what) or None
    when there was none to kill."""
    procs = procs_of(port)
    ranks = [p for p in procs if len(p) > 2]
    job.note_segments([p[0] for p in ranks])
    if victim == "rank":
        choice = rng.choice(sorted(ranks, key=lambda p: p[2])) if ranks else None
        what = f"rank {choice[2]}" if choice else ""
    else:
        found = [p for p in procs if str(p[1]).startswith("mpirun")]
        choice = found[0] if found else None
        what = "mpirun"
    if not choice:
        return None
    pid = choice[0]
    try:
        cmdline = " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return None
    if str(job.exe) not in cmdline:   # not (or no longer) our job's process
        return None
    os.kill(pid, signal.SIGKILL)
    return pid, what


def run_ours(ws: bc.Workspace, job: Job, plan: Plan, rate: float, mode: str,
             rng: random.Random, reference: str, label: str,
             stop_after_recovery: bool = False) -> Run:
    """One run under `dmtcp-coordinator --auto-restart`, with failures at
    `rate` per minute.  stop_after_recovery: the probe, which ends the run
    once the first failure's recovery is seen (or not).  The run's outputs
    and the coordinator's log end up in <run dir>/<label>/ (kept with
    --keep-logs)."""
    run = Run(rate, mode)
    port = ws.free_port(PORTS)
    ckpt = ws.base / f"ckpt-{label}"
    ckpt.mkdir()
    keep = ws.run_dir / label
    keep.mkdir()
    coord_log = run_dir() / f"coordinator-{port}.log"
    recovery_out = run_dir() / f"recovery-{port}.out"
    for stale in (coord_log, recovery_out):   # an earlier run's on this port: elsewhere now
        stale.unlink(missing_ok=True)
    interval = "auto" if mode == "auto" else f"{plan.interval:g}"
    coord = ws.spawn([str(bc.BIN / "dmtcp-coordinator"), "-p", str(port), "--ckptdir", str(ckpt),
                      "--interval", interval, "--auto-restart"], keep / "coordinator.out")
    launcher = None
    try:
        wait_until(lambda: coord.poll() is not None or status(port) is not None,
                   "the coordinator to answer", 30)
        if coord.poll() is not None:
            raise BenchError(f"dmtcp-coordinator exited with {coord.returncode}: "
                             f"{(keep / 'coordinator.out').read_text()[-300:]!r}")
        launch_out = keep / "launch.out"
        settle()
        start = time.monotonic()
        # the job's stdout: a file of plan.output_mode (a shell's `> run.log`: 0644)
        os.close(os.open(launch_out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, plan.output_mode))
        os.chmod(launch_out, plan.output_mode)
        launcher = ws.spawn([str(bc.BIN / "dmtcp-launch"), "--join", "-p", str(port),
                             "--ckptdir", str(ckpt), *job.argv()], launch_out, env=job.env)
        _watch(run, port, job, plan, rng, start, [Output(launch_out), Output(recovery_out)],
               stop_after_recovery)
        st = status(port) or {}
        run.restarts = st.get("restarts", run.restarts)
        run.time_lost = st.get("time_lost", run.time_lost)
        run.generations = st.get("generation", 0)
        run.interval = st.get("checkpoint_interval")
        run.load = os.getloadavg()[0]
        if run.answer is not None and run.answer != reference and not stop_after_recovery:
            run.problem = (f"wrong answer: checksum {run.answer}, the failure-free answer is "
                           f"{reference}")
        if run.problem and run.stdout:
            run.problem += (f"; after the last recovery the job's stdout was not a file we "
                            f"watch: {run.stdout}")
        if run.problem and not stop_after_recovery:
            run.problem += (f" (logs: {keep}/coordinator-{port}.log, recovery-{port}.out, "
                            f"launch.out; agents' in {run_dir()})\n" + log_excerpt(port))
            progress(f"PROBLEM in {label}: {run.problem}")
    finally:
        _end_run(ws, port, coord, launcher, job, ckpt)
        for path in (coord_log, recovery_out):
            if path.exists():
                path.rename(keep / path.name)
    return run


def _watch(run: Run, port: int, job: Job, plan: Plan, rng: random.Random, start: float,
           outputs: list[Output], probe: bool) -> None:
    """Poll the status and the outputs every POLL s until the answer; inject
    the failures as they fall due."""
    per_second = run.rate / 60
    due = start + rng.expovariate(per_second) if per_second > 0 else math.inf
    pending: tuple[float, int] | None = None    # (kill time, restarts before) not yet back
    peers = RANKS + 1                            # mpirun and its ranks
    ended_since, seen, noted = None, False, False
    tick = start
    while True:
        now = time.monotonic()
        for out in outputs:
            out.read()
        failed = next((o.failed for o in outputs if o.failed), None)
        if failed:
            run.problem = f"the solver broke an invariant: {failed}"
            return
        answer = next((o.answer for o in outputs if o.answer), None)
        if answer:
            run.tts, run.answer = now - start, answer
            return
        if now - start > plan.timeout:
            run.problem = f"no answer {plan.timeout:.0f} s after the launch"
            return
        st = status(port)
        if st is None:
            run.problem = "the coordinator stopped answering"
            return
        run.restarts, run.time_lost = st["restarts"], st["time_lost"]
        if not noted and st["num_peers"] >= peers:   # its segments, for the cleanup
            noted = job.note_segments([p[0] for p in procs_of(port) if len(p) > 2])
        if st.get("gave_up"):
            run.problem = f"the coordinator gave up: {st['gave_up']}"
            return
        if pending:
            killed_at, before = pending
            if probe and st["restarts"] > before:
                return      # the probe asks only whether the kill is taken for a failure
            if st["restarts"] > before and st["running"] and st["recovering"] is None \
                    and st["num_peers"] >= peers:
                run.back.append(now - killed_at)
                run.stdout = _stdout_note(port, outputs)
                progress(f"  running again {now - killed_at:.2f} s after the kill "
                         f"(restarts {st['restarts']}, time lost {st['time_lost']:.2f} s)"
                         + (f"; stdout of {run.stdout}" if run.stdout else ""))
                pending = None
            elif now - killed_at > RECOVERY_TIMEOUT:
                run.problem = (f"not running again {RECOVERY_TIMEOUT:.0f} s after the kill "
                               f"at {killed_at - start:.1f} s (status: restarts "
                               f"{st['restarts']}, recovering {st['recovering']}, "
                               f"num_peers {st['num_peers']}, last_exit {st['last_exit']})")
                return
        # the job gone with no recovery under way and no answer
        seen = seen or st["num_trees"] > 0
        if seen and st["num_trees"] == 0 and st["recovering"] is None:
            ended_since = ended_since or now
            if now - ended_since > ENDED_GRACE:
                run.problem = (f"the job ended without an answer and was not restarted "
                               f"(last_exit {st['last_exit']}, last_failure "
                               f"{st['last_failure']}, restarts {st['restarts']})")
                return
        else:
            ended_since = None
        if now >= due and pending is None:
            if st["recovering"] is None and st["generation"] >= 1 and st["num_peers"] >= peers:
                killed = _kill_victim(port, job, plan.victim, rng)
                if killed:
                    run.failures += 1
                    run.postponed += now - due
                    pending = (time.monotonic(), st["restarts"])
                    progress(f"  failure {run.failures}: SIGKILL of {killed[1]} (pid "
                             f"{killed[0]}) at {now - start:.1f} s"
                             + (f", {now - due:.1f} s late" if now - due > 2 * POLL else ""))
                    due = now + rng.expovariate(per_second)
        tick += POLL
        time.sleep(max(0.0, tick - time.monotonic()))


def _stdout_note(port: int, outputs: list[Output]) -> str:
    """Where the restored job's stdout goes, if not to a file we watch."""
    notes = []
    for proc in procs_of(port):
        try:
            target = os.readlink(f"/proc/{proc[0]}/fd/1")
        except OSError:
            continue
        if target not in {str(o.path) for o in outputs} and not target.startswith("/dev/pts/"):
            notes.append(f"{proc[1]} {proc[0]}: {target}")   # (ranks write to mpirun's ptys)
    return ", ".join(notes)


def _end_run(ws: bc.Workspace, port: int, coord: subprocess.Popen,
             launcher: subprocess.Popen | None, job: Job, ckpt: Path) -> None:
    """Quit the coordinator (it kills the computation), then kill by pid
    what is left of ours; remove the images and the segments."""
    procs = _descendants(coord.pid) + (_descendants(launcher.pid) if launcher else [])
    if coord.poll() is None:
        bc._quit_coordinator(port)
        try:
            coord.wait(bc.EXIT_TIMEOUT)
        except subprocess.TimeoutExpired:
            coord.kill()
            coord.wait(bc.EXIT_TIMEOUT)
    if launcher is not None:
        try:
            launcher.wait(bc.EXIT_TIMEOUT / 4)
        except subprocess.TimeoutExpired:
            launcher.kill()
            launcher.wait(bc.EXIT_TIMEOUT)
    for proc in procs + _marked(str(ws.base)):
        bc._kill(proc)
    job.remove_segments()
    bc._remove(ckpt)


# ---- which process to kill --------------------------------------------------------

def probe_victim(ws: bc.Workspace, job: Job, plan: Plan, reference: str) -> tuple[str, str]:
    """Whether a killed rank is restarted: kill one once the first
    checkpoint is done and watch `restarts`.  ("rank" or "mpirun", why)."""
    progress("probe: is a killed rank restarted?")
    probe_plan = dataclasses.replace(plan, interval=2.0, victim="rank")
    # a rate so high that the first kill falls due at once
    run = run_ours(ws, job, probe_plan, 1e9, "fixed", random.Random(plan.seed), reference,
                   "probe", stop_after_recovery=True)
    if run.restarts > 0:
        return "rank", (f"a rank chosen at random (checked first that a killed rank is "
                        f"restarted: status `restarts` 0 -> {run.restarts})")
    progress(f"probe: a killed rank was not restarted: {run.problem}")
    return "mpirun", (f"mpirun itself, as with the installed code a killed rank is not "
                      f"restarted ({run.problem})")


# ---- all runs ---------------------------------------------------------------------

@dataclass
class Results:
    iterations: int
    plan: Plan
    modes: list[str]
    rates: list[float]
    runs: int
    native: list[float] = field(default_factory=list)
    ours: list[Run] = field(default_factory=list)
    victim_note: str = ""
    notes: list[str] = field(default_factory=list)

    def cell(self, rate: float, mode: str) -> list[Run]:
        return [r for r in self.ours if r.rate == rate and r.mode == mode]

    def failure_free(self, mode: str) -> list[float]:
        return [r.tts for r in self.cell(0.0, mode) if r.tts is not None and not r.problem]

    @property
    def problems(self) -> list[Run]:
        return [r for r in self.ours if r.problem]

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(dataclasses.asdict(self), indent=1) + "\n")

    @classmethod
    def load(cls, path: Path) -> "Results":
        d = json.loads(path.read_text())
        return cls(**{**d, "plan": Plan(**d["plan"]), "ours": [Run(**r) for r in d["ours"]]})


def measure(ws: bc.Workspace, seconds: float, rates: list[float], modes: list[str],
            interval: float, runs: int, seed: int, victim: str = "probe",
            iterations: int | None = None, points: int = POINTS,
            output_mode: int = 0o644) -> Results:
    job = build(ws, points)
    job.iterations = iterations or calibrate(ws, job, seconds)
    notes = []
    if "auto" in modes and not auto_supported():
        modes = [m for m in modes if m != "auto"]
        notes.append("`--interval auto`: not in the installed `dmtcp-coordinator --help`; "
                     "its column is skipped")
        progress("the installed coordinator has no --interval auto: that column is skipped")
    timeout = seconds * 3 + 120
    plan = Plan(seconds, interval, "rank", seed, timeout, output_mode)
    res = Results(job.iterations, plan, modes, rates, runs, notes=notes)
    try:
        progress("native reference run")
        _, reference = native(ws, job, job.iterations, timeout, "reference")
        if victim == "probe":
            plan.victim, res.victim_note = probe_victim(ws, job, plan, reference)
        else:
            plan.victim = victim
            res.victim_note = {"rank": "a random rank (--victim rank)",
                               "mpirun": "mpirun itself (--victim mpirun)"}[victim]
        for index in range(runs):
            wall, answer = native(ws, job, job.iterations, timeout, f"native-{index}")
            if answer != reference:
                raise BenchError(f"native runs disagree: {answer} != {reference}")
            res.native.append(wall)
            progress(f"run {index + 1}/{runs}: native {wall:.1f} s")
            for rate in rates:
                for mode in modes:
                    # the same failure times and victims for every interval mode
                    rng = random.Random(f"{seed}:{rate:g}:{index}")
                    label = f"{rate:g}-{mode}-{index}"
                    progress(f"run {index + 1}/{runs}: {rate:g} failures/min, "
                             f"{mode_name(mode, interval)}")
                    run = run_ours(ws, job, plan, rate, mode, rng, reference, label)
                    res.ours.append(run)
                    progress(f"  -> {'%.1f s' % run.tts if run.tts else 'no answer'}, "
                             f"{run.failures} failures, {run.restarts} restarts, time lost "
                             f"{run.time_lost:.1f} s" + (" PROBLEM" if run.problem else ""))
    finally:
        job.remove_segments()
    return res


# ---- the table and the plot --------------------------------------------------------

def mode_name(mode: str, interval: float) -> str:
    return f"fixed {interval:g} s" if mode == "fixed" else "auto"


def _spread(values: list[float], fmt: str, unit: str = "") -> str:
    if not values:
        return "–"
    med = statistics.median(values)
    if len(values) == 1 or min(values) == max(values):
        return f"{med:{fmt}}{unit}"
    return f"{med:{fmt}} ({min(values):{fmt}}–{max(values):{fmt}}){unit}"


def target_line(res: Results) -> str:
    parts = []
    for mode in res.modes:
        base, cell = res.failure_free(mode), res.cell(TARGET_RATE, mode)
        if not cell:
            parts.append(f"{mode_name(mode, res.plan.interval)}: not measured")
            continue
        times = [r.tts for r in cell if r.tts is not None and not r.problem]
        if not base or len(times) < len(cell):
            parts.append(f"{mode_name(mode, res.plan.interval)}: MISS (a run failed)")
            continue
        if not any(r.failures for r in cell):
            parts.append(f"{mode_name(mode, res.plan.interval)}: not tested (no failure fell "
                         f"within the run{'s' if len(cell) > 1 else ''}: --seed, --runs)")
            continue
        ratio = statistics.median(times) / statistics.median(base)
        parts.append(f"{mode_name(mode, res.plan.interval)} {ratio:.2f}x "
                     f"{'PASS' if ratio <= TARGET_FACTOR else 'MISS'}")
    return (f"Target: at {TARGET_RATE:g} failure per minute, time to solution within "
            f"{TARGET_FACTOR:g}x the failure-free time under dmtcp: " + "; ".join(parts) + ".")


def table(res: Results) -> str:
    plan = res.plan
    lines = [
        f"MPI solver (Open MPI, {RANKS} ranks, `mpirun --oversubscribe`), {res.iterations} "
        f"iterations (about {plan.seconds:g} s natively), under `dmtcp-coordinator "
        f"--auto-restart`; a failure is SIGKILL of {res.victim_note}; exponential "
        f"inter-arrival times (seed {plan.seed}), never during a recovery nor before the first "
        f"checkpoint; {res.runs} run{'s' if res.runs > 1 else ''} per row"
        + (" (median (min–max))" if res.runs > 1 else "") + ".",
        "",
        "| failures/min | interval | time to solution | vs failure-free | failures | restarts "
        "| time lost | kill → running, median | max |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    ref = res.failure_free(res.modes[0]) if res.modes else []
    ratio = (f"{statistics.median(res.native) / statistics.median(ref):.2f}x"
             if ref and res.native else "–")
    lines.append(f"| – | native, no dmtcp | {_spread(res.native, '.1f', ' s')} | {ratio} "
                 "| – | – | – | – | – |")
    for rate in res.rates:
        for mode in res.modes:
            cell = res.cell(rate, mode)
            if not cell:
                continue
            good = [r for r in cell if r.tts is not None and not r.problem]
            times = [r.tts for r in good]
            base = res.failure_free(mode)
            ratio = (f"{statistics.median(times) / statistics.median(base):.2f}x"
                     if times and base else "–")
            tts = _spread(times, ".1f", " s")
            if len(good) < len(cell):
                tts = (f"**FAILED** in {len(cell) - len(good)} of {len(cell)}"
                       + (f"; {tts}" if times else ""))
            back = [b for r in cell for b in r.back]
            lines.append(
                f"| {rate:g} | {mode_name(mode, plan.interval)} | {tts} | {ratio} "
                f"| {_spread([r.failures for r in cell], 'g')} "
                f"| {_spread([r.restarts for r in cell], 'g')} "
                f"| {_spread([r.time_lost for r in cell], '.1f', ' s')} "
                f"| {_spread([statistics.median(back)] if back else [], '.2f', ' s')} "
                f"| {_spread([max(back)] if back else [], '.2f', ' s')} |")
    lines += ["", target_line(res), ""]
    notes = list(res.notes)
    if plan.output_mode != 0o644:
        notes.append(f"the launched job wrote to a file of mode {plan.output_mode:o} "
                     "(--output-mode), the recovery output's mode")
    notes.append("vs failure-free: against the median of the runs with no failures under dmtcp "
                 "with the same interval (native: against the first interval's); kill → running: "
                 "from the SIGKILL until the coordinator's status says running with all "
                 f"{RANKS + 1} processes back (polled every {POLL:g} s), over every failure of "
                 "the row's runs")
    late = [r.postponed for r in res.ours if r.failures]
    if late and max(late) > 1:
        notes.append(f"failures postponed (recovery under way or no checkpoint yet): up to "
                     f"{max(late):.1f} s per run in all")
    autos = [r for r in res.ours if r.mode == "auto" and r.interval]
    if autos:
        notes.append("interval the coordinator had chosen at the end of each `auto` run: "
                     + ", ".join(f"{r.rate:g}/min {r.interval:.1f} s" for r in autos))
    loads = [r.load for r in res.ours]
    if loads:
        notes.append(f"load average (1 min) of this {os.cpu_count()}-CPU machine at the end of "
                     f"the runs: {min(loads):.1f} to {max(loads):.1f}; the job's two spinning "
                     "ranks count for about 2, and anything above slows them down a lot")
    counts = [f"{r.rate:g}/min {mode_name(r.mode, plan.interval)}: {r.generations}"
              for r in res.ours]
    notes.append("checkpoints (generations) per run: " + ", ".join(counts))
    lines += [f"- {n}" for n in notes]
    if res.problems:
        lines += ["", "Product problems:"]
        for r in res.problems:
            first = r.problem.splitlines()[0]
            lines.append(f"- {r.rate:g}/min, {mode_name(r.mode, plan.interval)}: {first}")
    return "\n".join(lines)


SECTION_TITLE = "## Failures (MPICH-V's experiment)"


def section(res: Results, command: str, png: Path | None) -> str:
    """The Markdown section of BENCHMARKS.md (run.py --failures)."""
    parts = [SECTION_TITLE, "", f"Made by `{command}`.", "", table(res)]
    if png:
        try:
            link = png.resolve().relative_to(REPO)
        except ValueError:
            link = png
        parts += ["", f"![time to solution against failures per minute]({link})"]
    return "\n".join(parts) + "\n"


def plot(res: Results, png: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    colours = {"fixed": "tab:blue", "auto": "tab:orange"}
    for index, mode in enumerate(res.modes):
        xs, ys = [], []
        for rate in res.rates:
            times = [r.tts for r in res.cell(rate, mode) if r.tts is not None and not r.problem]
            for t in times if res.runs > 1 else []:
                ax.plot(rate, t, ".", color=colours[mode], alpha=0.4)
            if times:
                xs.append(rate)
                ys.append(statistics.median(times))
        name = mode_name(mode, res.plan.interval)
        ax.plot(xs, ys, "o-", color=colours[mode], label=f"interval {name}")
        failed = [rate for rate in res.rates
                  if any(r.problem for r in res.cell(rate, mode))]
        if failed:
            shift = (index - (len(res.modes) - 1) / 2) * 0.08   # side by side
            ax.plot([rate + shift for rate in failed], [0] * len(failed), "x", color=colours[mode], markersize=10,
                    markeredgewidth=2, clip_on=False,
                    label=f"interval {name}: a run failed (no correct answer)")
        base = res.failure_free(mode)
        if base:
            ax.axhline(statistics.median(base), color=colours[mode], linestyle="--",
                       linewidth=1, label=f"failure-free under dmtcp ({name})")
    if res.native:
        ax.axhline(statistics.median(res.native), color="grey", linestyle=":", linewidth=1,
                   label="native, no dmtcp")
    if res.modes and res.failure_free(res.modes[0]):
        ax.axhline(TARGET_FACTOR * statistics.median(res.failure_free(res.modes[0])),
                   color="tab:red", linestyle="-.", linewidth=1,
                   label=f"target at {TARGET_RATE:g}/min: {TARGET_FACTOR:g}x failure-free")
    ax.set_xlabel("failures per minute (SIGKILL of " +
                  ("a random rank" if res.plan.victim == "rank" else "mpirun") + ")")
    ax.set_ylabel("time to solution (s)")
    ax.set_xticks(res.rates)
    ax.set_ylim(bottom=0)
    ax.set_title(f"MPI solver, Open MPI, {RANKS} ranks, under --auto-restart", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png)
    plt.close(fig)
    progress(f"plot written to {png}")


def budget(seconds: float, rates: list[float], modes: list[str], runs: int) -> int:
    """Seconds after which the whole benchmark gives up (a safety net: every
    run has its own time limit)."""
    per_run = seconds * 3 + 120
    return int(300 + seconds * 2 + per_run * (1 + runs * (1 + len(rates) * len(modes))))


# ---- main -------------------------------------------------------------------------

def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=None,
                   help="failure-free length of the job, natively (default 60; --quick 20)")
    p.add_argument("--iterations", type=int, help="solver iterations (default: calibrated)")
    p.add_argument("--rates", help="failures per minute, comma-separated (default 0,1,2,4)")
    p.add_argument("--interval", type=float, default=10.0,
                   help="the fixed checkpoint interval, seconds (default 10)")
    p.add_argument("--modes", help="interval modes: fixed,auto (default both; --quick fixed)")
    p.add_argument("--runs", type=int, default=1, help="runs per rate and mode (default 1)")
    p.add_argument("--seed", type=int, default=1, help="seed of the failure times and victims")
    p.add_argument("--victim", choices=("probe", "rank", "mpirun"), default="probe",
                   help="what a failure kills; probe (default): a rank if a killed rank is "
                        "restarted, else mpirun")
    p.add_argument("--output-mode", type=lambda text: int(text, 8), default=0o644,
                   help="octal mode of the file the launched job writes to (default 644, as "
                        "a shell's redirection makes it; 600 is the mode of the coordinator's "
                        "recovery output)")
    p.add_argument("--png", default=str(DEFAULT_PNG),
                   help=f"where the plot goes (default {DEFAULT_PNG.relative_to(REPO)}); "
                        "'' for none")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: 20 s job, rates 0 and 2, fixed interval only")
    p.add_argument("--keep-logs", action="store_true",
                   help="keep the agent, coordinator and CRIU logs (the run directory)")
    p.add_argument("--json", type=Path, help="also write the measurements to this file")
    p.add_argument("--from-json", type=Path,
                   help="measure nothing: print the table and draw the plot of a --json file")
    args = p.parse_args(argv)
    args.seconds = args.seconds or (QUICK["seconds"] if args.quick else 60.0)
    args.rates = ([float(r) for r in args.rates.split(",") if r] if args.rates
                  else list(QUICK["rates"] if args.quick else RATES))
    if 0.0 not in args.rates:
        args.rates.insert(0, 0.0)   # the failure-free time every ratio needs
    args.rates = sorted(set(args.rates))
    args.modes = ([m for m in args.modes.split(",") if m] if args.modes
                  else list(QUICK["modes"] if args.quick else ("fixed", "auto")))
    if any(m not in ("fixed", "auto") for m in args.modes) or not args.modes:
        p.error("--modes: fixed and/or auto")
    if args.runs < 1 or args.seconds <= 0 or args.interval <= 0 or min(args.rates) < 0:
        p.error("--runs, --seconds and --interval must be positive, --rates not negative")
    args.png = Path(args.png) if args.png else None
    if args.png:
        if importlib.util.find_spec("matplotlib") is None:
            p.error("matplotlib is missing: `.venv/bin/pip install -e '.[bench]'` "
                    "(scripts/setup.sh does it), or --png ''")
    return args


def main() -> int:
    args = parse_args()
    if args.from_json:
        res = Results.load(args.from_json)
        if args.png:
            plot(res, args.png)
        print(table(res))
        return 3 if res.problems else 0
    ws = Workspace(keep_logs=args.keep_logs)
    found: list[Results] = []

    def work() -> str:
        res = measure(ws, args.seconds, args.rates, args.modes, args.interval, args.runs,
                      args.seed, args.victim, args.iterations, output_mode=args.output_mode)
        found.append(res)
        if args.json:
            res.save(args.json)
        if args.png:
            plot(res, args.png)
        for r in res.problems:
            print(f"bench_failures: product problem at {r.rate:g}/min, {r.mode}:\n{r.problem}",
                  file=sys.stderr)
        return table(res)

    status_code = bc.run_guarded("bench_failures", ws, work,
                                 budget(args.seconds, args.rates, args.modes, args.runs))
    if status_code == 0 and found and found[0].problems:
        return 3
    return status_code


if __name__ == "__main__":
    sys.exit(main())
