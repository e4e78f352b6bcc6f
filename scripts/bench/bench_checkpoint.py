#!/usr/bin/env python3
"""Checkpoint/restart benchmark: dmtcp_py against raw CRIU and dd, in one run.

For a process holding SIZE MiB of touched, non-repeating memory it measures,
each --runs times and interleaved (one round = every measurement once, so
noise from other users of the machine hits all of them alike):

  ours checkpoint   wall time of `dmtcp-command -bc` (leave-running)
  ours restart      from starting `dmtcp-restart IMAGE` (it starts a new
                    coordinator) until the restored program's first tick
                    (it appends the time to a file every millisecond); also
                    until the coordinator reports it under control and
                    running
  raw dump          `criu dump -t PID -D DIR --leave-running` of an identical
                    process started directly (setsid, stdio on files)
  raw restore       `criu restore -D DIR -d`, until the program's first tick
  dd                SIZE MiB to the same directory, with and without
                    conv=fdatasync

Our images are fsynced before they are published, CRIU's are not; the table
therefore also shows raw dump + the same fsync of every image file, for
a like-for-like view, and CRIU's own timings from its stats files.

Everything lives under /var/tmp/dmtcp-bench-<pid>-<random> (images, logs via
DMTCP_TMPDIR, the test program) and is removed at the end, also on failure
or Ctrl-C; only processes started here are killed, by pid.  Coordinators use
ports 7950-7999.  Progress goes to stderr, the table to stdout.

With --tcp the program holds a loopback TCP connection to itself and its
listening socket, as an MPI rank holds its peers' (raw CRIU dumps and
restores it with --tcp-established).

    .venv/bin/python scripts/bench/bench_checkpoint.py [--size-mib 1024] [--runs 3] [--tcp]
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pycriu.images

from dmtcp_py.client import CoordinatorClient, coordinator_alive
from dmtcp_py.errors import UserError
from dmtcp_py.paths import criu_binary, run_dir
from dmtcp_py.protocol.messages import Cmd

PORTS = range(7950, 8000)
BENCH_PARENT = "/var/tmp"   # on the disk images normally go to, unlike a tmpfs /tmp
READY_TIMEOUT = 60.0        # the program filled its memory and is under control
OP_TIMEOUT = 120.0          # one checkpoint, restart, dump, restore or dd
EXIT_TIMEOUT = 20.0         # a process we stopped goes away
POLL = 0.01
TARGET_FACTOR, TARGET_SLACK = 1.1, 0.1
BIN = Path(sys.executable).parent

# After filling its memory it ticks every millisecond, appending the time
# of each tick to the file argv[2] (opened and closed at every tick: a file
# it held open would have grown since the dump, and CRIU refuses to restore
# a file whose size changed).  The first tick after a restart began is when
# the program ran again.  With a third argument "tcp" it first makes a
# loopback TCP connection to itself and keeps it and its listening socket
# open, as an MPI rank holds its peers': a restart then has sockets to make
# again (raw CRIU: --tcp-established).
PROGRAM_C = r"""
#include <arpa/inet.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

uint64_t *volatile keep;    /* the buffer escapes: no store is optimised away */

static int hold_tcp(void)   /* a listener and both ends of one connection */
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t n = sizeof(a);
    int one = 1, l = socket(AF_INET, SOCK_STREAM, 0), c = socket(AF_INET, SOCK_STREAM, 0);

    /* as servers do: else the killed program's connection in TIME_WAIT
       keeps the port from a restored listener (raw CRIU then fails) */
    if (l < 0 || c < 0 || setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
        bind(l, (struct sockaddr *)&a, n) || listen(l, 1) ||
        getsockname(l, (struct sockaddr *)&a, &n) || connect(c, (struct sockaddr *)&a, n))
        return -1;
    return accept(l, NULL, NULL) < 0 ? -1 : 0;
}

int main(int argc, char **argv)
{
    if (argc > 3 && strcmp(argv[3], "tcp") == 0 && hold_tcp()) {
        perror("tcp");
        return 1;
    }
    size_t words = strtoull(argc > 1 ? argv[1] : "64", NULL, 10) * (1 << 20) / 8;
    uint64_t x = 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid();
    uint64_t *buf = malloc(words * 8);
    if (!buf) {
        perror("malloc");
        return 1;
    }
    for (size_t i = 0; i < words; i++) {    /* xorshift64: never 0 */
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        buf[i] = x;
    }
    keep = buf;
    printf("ready\n");
    fflush(stdout);
    for (;;) {
        struct timespec now;
        char line[40];
        int fd, n;

        if (argc < 3) {
            sleep(1);
            continue;
        }
        clock_gettime(CLOCK_REALTIME, &now);
        n = snprintf(line, sizeof(line), "%lld.%09ld\n", (long long)now.tv_sec, now.tv_nsec);
        fd = open(argv[2], O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
        if (fd >= 0) {
            if (write(fd, line, (size_t)n) != n)
                return 2;
            close(fd);
        }
        usleep(1000);
    }
}
"""
TICK_TIMEOUT = 30.0         # a restored program ticks once it runs
OUR_TICKS, RAW_TICKS = "ticks-ours", "ticks-raw"   # in the workspace


def first_tick_after(ticks: Path, start: float) -> float:
    """Seconds from start (time.time()) until the program's first tick
    after it: when it ran again.  Waits for that tick."""
    def found() -> float | None:
        try:
            text = ticks.read_text()
        except FileNotFoundError:
            return None
        # whole lines only: the one being written may be cut short
        later = [t for t in (float(w) for w in text.split("\n")[:-1] if len(w) == 20)
                 if t > start]
        return min(later) - start if later else None
    return wait_until(found, f"a tick in {ticks.name}", TICK_TIMEOUT)


class BenchError(Exception):
    pass


def fsync_all(directory: Path) -> None:
    """fsync every file of a directory: the raw baseline of durable images
    (publication makes ours durable with one syncfs, see integrity.seal)."""
    for entry in Path(directory).iterdir():
        if entry.is_file():
            fd = os.open(entry, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def progress(text: str) -> None:
    print(f"bench: {text}", file=sys.stderr, flush=True)


# ---- what the benchmark creates, and its removal ------------------------------

@dataclass
class Workspace:
    keep_logs: bool = False
    base: Path | None = None    # set once created: only then is there anything to remove
    children: list[subprocess.Popen] = field(default_factory=list)
    adopted: list[psutil.Process] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)

    @property
    def run_dir(self) -> Path:
        return self.base / "run"

    name = "dmtcp-bench"  # of the directory, with the pid and a random part

    def create(self) -> None:
        self.base = Path(tempfile.mkdtemp(prefix=f"{self.name}-{os.getpid()}-", dir=BENCH_PARENT))
        self.run_dir.mkdir()
        # logs, tokens and run files of every command we start go here
        os.environ["DMTCP_TMPDIR"] = str(self.run_dir)

    def spawn(self, argv: list[str], out: Path, **kw) -> subprocess.Popen:
        """Start a process with stdin from /dev/null and stdout+stderr on a file."""
        with open(out, "ab") as f:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=f, stderr=f, **kw)
        self.children.append(proc)
        return proc

    def adopt(self, pid: int) -> psutil.Process:
        """Remember a process started here that is not our child (restored
        by CRIU, or below an agent), to kill it at cleanup if still alive."""
        proc = psutil.Process(pid)
        self.adopted.append(proc)
        return proc

    def adopt_if_alive(self, pid: int) -> None:
        """adopt(), for a process just seen in a listing of children: one
        that ended since (a short-lived helper) has nothing left to kill."""
        try:
            self.adopt(pid)
        except psutil.NoSuchProcess:
            pass

    port_range = PORTS  # a benchmark of its own may take another

    def free_port(self, within: range | None = None) -> int:
        """A port nobody listens on, of the workspace's range or of `within`
        (a benchmark's own, whatever workspace run.py made); one of ours is
        used again once its coordinator is gone (a long benchmark starts many)."""
        ports = within or self.port_range
        for port in ports:
            if _port_free(port):
                if port not in self.ports:
                    self.ports.append(port)
                return port
        raise BenchError(f"no free port in {ports.start}-{ports.stop - 1}")

    def cleanup(self) -> None:
        for port in self.ports:
            if coordinator_alive("127.0.0.1", port):
                _quit_coordinator(port)
        for proc in self.adopted:
            _kill(proc)
        for child in self.children:
            if child.poll() is None:
                child.kill()
                child.wait(EXIT_TIMEOUT)
        for port in self.ports:
            if coordinator_alive("127.0.0.1", port):
                progress(f"warning: a coordinator still answers on port {port}")
        if self.base is None:
            return
        if self.keep_logs:
            for entry in self.base.iterdir():
                if entry != self.run_dir:
                    _remove(entry)
            progress(f"logs kept in {self.run_dir}")
        else:
            _remove(self.base)


def _quit_coordinator(port: int) -> None:
    try:
        subprocess.run([str(BIN / "dmtcp-command"), "-p", str(port), "-q"],
                       capture_output=True, timeout=EXIT_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        pass  # reported below as still answering


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return not coordinator_alive("127.0.0.1", port)


def _kill(proc: psutil.Process) -> None:
    try:
        if proc.is_running():  # same pid and start time: still the one we adopted
            proc.kill()
            proc.wait(EXIT_TIMEOUT)
    except psutil.Error:      # gone already, or will not die: nothing more we may do
        pass


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


# ---- small tools ---------------------------------------------------------------

def wait_until(predicate, what: str, timeout: float):
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(POLL)


def run_checked(argv: list[str], timeout: float = OP_TIMEOUT) -> str:
    """Run a command to completion; its stdout, or BenchError with its stderr."""
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise BenchError(f"{' '.join(argv)}: no answer in {timeout:.0f} s") from None
    if proc.returncode != 0:
        detail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or ["?"]
        raise BenchError(f"{' '.join(argv)} exited with {proc.returncode}: {detail[0]}")
    return proc.stdout


def positive_ints(text: str) -> list[int]:
    """An argparse type: comma-separated integers, at least one, each at
    least 1 (--procs 1,8,32 and the like)."""
    try:
        values = [int(n) for n in text.split(",") if n.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated integers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: integers of at least 1")
    return values


def timed(fn, *args):
    """(seconds, result) of one call."""
    start = time.monotonic()
    result = fn(*args)
    return time.monotonic() - start, result


def settle(warm_mib: int = 0) -> None:
    """Before a measurement (not timed): write back the dirty pages the
    previous step left, so that no measurement pays for another's
    writeback; then write and delete warm_mib MiB in the page cache.

    Why the second part: this VM hands memory the guest frees back to its
    host (free page reporting), and the next first touch of it is slow:
    dd of 2 GiB into the page cache took 4-5 s cold and 0.4 s right after
    2 GiB were freed. Whichever of ours and raw CRIU ran second used the
    pages the first had just freed, and the ratios measured the VM. Now
    each measurement starts with that much memory freed just before."""
    os.sync()
    if warm_mib:
        path = Path(BENCH_PARENT) / f".warm-{os.getpid()}"
        zeros = bytes(1 << 20)
        try:
            with open(path, "wb") as f:
                for _ in range(warm_mib):
                    f.write(zeros)
        finally:
            path.unlink(missing_ok=True)


def compile_program(workdir: Path) -> Path:
    source, binary = workdir / "touch_mem.c", workdir / "touch_mem"
    source.write_text(PROGRAM_C)
    run_checked(["cc", "-O2", "-o", str(binary), str(source)])
    return binary


def printed_ready(out: Path) -> bool:
    try:
        return "ready" in out.read_text(errors="replace")
    except FileNotFoundError:
        return False


# ---- our side: coordinator, launch, checkpoint, restart -------------------------

@dataclass
class Computation:
    """One computation under our control: its coordinator and its agent."""
    port: int
    agent: subprocess.Popen


def coordinator_status(port: int) -> dict | None:
    """The coordinator's status (what `dmtcp-command -s --json` prints), or
    None while none answers.  In-process: polling through the CLI would add
    its start-up time to what we measure."""
    try:
        with CoordinatorClient("127.0.0.1", port, timeout=5.0) as client:
            return client.command(Cmd.STATUS).body
    except UserError:
        return None


def under_control(port: int) -> bool:
    st = coordinator_status(port)
    return bool(st and st["num_peers"] >= 1 and st["running"])


def command(port: int, *flags: str) -> str:
    return run_checked([str(BIN / "dmtcp-command"), "-p", str(port), *flags])


def start_ours(ws: Workspace, argv: list[str], out: Path, what: str) -> Computation:
    """Run argv (dmtcp-launch or dmtcp-restart and its arguments) with a
    port of ours; return once the program is under control and running."""
    port = ws.free_port()
    agent = ws.spawn([str(BIN / argv[0]), "-p", str(port), *argv[1:]], out)

    def ready() -> bool:
        if agent.poll() is not None:
            raise BenchError(f"{argv[0]} exited with {agent.returncode} before {what} ran: "
                             f"{out.read_text(errors='replace').strip()}")
        return under_control(port)

    wait_until(ready, f"{what} to be under control", OP_TIMEOUT)
    adopt_descendants(ws, agent.pid)
    return Computation(port, agent)


def launch(ws: Workspace, program: Path, size_mib: int, ckptdir: Path,
           tcp: bool = False) -> Computation:
    out = ws.base / "launch.out"
    out.unlink(missing_ok=True)   # left by the previous round
    comp = start_ours(ws, ["dmtcp-launch", "--ckptdir", str(ckptdir), str(program),
                           str(size_mib), str(ws.base / OUR_TICKS), *tcp_arg(tcp)], out,
                      "the launched program")
    wait_until(lambda: printed_ready(out), "the launched program to be ready", READY_TIMEOUT)
    return comp


def restart(ws: Workspace, image: Path, *options: str) -> Computation:
    return start_ours(ws, ["dmtcp-restart", *options, str(image)], ws.base / "restart.out",
                      "the restored program")


def adopt_descendants(ws: Workspace, pid: int) -> None:
    for proc in psutil.Process(pid).children(recursive=True):
        ws.adopt_if_alive(proc.pid)


def our_checkpoint(comp: Computation) -> float:
    """Checkpoint; return the duration the coordinator reports."""
    out = command(comp.port, "-bc")
    match = re.search(r"done: .* ([0-9.]+) s", out)
    if not match:
        raise BenchError(f"unexpected answer to -bc: {out.strip()!r}")
    return float(match.group(1))


def stop(comp: Computation) -> None:
    """Kill the computation; wait for its agent and its coordinator to go."""
    command(comp.port, "-k")
    comp.agent.wait(EXIT_TIMEOUT)
    try:
        wait_until(lambda: not coordinator_alive("127.0.0.1", comp.port),
                   f"the coordinator on port {comp.port} to exit", EXIT_TIMEOUT / 4)
    except BenchError:
        command(comp.port, "-q")


def image_of(ckptdir: Path) -> Path:
    images = [p for p in ckptdir.glob("ckpt_*.dmtcp") if p.is_dir()]
    if len(images) != 1:
        raise BenchError(f"expected one image in {ckptdir}, found {len(images)}")
    return images[0]


def criu_seconds(stats: Path, kind: str, key: str) -> float:
    """A time CRIU recorded in a stats file (stats-dump, stats-restore),
    which is then removed so that the next reading is a fresh one."""
    try:
        with open(stats, "rb") as f:
            micros = pycriu.images.load(f)["entries"][0][kind][key]
    except (OSError, KeyError, IndexError) as exc:
        raise BenchError(f"no {kind} statistics from CRIU in {stats}: {exc}") from None
    stats.unlink()
    return micros / 1e6


# ---- raw CRIU ----------------------------------------------------------------------

def tcp_arg(tcp: bool) -> list[str]:
    """The program's argument for holding a TCP connection."""
    return ["tcp"] if tcp else []


def raw_tcp(tcp: bool) -> list[str]:
    """Raw CRIU's options for a program holding a TCP connection (no
    iptables here to lock the network with)."""
    return ["--tcp-established", "--network-lock", "skip"] if tcp else []


def start_direct(ws: Workspace, program: Path, size_mib: int,
                 tcp: bool = False) -> subprocess.Popen:
    """The same program outside our control, in its own session with no
    terminal, so CRIU needs no --shell-job."""
    out = ws.base / "direct.out"
    out.unlink(missing_ok=True)   # left by the previous round
    proc = ws.spawn([str(program), str(size_mib), str(ws.base / RAW_TICKS), *tcp_arg(tcp)],
                    out, start_new_session=True)
    wait_until(lambda: printed_ready(out), "the direct program to be ready", READY_TIMEOUT)
    return proc


def raw_dump(pid: int, images: Path, tcp: bool = False) -> None:
    images.mkdir()
    run_checked([criu_binary(), "dump", "-t", str(pid), "-D", str(images), "--leave-running",
                 "-o", "dump.log", *raw_tcp(tcp)])


def raw_restore(images: Path, tcp: bool = False) -> int:
    pidfile = images / "restored.pid"
    run_checked([criu_binary(), "restore", "-D", str(images), "-d", "-o", "restore.log",
                 "--pidfile", str(pidfile), *raw_tcp(tcp)])
    return int(pidfile.read_text())


def dd(target: Path, size_mib: int, *conv: str) -> None:
    run_checked(["dd", "if=/dev/zero", f"of={target}", "bs=1M", f"count={size_mib}", *conv])


# ---- the rounds: every measurement once per round ----------------------------------
#
# Both programs are fresh in every round and alive during both dumps, and
# both restored programs are alive until both restores are done, so that
# ours and raw CRIU meet the same memory state.  Which goes first alternates
# between rounds, and each measurement starts with as much memory freed just
# before (settle): in this VM the same 1 GiB dump took CRIU from 0.7 to 2.5 s
# (its own frozen_time), depending on whether the page cache it wrote into
# was memory freed moments before or memory the host had taken back.

@dataclass
class Samples:
    values: dict[str, list[float]] = field(default_factory=dict)
    image_bytes: int = 0

    def add(self, key: str, seconds: float) -> None:
        self.values.setdefault(key, []).append(seconds)


def checkpoint_ours(comp: Computation, samples: Samples, warm_mib: int) -> None:
    settle(warm_mib)
    wall, reported = timed(our_checkpoint, comp)
    samples.add("ckpt", wall)
    samples.add("ckpt_reported", reported)
    samples.add("ckpt_frozen", criu_seconds(run_dir() / "stats-dump", "dump", "frozen_time"))
    progress(f"  ours: checkpoint {wall:.3f} s (coordinator says {reported:.3f} s)")


def dump_raw(direct: subprocess.Popen, images: Path, samples: Samples, warm_mib: int,
             tcp: bool = False) -> None:
    settle(warm_mib)
    dump_s = timed(raw_dump, direct.pid, images, tcp)[0]
    fsync_s = timed(fsync_all, images)[0]   # what publication does to make our images durable
    samples.add("raw_dump", dump_s)
    samples.add("raw_dump_fsync", dump_s + fsync_s)
    samples.add("raw_frozen", criu_seconds(images / "stats-dump", "dump", "frozen_time"))
    progress(f"  raw:  dump {dump_s:.3f} s (+ fsync {fsync_s:.3f} s)")


def restart_ours(ws: Workspace, image: Path, samples: Samples, warm_mib: int) -> Computation:
    settle(warm_mib)
    start = time.time()
    wall, comp = timed(restart, ws, image)
    ran = first_tick_after(ws.base / OUR_TICKS, start)
    samples.add("restart", wall)
    samples.add("restart_tick", ran)
    samples.add("restart_criu", criu_seconds(run_dir() / "stats-restore", "restore",
                                             "restore_time"))
    progress(f"  ours: restart {wall:.3f} s, first tick {ran:.3f} s")
    return comp


def restart_joined(ws: Workspace, image: Path, samples: Samples, warm_mib: int) -> None:
    """dmtcp-restart --join under a coordinator that runs already (DMTCP's
    usual way, the restart script's other hosts, a recovery), until the
    program's first tick: the restart claims its tree, then CRIU restores
    while the agent loads (coordinator/claims.py)."""
    port = ws.free_port()
    out = ws.base / "coordinator.out"
    coord = ws.spawn([str(BIN / "dmtcp-coordinator"), "-p", str(port), "--exit-on-last"], out)
    wait_until(lambda: coord.poll() is not None or coordinator_status(port) is not None,
               "the coordinator to answer", OP_TIMEOUT)
    if coord.poll() is not None:
        raise BenchError(f"dmtcp-coordinator exited with {coord.returncode}: "
                         f"{out.read_text(errors='replace')[-300:]!r}")
    settle(warm_mib)
    start = time.time()
    agent = ws.spawn([str(BIN / "dmtcp-restart"), "--join", "-p", str(port), str(image)],
                     ws.base / "restart.out")
    ran = first_tick_after(ws.base / OUR_TICKS, start)
    wait_until(lambda: under_control(port), "the restored program to be under control",
               OP_TIMEOUT)
    adopt_descendants(ws, agent.pid)
    samples.add("restart_join_tick", ran)
    progress(f"  ours: restart --join, first tick {ran:.3f} s")
    stop(Computation(port, agent))


def restart_lazy(ws: Workspace, image: Path, samples: Samples, warm_mib: int) -> None:
    """dmtcp-restart --lazy until the program runs under control (its pages
    then come in as it touches them)."""
    settle(warm_mib)
    start = time.time()
    wall, comp = timed(restart, ws, image, "--lazy")
    ran = first_tick_after(ws.base / OUR_TICKS, start)
    samples.add("restart_lazy", wall)
    samples.add("restart_lazy_tick", ran)
    progress(f"  ours: restart --lazy {wall:.3f} s, first tick {ran:.3f} s")
    stop(comp)


def restore_raw(ws: Workspace, images: Path, samples: Samples, warm_mib: int,
                tcp: bool = False) -> psutil.Process:
    settle(warm_mib)
    start = time.time()
    seconds, pid = timed(raw_restore, images, tcp)
    ran = first_tick_after(ws.base / RAW_TICKS, start)
    samples.add("raw_restore", seconds)
    samples.add("raw_restore_tick", ran)
    samples.add("raw_restore_criu", criu_seconds(images / "stats-restore", "restore",
                                                 "restore_time"))
    progress(f"  raw:  restore {seconds:.3f} s, first tick {ran:.3f} s")
    return ws.adopt(pid)


def in_order(ours_first: bool, ours, raw) -> tuple:
    """Call ours() and raw() in the given order; return their results as
    (ours, raw)."""
    if ours_first:
        ours_result = ours()
        return ours_result, raw()
    raw_result = raw()
    return ours(), raw_result


def measure_dd(ws: Workspace, size_mib: int, samples: Samples) -> None:
    target = ws.base / "ddfile"
    for key, conv in (("dd", ()), ("dd_sync", ("conv=fdatasync",))):
        settle(size_mib)
        seconds = timed(dd, target, size_mib, *conv)[0]
        target.unlink()    # not timed: unlinking 1 GiB costs ~0.5 s on this disk
        samples.add(key, seconds)
        progress(f"  dd {' '.join(conv) or '(page cache)'}: {seconds:.3f} s")


def one_round(ws: Workspace, program: Path, size_mib: int, ours_first: bool,
              samples: Samples, tcp: bool = False) -> None:
    ckptdir, images = ws.base / "ckpt", ws.base / "raw"
    comp = launch(ws, program, size_mib, ckptdir, tcp)
    direct = start_direct(ws, program, size_mib, tcp)
    samples.add("cli", timed(command, comp.port, "-s")[0])
    warm = size_mib     # as much as the images, or the restored memory, take (settle)
    in_order(ours_first, lambda: checkpoint_ours(comp, samples, warm),
             lambda: dump_raw(direct, images, samples, warm, tcp))
    stop(comp)
    direct.kill()        # the restored processes take the same pids
    direct.wait(EXIT_TIMEOUT)
    image = image_of(ckptdir)
    samples.image_bytes = sum(f.stat().st_size for f in image.iterdir())
    comp, restored = in_order(ours_first, lambda: restart_ours(ws, image, samples, warm),
                              lambda: restore_raw(ws, images, samples, warm, tcp))
    stop(comp)
    _kill(restored)
    restart_lazy(ws, image, samples, warm)
    restart_joined(ws, image, samples, warm)
    measure_dd(ws, size_mib, samples)
    _remove(ckptdir)
    _remove(images)


def run_rounds(ws: Workspace, program: Path, size_mib: int, runs: int,
               tcp: bool = False) -> Samples:
    samples = Samples()
    for index in range(runs):
        ours_first = index % 2 == 0
        progress(f"round {index + 1} of {runs} ({'ours' if ours_first else 'raw CRIU'} first)")
        one_round(ws, program, size_mib, ours_first, samples, tcp)
    return samples


# ---- the table -------------------------------------------------------------------------

ROWS = (
    ("ckpt", "(a) ours: dmtcp-command -bc, wall"),
    ("ckpt_reported", "    ours: -bc, duration the coordinator reports"),
    ("ckpt_frozen", "    ours: CRIU frozen_time (stats-dump)"),
    ("cli", "    ours: dmtcp-command -s, wall (CLI start-up)"),
    ("restart_tick", "(b) ours: dmtcp-restart until the program's first tick"),
    ("restart", "    ours: dmtcp-restart until the coordinator says running"),
    ("restart_criu", "    ours: CRIU restore_time (stats-restore)"),
    ("restart_join_tick", "(b) ours: dmtcp-restart --join (a coordinator runs), first tick"),
    ("restart_lazy_tick", "(b) ours: dmtcp-restart --lazy until the program's first tick"),
    ("restart_lazy", "    ours: dmtcp-restart --lazy until the coordinator says running"),
    ("raw_dump", "(c) raw: criu dump --leave-running"),
    ("raw_dump_fsync", "    raw: criu dump + fsync of every image file"),
    ("raw_frozen", "    raw: CRIU frozen_time (stats-dump)"),
    ("raw_restore_tick", "(d) raw: criu restore -d until the program's first tick"),
    ("raw_restore", "    raw: criu restore -d"),
    ("raw_restore_criu", "    raw: CRIU restore_time (stats-restore)"),
    ("dd", "(e) dd bs=1M (page cache)"),
    ("dd_sync", "(e) dd bs=1M conv=fdatasync"),
)
NOT_DATA = {"cli"}   # rows that move no image data: no MiB/s
COMPARISONS = (
    ("checkpoint", "ckpt", "raw_dump"),
    ("checkpoint vs fsynced raw dump", "ckpt", "raw_dump_fsync"),
    ("restart, until the first tick", "restart_tick", "raw_restore_tick"),
)


def table(samples: Samples, size_mib: int, runs: int) -> str:
    lines = [(f"{size_mib} MiB of touched memory, {runs} runs; images "
              f"{samples.image_bytes / 2**20:.1f} MiB; seconds"),
             f"{'measurement':<50} {'median':>8} {'min':>8} {'max':>8} {'MiB/s':>8}"]
    for key, label in ROWS:
        vals = samples.values[key]
        med = statistics.median(vals)
        rate = "" if key in NOT_DATA else f"{size_mib / med:.0f}"
        lines.append(f"{label:<50} {med:8.3f} {min(vals):8.3f} {max(vals):8.3f} {rate:>8}")
    lines.append("")
    lines.append(f"target: ours <= {TARGET_FACTOR}x raw CRIU + {TARGET_SLACK} s (medians)")
    for name, ours, raw in COMPARISONS:
        o, r = (statistics.median(samples.values[k]) for k in (ours, raw))
        limit = TARGET_FACTOR * r + TARGET_SLACK
        verdict = "PASS" if o <= limit else "MISS"
        lines.append(f"{name:<32} ours/raw {o / r:5.2f}x  {o:.3f} vs limit {limit:.3f}  {verdict}")
    return "\n".join(lines)


# ---- main ------------------------------------------------------------------------------

def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size-mib", type=int, default=1024, help="memory of the test process")
    p.add_argument("--runs", type=int, default=3, help="rounds of measurements")
    p.add_argument("--tcp", action="store_true",
                   help="the program holds a loopback TCP connection (and its listener)")
    p.add_argument("--keep-logs", action="store_true",
                   help="keep the agent, coordinator and CRIU logs (the run directory)")
    args = p.parse_args()
    if args.size_mib < 1 or args.runs < 1:
        p.error("--size-mib and --runs must be at least 1")
    return args


def _terminate(signum, frame):
    raise KeyboardInterrupt


def run_guarded(name: str, ws: Workspace, work, budget: int = 0) -> int:
    """Every benchmark's main(): as root, run work() (it returns the table)
    with the workspace made and always removed, within budget seconds if
    given; a failure is one line on stderr; the table goes to stdout."""
    if os.geteuid() != 0:
        print(f"{name}: error: run as root (CRIU needs it)", file=sys.stderr)
        return 1

    def out_of_time(_signum, _frame):
        raise BenchError(f"gave up after the time budget of {budget} s")

    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGALRM, out_of_time)
    try:
        signal.alarm(budget)
        ws.create()
        text = work()
    except (BenchError, subprocess.TimeoutExpired, psutil.Error) as exc:
        print(f"{name}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130
    finally:
        signal.alarm(0)
        ws.cleanup()
    print(text)
    return 0


def main() -> int:
    args = parse_args()
    ws = Workspace(keep_logs=args.keep_logs)

    def work() -> str:
        program = compile_program(ws.base)
        return table(run_rounds(ws, program, args.size_mib, args.runs, args.tcp),
                     args.size_mib, args.runs)

    return run_guarded("bench_checkpoint", ws, work)


if __name__ == "__main__":
    sys.exit(main())
