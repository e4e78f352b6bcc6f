#!/usr/bin/env python3
"""Migration time against tree size, and how long the trees that stay were
stopped (issue 16, part 6).

For each size in --mib, three trees run under one coordinator, each
launched with `dmtcp-launch --join`:

  mover      holds MIB MiB of touched, non-repeating memory; listens
  stayer     connected to the mover: every 1 ms both send the next 8-byte
             counter and read what came, checking every counter (exit 3 on
             a wrong one: every byte once and in order)
  bystander  ticks alone, no connection

Every program loops on clock_gettime + nanosleep(1 ms) and keeps the
largest gap between two iterations; on SIGUSR1 it writes it and starts a
new maximum.  Each of --runs rounds measures, in this order:

  -bc        `dmtcp-command -bc` of the three trees (the baseline: a whole
             checkpoint, every tree stopped) and the stayer's largest gap
  migrate    `dmtcp-command --migrate <mover> --to <this host>` (a fresh
             copy on the same host), its wall time, and the stayer's and the
             bystander's largest gaps during it

and the table gives the medians and migrate / -bc.  Everything lives
under /var/tmp/dmtcp-bench-<pid>-<random> and is removed at the end; only
processes started here are killed, by pid.  Ports 8000-8039.

    .venv/bin/python scripts/bench/bench_migrate.py [--mib 64,256,1024] [--runs 3]
"""
from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

import bench_checkpoint as bc
from bench_checkpoint import BenchError, progress, run_checked, settle, wait_until
from bench_stop import GAP_C_COMMON, Workspace as StopWorkspace, new_lines
from report import Row


PORTS = range(8000, 8040)
READY_TIMEOUT = 60.0
REPORT_TIMEOUT = 10.0
MIGRATE_TIMEOUT = 300.0
PROGRAM_NAME = "mig_gap"

PROGRAM_C = GAP_C_COMMON + r"""
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>

static int connection(const char *how, const char *host, int port)
{
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    int one = 1, fd = socket(AF_INET, SOCK_STREAM, 0);

    inet_pton(AF_INET, host, &a.sin_addr);
    if (strcmp(how, "listen") == 0) {
        int lfd = fd;
        setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(lfd, (struct sockaddr *)&a, sizeof a) < 0 || listen(lfd, 1) < 0) {
            perror("listen");
            exit(1);
        }
        say("listening", port);
        fd = accept(lfd, NULL, NULL);
    } else {
        while (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
            close(fd);
            usleep(10000);
            fd = socket(AF_INET, SOCK_STREAM, 0);
        }
    }
    fcntl(fd, F_SETFL, O_NONBLOCK);
    return fd;
}

int main(int argc, char **argv)
{
    size_t bytes = strtoull(argv[1], NULL, 10) << 20, words = bytes / 8;
    int fd = argc == 5 ? connection(argv[2], argv[3], atoi(argv[4])) : -1;
    uint64_t x = 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid(), sent = 0, expected = 0;
    unsigned char in[8192];
    size_t have = 0;
    struct sigaction sa;
    struct timespec tick = { 0, 1000000 };
    int64_t prev, now, max_gap = 0;
    uint64_t *buf = mmap(NULL, bytes ? bytes : 8, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

    for (size_t i = 0; i < words; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        buf[i] = x;
    }
    keep = buf;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
    say("ready", 0);
    prev = now_ns();
    for (;;) {
        nanosleep(&tick, NULL);
        now = now_ns();
        if (now - prev > max_gap)
            max_gap = now - prev;
        prev = now;
        if (fd >= 0) {
            ssize_t n;
            if (send(fd, &sent, 8, MSG_NOSIGNAL) == 8)
                sent++;
            while ((n = recv(fd, in + have, sizeof in - have, 0)) > 0) {
                have += (size_t)n;
                size_t whole = have / 8 * 8;
                for (size_t i = 0; i < whole; i += 8) {
                    uint64_t got;
                    memcpy(&got, in + i, 8);
                    if (got != expected) {
                        say("FAIL", (long long)got);
                        _exit(3);
                    }
                    expected++;
                }
                memmove(in, in + whole, have - whole);
                have -= whole;
            }
            if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
                say("FAIL", -1);
                _exit(3);
            }
        }
        if (report) {
            report = 0;
            say("gap", max_gap);
            say("received", (long long)expected);
            max_gap = 0;
            prev = now_ns();
        }
    }
}
"""


class Workspace(StopWorkspace):
    port_range = PORTS


@dataclass
class Member:
    """One launched tree: its launch, its stdout, its program's process."""
    launch: subprocess.Popen
    out: Path
    proc: psutil.Process | None = None
    offset: int = 0

    def lines(self) -> list[list[str]]:
        words, self.offset = new_lines(self.out, self.offset)
        return words

    def gap(self) -> float:
        """SIGUSR1; the largest gap (seconds) since the last time."""
        assert self.proc is not None
        self.lines()
        self.proc.send_signal(signal.SIGUSR1)
        got: list[float] = []

        def answered() -> bool:
            for w in self.lines():
                if w and w[0] == "FAIL":
                    raise BenchError(f"{self.out.name}: a wrong counter: {w}")
                if len(w) == 3 and w[0] == "gap":
                    got.append(int(w[2]) / 1e9)
            return bool(got)

        wait_until(answered, f"{self.out.name} to report its gap", REPORT_TIMEOUT)
        return got[0]


def compile_program(workdir: Path) -> Path:
    source, binary = workdir / f"{PROGRAM_NAME}.c", workdir / PROGRAM_NAME
    source.write_text(PROGRAM_C)
    run_checked(["cc", "-O2", "-o", str(binary), str(source)])
    return binary


def command(port: int, *args: str, timeout: float = 60.0) -> str:
    res = subprocess.run([str(bc.BIN / "dmtcp-command"), "-p", str(port), *args],
                         capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0:
        raise BenchError(f"dmtcp-command {' '.join(args)}: {res.stderr.strip()}")
    return res.stdout


def start(ws: Workspace, program: Path, port: int, ckptdir: Path, label: str,
          argv: list[str], word: str = "ready") -> Member:
    """Launch one tree; return once its program said `word` (the mover says
    "ready" only once the stayer connected)."""
    out = ws.base / f"{label}.out"
    proc = ws.spawn([str(bc.BIN / "dmtcp-launch"), "--join", "-p", str(port),
                     "--ckptdir", str(ckptdir), str(program), *argv], out)
    member = Member(proc, out)

    def ready() -> bool:
        if proc.poll() is not None:
            raise BenchError(f"{label}: dmtcp-launch exited with {proc.returncode}: "
                             f"{out.read_text(errors='replace')[-300:]}")
        return any(w and w[0] == word for w in (ln.split() for ln in out.read_text().splitlines()))

    wait_until(ready, f"{label} to say {word}", READY_TIMEOUT)
    for child in psutil.Process(proc.pid).children(recursive=True):
        ws.adopt_if_alive(child.pid)
        try:
            if child.name() == PROGRAM_NAME:
                member.proc = child
        except psutil.NoSuchProcess:
            pass  # a short-lived helper, gone since the listing
    if member.proc is None:
        raise BenchError(f"{label}: no {PROGRAM_NAME} process below dmtcp-launch")
    return member


@dataclass
class Result:
    mib: int
    ckpt: list[float] = field(default_factory=list)
    ckpt_stop: list[float] = field(default_factory=list)
    migrate: list[float] = field(default_factory=list)
    stayer: list[float] = field(default_factory=list)
    bystander: list[float] = field(default_factory=list)


def measure(ws: Workspace, program: Path, mib: int, runs: int) -> Result:
    port = ws.free_port()
    ckptdir = ws.base / f"ckpt-{mib}"
    ckptdir.mkdir(mode=0o700)
    coord = ws.spawn([str(bc.BIN / "dmtcp-coordinator"), "-p", str(port), "--ckptdir",
                      str(ckptdir), "-q"], ws.base / f"coordinator-{mib}.out")
    wait_until(lambda: subprocess.run([str(bc.BIN / "dmtcp-command"), "-p", str(port), "-s"],
                                      capture_output=True).returncode == 0,
               "the coordinator", READY_TIMEOUT)
    peer_port = str(ws.free_port(range(8040, 8100)))
    mover = start(ws, program, port, ckptdir, f"mover-{mib}",
                  [str(mib), "listen", "127.0.0.1", peer_port], word="listening")
    stayer = start(ws, program, port, ckptdir, f"stayer-{mib}",
                   ["16", "connect", "127.0.0.1", peer_port])
    bystander = start(ws, program, port, ckptdir, f"bystander-{mib}", ["16"])
    wait_until(lambda: any(w and w[0] == "ready" for w in
                           (ln.split() for ln in mover.out.read_text().splitlines())),
               "the mover to be ready", READY_TIMEOUT)
    wait_until(lambda: json.loads(command(port, "-s", "--json"))["num_peers"] == 3,
               "three processes under control", READY_TIMEOUT)
    result = Result(mib)
    # the mover keeps its tree id wherever it goes
    tree = next(t for t in json.loads(command(port, "-l", "--json"))["trees"]
                if t["agent_pid"] == mover.launch.pid)
    try:
        for index in range(runs):
            settle(mib + 32)
            stayer.gap()
            bystander.gap()
            wall = bc.timed(lambda: command(port, "-bc", timeout=MIGRATE_TIMEOUT))[0]
            result.ckpt.append(wall)
            result.ckpt_stop.append(stayer.gap())
            bystander.gap()
            # the image (page cache) and the new copy are new memory: this VM's
            # first touch of freed memory is slow (DESIGN.md 1), so both are
            # prepared, as bench_checkpoint prepares a restart's
            settle(3 * mib + 32)
            wall = bc.timed(lambda: command(port, "--migrate", tree["tree_id"], "--to", tree["host"],
                                            timeout=MIGRATE_TIMEOUT))[0]
            result.migrate.append(wall)
            result.stayer.append(stayer.gap())
            result.bystander.append(bystander.gap())
            progress(f"  {mib} MiB run {index + 1}/{runs}: -bc {result.ckpt[-1]:.3f} s "
                     f"(stayer stopped {result.ckpt_stop[-1] * 1e3:.0f} ms); migrate "
                     f"{wall:.3f} s, stayer stopped {result.stayer[-1] * 1e3:.0f} ms, "
                     f"bystander {result.bystander[-1] * 1e3:.0f} ms")
            for p in psutil.Process(coord.pid).children(recursive=True):
                ws.adopt_if_alive(p.pid)  # the moved tree's restart, below the coordinator
            if mover.launch.poll() is None and index == 0:
                mover.launch.wait(30)
    finally:
        subprocess.run([str(bc.BIN / "dmtcp-command"), "-p", str(port), "-q"],
                       capture_output=True, timeout=60)
    for m in (stayer, bystander):
        if m.launch.wait(30) != 0 and any(w and w[0] == "FAIL" for w in m.lines()):
            raise BenchError(f"{m.out.name}: a wrong counter after the migrations")
    return result


SECTION = "Migration (issue 16): one tree moves, the others stay"
SIZES = (64, 256, 1024)


def rows(results: list[Result]) -> list[Row]:
    """run.py's rows: the migration against a checkpoint of every tree
    (-bc) of the same computation, and how long the trees that stay were
    stopped against how long -bc stopped them."""
    out = []
    for r in results:
        out += [
            Row(SECTION, f"{r.mib} MiB tree: --migrate (same host)", r.migrate, r.ckpt,
                "-bc of the 3 trees", "s"),
            Row(SECTION, f"{r.mib} MiB tree: connected staying tree stopped", r.stayer,
                r.ckpt_stop, "stopped by -bc", "ms"),
            Row(SECTION, f"{r.mib} MiB tree: unconnected staying tree stopped", r.bystander,
                r.ckpt_stop, "stopped by -bc", "ms"),
        ]
    return out


def measure_all(ws: bc.Workspace, sizes: list[int], runs: int) -> list[Result]:
    program = compile_program(ws.base)
    return [measure(ws, program, mib, runs) for mib in sizes]


def table(results: list[Result], runs: int) -> str:
    def med(xs: list[float]) -> float:
        return statistics.median(xs)
    rows = ["| tree size | `-bc` (all 3 trees) | stayer stopped by `-bc` | `--migrate` | "
            "migrate / -bc | stayer stopped | bystander stopped |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        rows.append(f"| {r.mib} MiB | {med(r.ckpt):.3f} s | {med(r.ckpt_stop) * 1e3:.0f} ms | "
                    f"{med(r.migrate):.3f} s | {med(r.migrate) / med(r.ckpt):.2f}x | "
                    f"{med(r.stayer) * 1e3:.0f} ms | {med(r.bystander) * 1e3:.0f} ms |")
    return "\n".join(rows) + f"\n\nMedians of {runs} runs; one host, the mover to a fresh copy on it."


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", default="64,256,1024")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--keep-logs", action="store_true",
                    help="keep the run directory (agents' and coordinator's logs)")
    args = ap.parse_args()
    ws = Workspace(keep_logs=args.keep_logs)
    try:
        ws.create()
        results = measure_all(ws, [int(m) for m in args.mib.split(",")], args.runs)
    except (BenchError, subprocess.TimeoutExpired) as exc:
        print(f"bench_migrate: error: {exc}", file=sys.stderr)
        return 1
    finally:
        ws.cleanup()
    print(table(results, args.runs))
    return 0


if __name__ == "__main__":
    time.tzset()
    sys.exit(main())
