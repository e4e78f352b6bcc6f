#!/usr/bin/env python3
"""Pre-copy (--precopy) against whole and incremental checkpoints, in one run.

For each size in --mib, each of --runs rounds launches three copies of
bench_stop.py's program (one process holding SIZE MiB of touched,
non-repeating memory, then ticking every millisecond and keeping its
largest gap), each under a coordinator of its own:

  plain        dmtcp-launch PROGRAM              (every dump whole)
  incremental  dmtcp-launch --incremental PROGRAM
  precopy      dmtcp-launch --precopy PROGRAM

and checkpoints each twice (`dmtcp-command -bc`, leave-running), the three
interleaved.  Per checkpoint: the program's stop (its largest gap between
two ticks in a window holding the command), the command's wall time, and
CRIU's frozen time of the dump (for precopy: the dump after the pre-copy).
The first checkpoint of precopy is judged against plain's (incremental's
first is whole too), the second against incremental's (both dump only what
was written since the previous generation).  This program writes only its
stack and a few variables between checkpoints: a program that rewrites much
of its memory while the pre-copy runs gains less (what it wrote is dumped
again while it is stopped).

Everything lives under /var/tmp/dmtcp-bench-<pid>-<random> and is removed
at the end, also on failure or Ctrl-C; only processes started here are
killed, by pid.  Coordinators use ports 7960-7999.  Progress goes to
stderr, the table to stdout.

    .venv/bin/python scripts/bench/bench_precopy.py [--mib 256,1024] [--runs 3]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, field

import bench_checkpoint as bc
import bench_stop as bs
from bench_checkpoint import progress, settle
from report import Row

from dmtcp_py.paths import run_dir

KINDS = {"plain": (), "incremental": ("--incremental",), "precopy": ("--precopy",)}
TIME_BUDGET = 900   # seconds for the whole run


@dataclass
class Figures:
    stop: list[float] = field(default_factory=list)    # seconds
    wall: list[float] = field(default_factory=list)
    frozen: list[float] = field(default_factory=list)


def one_checkpoint(tree: bs.Tree, figures: Figures, mib: int) -> str:
    settle(mib)
    tree.gaps()                               # a fresh maximum from here
    (run_dir() / "stats-dump").unlink(missing_ok=True)
    wall, _ = bc.timed(bc.our_checkpoint, tree.comp)
    stop = max(tree.gaps().values()) / 1e9
    frozen = bs.frozen_time()
    figures.stop.append(stop)
    figures.wall.append(wall)
    if frozen is not None:
        figures.frozen.append(frozen)
    return (f"stop {stop * 1e3:.1f} ms, -bc {wall:.3f} s, CRIU frozen "
            + (f"{frozen * 1e3:.1f} ms" if frozen is not None else "n/a"))


def measure(ws: bs.Workspace, program, mib: int, runs: int) -> dict:
    """(kind, checkpoint 1 or 2) -> Figures."""
    got = {(kind, n): Figures() for kind in KINDS for n in (1, 2)}
    for run in range(runs):
        trees = {}
        for kind, options in KINDS.items():
            trees[kind] = bs.launch(ws, program, 1, mib, options, label=f"{kind}-{mib}-{run}")
            for proc in trees[kind].procs:
                ws.adopt_if_alive(proc.pid)
        for n in (1, 2):
            # (a different order each run: none is always first after a settle)
            order = list(KINDS)[run % 3:] + list(KINDS)[:run % 3]
            for kind in order:
                said = one_checkpoint(trees[kind], got[(kind, n)], mib)
                progress(f"  {mib} MiB run {run + 1}/{runs}, {kind} checkpoint {n}: {said}")
        for tree in trees.values():
            bc.stop(tree.comp)
            for proc in tree.procs:
                bc._kill(proc)
    return got


def _med(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _row(name: str, ours: list[float], base: list[float], unit: str) -> str:
    scale, digits = (1e3, 1) if unit == "ms" else (1.0, 3)
    o, b = _med(ours), _med(base)
    if o is None or b is None:
        return f"{name:<46} {'n/a':>10}"
    return (f"{name:<46} {o * scale:10.{digits}f} {min(ours) * scale:8.{digits}f}"
            f" {max(ours) * scale:8.{digits}f} {b * scale:10.{digits}f} {o / b:7.2f}x  {unit}")


def table(results: dict[int, dict], runs: int) -> str:
    lines = [f"one process, {runs} runs; medians (min, max of ours); each row's baseline "
             "in the same run",
             f"{'':<46} {'precopy':>10} {'min':>8} {'max':>8} {'baseline':>10} {'ratio':>8}"]
    for mib, got in results.items():
        p1, p2 = got[("precopy", 1)], got[("precopy", 2)]
        w1, i2 = got[("plain", 1)], got[("incremental", 2)]
        lines += [
            f"{mib} MiB",
            _row("  1st -bc: program stopped (vs whole)", p1.stop, w1.stop, "ms"),
            _row("  1st -bc: CRIU frozen (vs whole)", p1.frozen, w1.frozen, "ms"),
            _row("  1st -bc: wall (vs whole)", p1.wall, w1.wall, "s"),
            _row("  2nd -bc: program stopped (vs incremental)", p2.stop, i2.stop, "ms"),
            _row("  2nd -bc: wall (vs incremental)", p2.wall, i2.wall, "s"),
            _row("  2nd -bc: program stopped (vs whole)", p2.stop, got[("plain", 2)].stop, "ms"),
        ]
    return "\n".join(lines)


def rows(got: dict, mib: int) -> list[Row]:
    """For run.py's table (make bench)."""
    section, what = "pre-copy (--precopy)", f"{mib} MiB"
    p1, p2 = got[("precopy", 1)], got[("precopy", 2)]
    w1, i2 = got[("plain", 1)], got[("incremental", 2)]
    out = [Row(section, f"{what}, 1st -bc: program stopped", p1.stop, w1.stop,
               "1st -bc, whole dump", "ms")]
    if p1.frozen and w1.frozen:
        out.append(Row(section, f"{what}, 1st -bc: CRIU frozen", p1.frozen, w1.frozen,
                       "1st -bc, whole dump", "ms"))
    return out + [
        Row(section, f"{what}, 1st -bc: wall", p1.wall, w1.wall, "1st -bc, whole dump", "s"),
        Row(section, f"{what}, 2nd -bc: program stopped", p2.stop, i2.stop,
            "2nd -bc, --incremental", "ms"),
        Row(section, f"{what}, 2nd -bc: wall", p2.wall, i2.wall, "2nd -bc, --incremental", "s"),
    ]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=bc.positive_ints, default="256,1024",
                   help="comma-separated memory sizes (MiB)")
    p.add_argument("--runs", type=int, default=3, help="rounds of measurements")
    p.add_argument("--keep-logs", action="store_true",
                   help="keep the agent, coordinator and CRIU logs (the run directory)")
    args = p.parse_args()
    if args.runs < 1:
        p.error("--runs must be at least 1")
    return args


def main() -> int:
    args = parse_args()
    ws = bs.Workspace(keep_logs=args.keep_logs)

    def work() -> str:
        program = bs.compile_program(ws.base)
        started = time.monotonic()
        results = {mib: measure(ws, program, mib, args.runs) for mib in args.mib}
        progress(f"done in {time.monotonic() - started:.0f} s")
        return table(results, args.runs)

    return bc.run_guarded("bench_precopy", ws, work, TIME_BUDGET)


if __name__ == "__main__":
    sys.exit(main())
