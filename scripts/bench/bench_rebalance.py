#!/usr/bin/env python3
"""The MPI solver's time to solution with a CPU hog on one host, with and
without `dmtcp-coordinator --rebalance` (issue 16, part 6: the experiment of
"Grouping MPI Processes for Partial Checkpoint and Co-migration").

Five namespace hosts with sshd (tests/multihost): the coordinator on h1
(--hosts h2,h3,h4,h5), mpirun on h2, the solver's ranks on h3 (and h4 with
--ranks 2), h5 free.  The hosts share this machine's kernel and CPUs, so
CPUs are pinned as separate machines would have them: h3's sshd (and so
its orted and rank) on CPU 0, h4's on CPU 1, mpirun on CPU 1; h5 is not
pinned (a tree restored on h4 runs on CPU 1, one restored on h5 on every
CPU: CRIU does not restore a CPU affinity).  mpirun binds as it does by
default (each rank to a core of its orted's CPUs); with `--bind-to none`
the ranks map Open MPI's /tmp/ompi.HOST/jf.N/hwloc.sm in a way the image
does not carry, and a move to another host fails (and is rolled back).  The hog is a busy loop on CPU 0, started on h3 with the
job and not under the coordinator's control.

For each rank count in --ranks, with the solver compute-bound (no pause;
--points per rank, --iterations), the wall time of the whole job under
dmtcp-launch:

  native       mpirun -np RANKS on this host, no hog (the answer's reference)
  no hog       the job across hosts
  hog          the job across hosts, hog on CPU 0 from the start
  rebalance    the same with --rebalance --rebalance-after S: the coordinator
               moves h3's tree to h5 once h3 stays overloaded

Every run's checksum must be the native one.  On a machine of 2 CPUs the
gain has a ceiling: with 2 ranks, the moved rank shares the 2 CPUs with the
hog and the other rank (3 busy tasks on 2 CPUs).  Everything lives under
/var/tmp/dmtcp-bench-rebalance-<pid> and is removed at the end; only
processes started here are killed, by pid.

    .venv/bin/python scripts/bench/bench_rebalance.py [--ranks 1,2] [--runs 1]
        [--iterations 6000] [--points 2000000] [--after 5]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(1, str(REPO))  # the tests' namespace hosts, sshd and MPI definitions
from tests.e2e import mpi  # noqa: E402
from tests.multihost.sshd import ssh_cluster  # noqa: E402
from tests.multihost.test_auto_restart_hosts import BIN, COORD_PORT, Healing  # noqa: E402

JOB_TIMEOUT = 900.0
IMPL = mpi.OPENMPI


def progress(text: str) -> None:
    print(f"[bench_rebalance] {text}", file=sys.stderr, flush=True)


class Cluster(Healing):
    """The coordinator on h1 with --hosts h2..h5 (and the options given);
    h3's and h4's sshd pinned on CPU 0 and CPU 1."""

    def __init__(self, net, ssh, root, *options, env=None) -> None:
        sshd = {host.name: proc for host, proc in zip(ssh.hosts, ssh._procs)}
        os.sched_setaffinity(sshd["h3"].pid, {0})
        os.sched_setaffinity(sshd["h4"].pid, {1})
        super().__init__(net, ssh, root, *options, env=env)

    @staticmethod
    def policy(net) -> list[str]:
        return ["--hosts", ",".join(h.name for h in net.hosts[1:])]


def native(solver: str, ranks: int, iterations: int, points: int) -> tuple[float, str]:
    start = time.monotonic()
    res = subprocess.run([IMPL.mpirun, *IMPL.options, "--bind-to", "none", "-np", str(ranks),
                          solver, str(iterations), "0", str(points)],
                         capture_output=True, text=True, timeout=JOB_TIMEOUT,
                         env={**os.environ, **IMPL.env})
    took = time.monotonic() - start
    if res.returncode != 0 or not mpi.checksum(res.stdout):
        raise SystemExit(f"bench_rebalance: the native run failed: {res.stderr.strip()[-300:]}")
    return took, mpi.checksum(res.stdout)


def across_hosts(root: Path, solver: str, ranks: int, iterations: int, points: int, *,
                 hog: bool, after: float | None) -> dict:
    """One job across the namespace hosts; its time, answer and rebalance."""
    storage = root / "storage"
    storage.mkdir(parents=True)
    options = ["--rebalance", "--rebalance-after", f"{after:g}"] if after else []
    with ssh_cluster(5, root, Cluster, storage=storage) as new:
        h = new(*options, env=IMPL.env)
        hosts = {x.name: x for x in h.net.hosts}
        hog_proc = None
        if hog:
            hog_proc = h.popen(hosts["h3"], "hog", ["taskset", "-c", "0", sys.executable, "-c",
                                                   "while True: pass"])
        where = "h3" if ranks == 1 else "h3,h4"
        start = time.monotonic()
        job = h.popen(hosts["h2"], "mpirun", [
            "taskset", "-c", "1", BIN / "dmtcp-launch", "--join", "-h", h.head.addr,
            "-p", COORD_PORT, "--ckptdir", h.ckptdir, IMPL.mpirun, *IMPL.options,
            "--host", where, "-np", str(ranks),
            solver, str(iterations), "0", str(points)])
        try:
            code = job.wait(timeout=JOB_TIMEOUT)
        finally:
            took = time.monotonic() - start
            if hog_proc is not None:
                hog_proc.kill()
                hog_proc.wait()
        text = job.out.read_text(errors="replace")
        # every move the coordinator made, and how each ended
        moves = [line.split("coordinator: ", 1)[1] for line in h.log().splitlines()
                 if "coordinator: rebalance:" in line or "coordinator: migration of" in line]
        return {"seconds": took, "code": code, "checksum": mpi.checksum(text), "moves": moves,
                "error": job.err.read_text(errors="replace")[-300:] if code else ""}


def _move(line: str) -> str:
    """A log line of a move, short: "h3 -> h5" or "done in 3.1 s"."""
    if line.startswith("rebalance:"):
        return line.rsplit("; ", 1)[-1].replace("moving ", "")
    return line.replace("migration of ", "").replace("trees ", "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="1,2", help="rank counts, comma-separated (1 or 2)")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--iterations", type=int, default=6000)
    ap.add_argument("--points", type=int, default=2_000_000, help="grid points per rank")
    ap.add_argument("--after", type=float, default=5.0, help="--rebalance-after seconds")
    args = ap.parse_args()
    try:
        rank_counts = [int(r) for r in args.ranks.split(",")]
    except ValueError:
        raise SystemExit(f"bench_rebalance: --ranks {args.ranks}: not numbers") from None
    if any(r not in (1, 2) for r in rank_counts) or args.runs < 1:
        raise SystemExit("bench_rebalance: --ranks takes 1 and 2; --runs at least 1")
    if os.geteuid() != 0:
        raise SystemExit("bench_rebalance: needs root (namespace hosts)")
    if not {0, 1} <= os.sched_getaffinity(0):
        raise SystemExit("bench_rebalance: needs CPUs 0 and 1")
    work = Path(f"/var/tmp/dmtcp-bench-rebalance-{os.getpid()}")
    work.mkdir(parents=True)
    scratch = mpi.scratch_entries()
    rows = []
    try:
        solver = mpi.build(IMPL, work)
        progress(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
        for ranks in rank_counts:
            base, answer = native(solver, ranks, args.iterations, args.points)
            progress(f"{ranks} rank(s): native {base:.1f} s, checksum {answer}")
            results: dict[str, list[dict]] = {"no hog": [], "hog": [], "rebalance": []}
            for run in range(args.runs):
                for name, hog, after in (("no hog", False, None), ("hog", True, None),
                                         ("rebalance", True, args.after)):
                    root = work / f"r{ranks}-{run}-{name.replace(' ', '_')}"
                    res = across_hosts(root, solver, ranks, args.iterations, args.points,
                                       hog=hog, after=after)
                    shutil.rmtree(root, ignore_errors=True)
                    if res["code"] != 0 or res["checksum"] != answer:
                        raise SystemExit(f"bench_rebalance: {name} with {ranks} rank(s) ended "
                                         f"{res['code']} with checksum {res['checksum']} "
                                         f"(native {answer}): {res['error']}")
                    progress(f"{ranks} rank(s), {name}: {res['seconds']:.1f} s")
                    for line in res["moves"]:
                        progress(f"  {line}")
                    results[name].append(res)
            rows.append((ranks, base, results))
    finally:
        shutil.rmtree(work, ignore_errors=True)
        mpi.remove_scratch(scratch)
    print(f"MPI solver (Open MPI), {args.iterations} iterations of {args.points} points per "
          f"rank, no pause; hog: a busy loop on h3's CPU; --rebalance-after {args.after:g}; "
          f"median of {args.runs} run(s); load average at the start "
          f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print()
    print("| ranks | native (s) | no hog (s) | hog (s) | hog, --rebalance (s) | "
          "hog / no hog | rebalance / no hog | hog / rebalance | moves (last run) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for ranks, base, results in rows:
        med = {k: statistics.median(r["seconds"] for r in v) for k, v in results.items()}
        moved = "; ".join(_move(line) for line in results["rebalance"][-1]["moves"]) or "none"
        print(f"| {ranks} | {base:.1f} | {med['no hog']:.1f} | {med['hog']:.1f} | "
              f"{med['rebalance']:.1f} | {med['hog'] / med['no hog']:.2f} | "
              f"{med['rebalance'] / med['no hog']:.2f} | {med['hog'] / med['rebalance']:.2f} | "
              f"{moved} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
