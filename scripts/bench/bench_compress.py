#!/usr/bin/env python3
"""Compression benchmark: a process holding --size-mib MiB of mixed data
(a quarter each: random bytes, text, smooth floating-point arrays, zeroed
pages) checkpointed and restarted with --no-gzip and with --gzip, in
alternating order, --runs times each.  Reports the image size, the
wall time of `dmtcp-command -bc` (images compressed, fsynced and published)
and of `dmtcp-restart` until the program is under control again, and CRIU's
frozen time (what the program is stopped for), each as a ratio to the
uncompressed run.

Everything lives under /var/tmp/dmtcp-bench-<pid>-<random> and is removed
at the end; only processes started here are killed, by pid.  Coordinators
use ports 7850-7899.

    .venv/bin/python scripts/bench/bench_compress.py [--size-mib 1024] [--runs 3]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import bench_checkpoint as bc  # helpers shared with the checkpoint benchmark
from bench_checkpoint import progress, run_checked, settle, wait_until
from report import Row, markdown

from dmtcp_py.paths import run_dir

PORTS = range(7850, 7900)
TIME_BUDGET = 540
MODES = ("--no-gzip", "--gzip")

PROGRAM_C = r"""
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

char *volatile keep;

int main(int argc, char **argv)
{
    size_t size = strtoull(argc > 1 ? argv[1] : "64", NULL, 10) << 20, quarter = size / 4;
    char *buf = malloc(size);
    static const char *words[] = {"checkpoint ", "restart ", "the ", "process ", "memory ",
                                  "of ", "a ", "coordinator ", "image ", "page "};
    uint64_t x = 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid();
    if (!buf)
        return 1;
    for (size_t i = 0; i < quarter; i += 8) {        /* random */
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        memcpy(buf + i, &x, 8);
    }
    for (size_t i = quarter; i < 2 * quarter;) {     /* text */
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        const char *w = words[x % 10];
        size_t n = strlen(w);
        if (i + n > 2 * quarter)
            n = 2 * quarter - i;
        memcpy(buf + i, w, n);
        i += n;
    }
    double *d = (double *)(buf + 2 * quarter);       /* a smooth field */
    for (size_t i = 0; i < quarter / 8; i++)
        d[i] = sin((double)i * 1e-4) * 1e3;
    memset(buf + 3 * quarter, 0, size - 3 * quarter); /* zeroed, touched */
    keep = buf;
    printf("ready\n");
    fflush(stdout);
    for (;;)
        sleep(1);
}
"""


class Workspace(bc.Workspace):
    port_range = PORTS


def compile_program(ws: Workspace) -> Path:
    source, binary = ws.base / "mixed.c", ws.base / "mixed"
    source.write_text(PROGRAM_C)
    run_checked(["cc", "-O2", "-o", str(binary), str(source), "-lm"])
    return binary


def one(ws: Workspace, program: Path, size_mib: int, mode: str, samples: dict) -> None:
    ckptdir = ws.base / f"ckpt{mode}"
    ckptdir.mkdir()
    out = ws.base / "launch.out"
    out.unlink(missing_ok=True)
    comp = bc.start_ours(ws, ["dmtcp-launch", mode, "--ckptdir", str(ckptdir), str(program),
                              str(size_mib)], out, "the launched program")
    wait_until(lambda: bc.printed_ready(out), "the program to fill its memory", bc.READY_TIMEOUT)
    settle(size_mib)
    wall, _ = bc.timed(bc.our_checkpoint, comp)
    frozen = bc.criu_seconds(run_dir() / "stats-dump", "dump", "frozen_time")
    image = bc.image_of(ckptdir)
    size = sum(f.stat().st_size for f in image.iterdir() if f.is_file())
    bc.stop(comp)
    settle(size_mib)
    restart, comp = bc.timed(bc.restart, ws, image)
    bc.stop(comp)
    ws.ports.clear()
    bc._remove(ckptdir)
    for key, value in (("ckpt", wall), ("frozen", frozen), ("restart", restart), ("bytes", size)):
        samples.setdefault(mode, {}).setdefault(key, []).append(value)
    progress(f"{mode}: checkpoint {wall:.3f} s, image {size / 2**20:.0f} MiB, "
             f"restart {restart:.3f} s")


def measure(ws: bc.Workspace, program: Path, size_mib: int, runs: int) -> dict:
    """samples[mode][key]: every mode once a run, alternating which goes first."""
    samples: dict = {}
    for run in range(runs):
        for mode in (MODES if run % 2 == 0 else MODES[::-1]):
            one(ws, program, size_mib, mode, samples)
    return samples


def rows(samples: dict, size_mib: int) -> list[Row]:
    plain, packed = samples["--no-gzip"], samples["--gzip"]
    section = f"compression ({size_mib} MiB of mixed data)"
    return [Row(section, f"--gzip: {label}", packed[key], plain[key], "--no-gzip", unit)
            for key, label, unit in (("bytes", "image size", "MiB"),
                                     ("ckpt", "checkpoint (-bc), wall", "s"),
                                     ("frozen", "program stopped (CRIU frozen)", "s"),
                                     ("restart", "restart until under control", "s"))]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size-mib", type=int, default=1024)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--keep-logs", action="store_true")
    args = p.parse_args()
    ws = Workspace(keep_logs=args.keep_logs)

    def work() -> str:
        program = compile_program(ws)
        return markdown(rows(measure(ws, program, args.size_mib, args.runs), args.size_mib))

    return bc.run_guarded("bench_compress", ws, work, TIME_BUDGET)


if __name__ == "__main__":
    sys.exit(main())
