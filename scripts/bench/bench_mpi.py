#!/usr/bin/env python3
"""MPI benchmark: what dmtcp-launch costs an MPI job, and its checkpoint
against raw CRIU, in one run.

  time to solution   wall time of `mpirun -np RANKS solver` (the project's
                     tests/e2e/programs/mpi_solver.c, built with each MPI's
                     compiler wrapper) natively and under `dmtcp-launch
                     --new-coordinator`, alternating, --runs times each; the
                     checksums must agree
  checkpoint         4 ranks (Open MPI) of --rank-mib MiB each under
                     dmtcp-launch: wall time of `dmtcp-command -bc`; against
                     `criu dump --leave-running` of an identical job started
                     natively (the whole mpirun tree; --tcp-established with
                     --network-lock skip, as this machine has no iptables),
                     interleaved

Everything lives under /var/tmp/dmtcp-bench-<pid>-<random> and is removed at
the end, also on failure or Ctrl-C; only processes started here are killed,
by pid.  Coordinators use ports 7900-7949.  Progress on stderr, the table on
stdout.

    .venv/bin/python scripts/bench/bench_mpi.py [--runs 3] [--rank-mib 256] [--iterations 200000]
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(1, str(REPO))  # the tests' MPI definitions and solver
import bench_checkpoint as bc  # noqa: E402  (helpers shared with the checkpoint benchmark)
from bench_checkpoint import BenchError, progress, run_checked, settle, wait_until  # noqa: E402

from dmtcp_py.paths import criu_binary  # noqa: E402
from tests.e2e import mpi  # noqa: E402

PORTS = range(7900, 7950)
TIME_BUDGET = 540            # seconds: it must end by itself
IMPLS = {m.name: m for m in mpi.BOTH}
CKPT_RANKS = 4


class Workspace(bc.Workspace):
    port_range = PORTS

    def create(self) -> None:
        self.scratch = mpi.scratch_entries()
        super().create()

    def cleanup(self) -> None:
        super().cleanup()
        if hasattr(self, "scratch"):  # what the killed jobs left in /tmp and /dev/shm
            mpi.remove_scratch(self.scratch)


def build(ws: Workspace, impl: str) -> Path:
    return Path(mpi.build(IMPLS[impl], ws.base))


def mpirun_argv(impl: str, ranks: int, exe: Path, *args: str) -> list[str]:
    m = IMPLS[impl]
    return [m.mpirun, *m.options, "-np", str(ranks), str(exe), *args]


def checksum_of(text: str) -> str:
    found = mpi.checksum(text)
    if not found:
        raise BenchError(f"the solver printed no checksum: {text[-300:]!r}")
    return found


def _env(impl: str) -> dict:
    return {**os.environ, **IMPLS[impl].env}


def solve(impl: str, argv: list[str], timeout: float) -> tuple[float, str]:
    start = time.monotonic()
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=timeout, env=_env(impl))
    except subprocess.TimeoutExpired:
        raise BenchError(f"{argv[0]}: no answer in {timeout:.0f} s") from None
    wall = time.monotonic() - start
    if proc.returncode != 0:
        raise BenchError(f"{' '.join(argv[:4])}... exited with {proc.returncode}: "
                         f"{proc.stderr.strip()[-300:]}")
    return wall, checksum_of(proc.stdout)


def time_to_solution(ws: Workspace, impl: str, ranks: int, iterations: int,
                     runs: int) -> dict:
    exe = build(ws, impl)
    native, ours, sums = [], [], set()
    for run in range(runs):
        job = mpirun_argv(impl, ranks, exe, str(iterations), "0", "65536")
        port = ws.free_port()
        launch = [str(bc.BIN / "dmtcp-launch"), "--new-coordinator", "-p", str(port),
                  "--ckptdir", str(ws.base), *job]
        order = [("native", job), ("ours", launch)]
        if run % 2:
            order.reverse()
        for label, argv in order:
            settle()
            wall, checksum = solve(impl, argv, 300)
            (native if label == "native" else ours).append(wall)
            sums.add(checksum)
            progress(f"{impl} run {run + 1}/{runs}: {label} {wall:.3f} s")
        ws.ports.remove(port)
    if len(sums) != 1:
        raise BenchError(f"{impl}: the runs disagree on the checksum: {sorted(sums)}")
    return {"impl": impl, "native": native, "ours": ours}


def _wait_iteration(out: Path, at_least: int) -> bool:
    seen = mpi.iterations_seen(out.read_text(errors="replace"))
    return bool(seen) and seen[-1] >= at_least


def checkpoint_vs_raw(ws: Workspace, rank_mib: int, runs: int) -> dict:
    exe = build(ws, "openmpi")
    points = str(rank_mib * (1 << 20) // 16)  # two arrays of doubles per rank
    job = mpirun_argv("openmpi", CKPT_RANKS, exe, "1000000", "50000", points)
    env = _env("openmpi")
    # ours
    ours_out = ws.base / "ours.out"
    port = ws.free_port()
    agent = ws.spawn([str(bc.BIN / "dmtcp-launch"), "--new-coordinator", "-p", str(port),
                      "--ckptdir", str(ws.base / "ckpt"), *job], ours_out, env=env)
    (ws.base / "ckpt").mkdir()
    # raw: the same job outside our control, in a session of its own
    raw_out = ws.base / "raw.out"
    raw = ws.spawn(job, raw_out, env=env, start_new_session=True)
    wait_until(lambda: _wait_iteration(ours_out, 2) or agent.poll() is not None,
               "the launched job's first iterations", 120)
    if agent.poll() is not None:
        raise BenchError(f"dmtcp-launch exited: {ours_out.read_text()[-300:]}")
    wait_until(lambda: _wait_iteration(raw_out, 2), "the native job's first iterations", 120)
    bc.adopt_descendants(ws, agent.pid)
    bc.adopt_descendants(ws, raw.pid)
    ours, reported, dumps, dumps_synced = [], [], [], []
    image_bytes = raw_bytes = 0
    for run in range(runs):
        order = ["ours", "raw"] if run % 2 == 0 else ["raw", "ours"]
        for label in order:
            settle()
            if label == "ours":
                wall, out = bc.timed(bc.command, port, "-bc")
                match = re.search(r"done: .* (\d+) bytes, ([0-9.]+) s", out)
                if not match:
                    raise BenchError(f"unexpected answer to -bc: {out.strip()!r}")
                ours.append(wall)
                reported.append(float(match.group(2)))
                image_bytes = int(match.group(1))
            else:
                images = ws.base / f"raw-{run}"
                images.mkdir()
                wall, _ = bc.timed(run_checked, [
                    criu_binary(), "dump", "-t", str(raw.pid), "-D", str(images),
                    "--leave-running", "--tcp-established", "--network-lock", "skip",
                    "--file-locks", "--ghost-limit", str(1 << 31), "-o", "dump.log"])
                dumps.append(wall)
                synced, _ = bc.timed(bc.fsync_all, images)
                dumps_synced.append(wall + synced)
                raw_bytes = sum(f.stat().st_size for f in images.iterdir())
                bc._remove(images)
            progress(f"checkpoint run {run + 1}/{runs}: {label} {wall:.3f} s")
    for out in (ours_out, raw_out):
        if "FAIL" in out.read_text(errors="replace"):
            raise BenchError(f"the solver broke an invariant after a checkpoint ({out})")
    bc.command(port, "-k")
    return {"ours": ours, "reported": reported, "raw": dumps, "raw_synced": dumps_synced,
            "image_bytes": image_bytes,
            "raw_bytes": raw_bytes}


def _row(label: str, values: list[float], base: list[float] | None = None) -> str:
    med = statistics.median(values)
    ratio = f"{med / statistics.median(base):6.3f}x" if base else "       "
    return f"{label:<46} {med:8.3f} {min(values):8.3f} {max(values):8.3f}  {ratio}"


def table(solutions: list[dict], ckpt: dict | None, args) -> str:
    lines = [f"MPI benchmark, {args.runs} runs; seconds as median / min / max; "
             "ratio = median / native (or raw CRIU) median",
             f"{'measurement':<46} {'median':>8} {'min':>8} {'max':>8}  ratio"]
    for sol in solutions:
        lines.append(f"time to solution, {sol['impl']}, {args.ranks} ranks, "
                     f"{args.iterations} iterations:")
        lines.append(_row("  native mpirun", sol["native"]))
        lines.append(_row("  under dmtcp-launch (incl. its start-up)", sol["ours"], sol["native"]))
        slower = statistics.median(sol["ours"]) / statistics.median(sol["native"]) - 1
        lines.append(f"  target at most 2% slower: {slower * 100:+.1f}% "
                     f"{'PASS' if slower <= 0.02 else 'MISS'}")
    if ckpt:
        lines.append(f"checkpoint, openmpi, {CKPT_RANKS} ranks x {args.rank_mib} MiB, "
                     f"{args.ckpt_runs} runs "
                     f"(ours {ckpt['image_bytes'] / 2**20:.0f} MiB of images, "
                     f"raw {ckpt['raw_bytes'] / 2**20:.0f} MiB):")
        lines.append(_row("  raw criu dump --leave-running (whole tree)", ckpt["raw"]))
        lines.append(_row("  raw criu dump + fsync of every image file", ckpt["raw_synced"]))
        lines.append(_row("  ours: dmtcp-command -bc, wall (images fsynced)", ckpt["ours"],
                          ckpt["raw_synced"]))
        lines.append(_row("  ours: duration the coordinator reports", ckpt["reported"],
                          ckpt["raw_synced"]))
        limit = 1.1 * statistics.median(ckpt["raw_synced"]) + 0.1
        lines.append(f"  ratio column: against raw dump + fsync; target ours <= 1.1x + 0.1 s = "
                     f"{limit:.3f} s: {'PASS' if statistics.median(ckpt['ours']) <= limit else 'MISS'}")
    return "\n".join(lines)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--ranks", type=int, default=2, help="ranks for time to solution")
    p.add_argument("--iterations", type=int, default=200000,
                   help="solver iterations (200000: about 15 s natively here)")
    p.add_argument("--ckpt-runs", type=int, default=5)
    p.add_argument("--rank-mib", type=int, default=256)
    p.add_argument("--impl", default="openmpi,mpich",
                   help="MPI implementations for time to solution")
    p.add_argument("--keep-logs", action="store_true")
    args = p.parse_args()
    args.impl = [i for i in args.impl.split(",") if i]
    for impl in args.impl:
        if impl not in IMPLS:
            p.error(f"unknown MPI {impl!r} (one of {', '.join(IMPLS)})")
    return args


def main() -> int:
    args = parse_args()
    ws = Workspace(keep_logs=args.keep_logs)

    def work() -> str:
        solutions = [time_to_solution(ws, impl, args.ranks, args.iterations, args.runs)
                     for impl in args.impl]
        return table(solutions, checkpoint_vs_raw(ws, args.rank_mib, args.ckpt_runs), args)

    return bc.run_guarded("bench_mpi", ws, work, TIME_BUDGET)


if __name__ == "__main__":
    sys.exit(main())
