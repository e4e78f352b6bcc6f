#!/usr/bin/env python3
"""Drain and refill of many connections with MiB in flight, against a plain copy.

C connections (--conns, default 100) are opened over TCP loopback (and, with
--unix, as AF_UNIX stream socketpairs, a second row).  The "application"
writes MIB MiB (--mib, default 4) into each connection, non-blocking, and
never reads: with --direction both (the default, closer to reality) half goes
each way, with --direction one all of it goes from the first end to the
second.  Every stream is a slice of a random pattern at an offset of its own,
so bytes moved to the wrong place, lost, doubled or reordered are noticed.
When a send hits EAGAIN before its share is written, the writer's SO_SNDBUF
is raised with SO_SNDBUFFORCE (this script runs as root) until it fits; that
is the buffer that bounds what is in flight on both transports (on TCP the
rest of the bytes wait in the sender's queue behind the receive window, on
AF_UNIX the receiver's queue is charged to the sender).  The table reports
the bytes really in flight and how many buffers had to be raised.

Then, in one asyncio loop, as one agent holding both ends of every
connection would, each of --runs rounds measures

  drain          dmtcp_py.agent.drain.drain() on both ends of all connections
                 concurrently (cookie protocol), until all returned
  refill         dmtcp_py.agent.drain.refill() on both ends of all connections
                 concurrently (request, then echo), until all returned
  copy           baselines in the same round: the same total number of bytes
                 written by one writer and read by one reader in the same loop
                 through one AF_UNIX stream socketpair and through one TCP
                 loopback connection, default buffers, 1 MiB reads as drain does

and, not timed, checks that each end's drained data is exactly the bytes that
were in flight toward it, and that after the refill the application reads
exactly those bytes again on every end, nothing more (a quiet period of
QUIET seconds on every socket at the end).  A wrong byte fails the run.

Times are median / min / max in seconds; MB/s is bytes in flight over the
median (10^6 bytes per second); "x copy" is the median time per byte over the
median time per byte of the copy baseline.  The table also shows the RSS this
process gained while drained data was held.  Fresh connections are opened
every round and closed at its end; every socket is closed at the end, also on
failure or Ctrl-C.  Progress goes to stderr, the table to stdout.  The whole
run gives up after TIME_BUDGET seconds.

    .venv/bin/python scripts/bench/bench_drain.py [--conns 100] [--mib 4] [--runs 3]
        [--direction both|one] [--unix]
        [--profile FILE]   # cProfile the drain and refill phases (slows them)
"""
from __future__ import annotations

import argparse
import array
import asyncio
import contextlib
import cProfile
import fcntl
import pstats
import random
import resource
import secrets
import select
import signal
import socket
import statistics
import sys
import termios
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchlib import raise_nofile
from dmtcp_py.agent import drain

HOST = "127.0.0.1"
MIB = 1 << 20
TIME_BUDGET = 110.0         # the whole run, seconds
OP_TIMEOUT = 30.0           # one drain or refill call (network.DRAIN_TIMEOUT)
QUIET = 0.1                 # no socket may become readable after the verification read
CHUNK = MIB                 # reads of the baselines and of the verification, as drain's
PATTERN_LEN = MIB + 4099    # not a power of two: shifted streams never line up by chance
SNDBUF_RAISES = 8           # give up filling one stream after this many raises
PROBE_CAP = 64 * MIB        # the default-buffer probe stops there
SO_SNDBUFFORCE = getattr(socket, "SO_SNDBUFFORCE", 32)


class BenchError(Exception):
    pass


def progress(text: str) -> None:
    print(f"[bench] {text}", file=sys.stderr, flush=True)


def check_budget(deadline: float) -> None:
    if time.monotonic() > deadline:
        raise TimeoutError(f"over the time budget of {TIME_BUDGET:.0f} s")


# ---- the application's bytes ------------------------------------------------------

class Pattern:
    """Random bytes, repeated: stream byte k of a stream at offset o is
    block[(o + k) % PATTERN_LEN]."""

    def __init__(self, seed: int) -> None:
        block = random.Random(seed).randbytes(PATTERN_LEN)
        self.twice = block + block
        self.view = memoryview(self.twice)

    def chunk(self, start: int, n: int) -> memoryview:
        """Up to n bytes (at most PATTERN_LEN) from stream position start."""
        o = start % PATTERN_LEN
        return self.view[o:o + min(n, PATTERN_LEN)]

    def expected(self, start: int, n: int) -> bytes:
        o = start % PATTERN_LEN
        return self.twice[o:o + n]


@dataclass
class Stream:
    """One direction of one connection: the application wrote `length`
    bytes from pattern position `offset` on."""
    offset: int
    length: int = 0


@dataclass
class Pair:
    a: socket.socket
    b: socket.socket
    to_b: Stream  # written on a, in flight toward b
    to_a: Stream
    cookie: bytes = field(default_factory=lambda: secrets.token_bytes(32))

    def ends(self):
        """(socket, the stream in flight toward it, a name for messages)."""
        return ((self.a, self.to_a, "a"), (self.b, self.to_b, "b"))


class Sockets:
    """Every socket opened here, closed at the end whatever happens."""

    def __init__(self) -> None:
        self.open: list[socket.socket] = []

    def add(self, sock: socket.socket) -> socket.socket:
        self.open.append(sock)
        return sock

    def close_all(self) -> None:
        for sock in self.open:
            sock.close()
        self.open.clear()


def tcp_pairs(n: int, socks: Sockets) -> list[tuple[socket.socket, socket.socket]]:
    listener = socks.add(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
    listener.bind((HOST, 0))
    listener.listen(min(n, 4096))
    pairs = []
    for _ in range(n):
        client = socks.add(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
        client.connect(listener.getsockname())
        server, _ = listener.accept()
        pairs.append((client, socks.add(server)))
    listener.close()
    return pairs


def unix_pairs(n: int, socks: Sockets) -> list[tuple[socket.socket, socket.socket]]:
    out = []
    for _ in range(n):
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        out.append((socks.add(a), socks.add(b)))
    return out


OPENERS = {"tcp": tcp_pairs, "unix": unix_pairs}


# ---- fill ---------------------------------------------------------------------------

@dataclass
class FillInfo:
    raised: int = 0         # sockets whose SO_SNDBUF had to be raised
    max_sndbuf: int = 0     # largest SO_SNDBUF (as getsockopt reports it) after the fill
    in_recv_queues: int = 0  # bytes that made it into receive queues (FIONREAD)


def write_until(sock: socket.socket, stream: Stream, target: int, pattern: Pattern) -> int:
    """Write the stream non-blocking up to target bytes; on EAGAIN raise
    SO_SNDBUF and go on.  Returns how many times it was raised."""
    raises = 0
    while stream.length < target:
        try:
            n = sock.send(pattern.chunk(stream.offset + stream.length, target - stream.length))
        except BlockingIOError:
            if raises == SNDBUF_RAISES:
                break
            current = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
            sock.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, max(current, target))  # doubled
            raises += 1
            continue
        stream.length += n
    return raises


def fill(pairs: list[Pair], share: tuple[int, int], pattern: Pattern) -> FillInfo:
    info = FillInfo()
    for p in pairs:
        for writer, stream, target in ((p.a, p.to_b, share[0]), (p.b, p.to_a, share[1])):
            if target and write_until(writer, stream, target, pattern):
                info.raised += 1
            info.max_sndbuf = max(info.max_sndbuf,
                                  writer.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF))
        info.in_recv_queues += sum(inq(s) for s in (p.a, p.b))
    return info


def inq(sock: socket.socket) -> int:
    n = array.array("i", [0])
    fcntl.ioctl(sock.fileno(), termios.FIONREAD, n)
    return n[0]


def probe_default(kind: str, pattern: Pattern) -> int:
    """Bytes one direction holds with the kernel's default buffers."""
    socks = Sockets()
    try:
        (a, _), = OPENERS[kind](1, socks)
        a.setblocking(False)
        sent = 0
        while sent < PROBE_CAP:
            try:
                sent += a.send(pattern.chunk(sent, PROBE_CAP - sent))
            except BlockingIOError:
                break
        return sent
    finally:
        socks.close_all()


# ---- verification (not timed) ---------------------------------------------------------

def compare(data, start: int, stream: Stream, pattern: Pattern, what: str) -> None:
    """data must be stream bytes [start, start + len(data))."""
    view = memoryview(data)
    for pos in range(0, len(view), PATTERN_LEN):
        got = bytes(view[pos:pos + PATTERN_LEN])
        want = pattern.expected(stream.offset + start + pos, len(got))
        if got != want:
            first = next(i for i in range(len(got)) if got[i] != want[i])
            raise BenchError(f"{what}: wrong byte at stream offset {start + pos + first} "
                             f"of {stream.length}")


def check_drained(pairs: list[Pair], results: list[drain.Drained], pattern: Pattern,
                  kind: str) -> None:
    for i, p in enumerate(pairs):
        for (_, stream, name), d in zip(p.ends(), results[2 * i:2 * i + 2]):
            what = f"{kind} connection {i} end {name}: drained data"
            if d.kind != drain.STREAM or d.peer_shut_wr or d.self_shut_wr or d.kept:
                raise BenchError(f"{what}: unexpected record {d.kind} peer_shut_wr="
                                 f"{d.peer_shut_wr} self_shut_wr={d.self_shut_wr} kept={d.kept}")
            if len(d.data) != stream.length:
                raise BenchError(f"{what}: {len(d.data)} bytes, {stream.length} were in flight")
            compare(d.data, 0, stream, pattern, what)


def check_application(pairs: list[Pair], pattern: Pattern, deadline: float, kind: str) -> None:
    """As the application: read exactly what was in flight toward each end,
    compare it, then require that nothing more arrives on any end."""
    scratch = bytearray(CHUNK)
    view = memoryview(scratch)
    poller = select.poll()
    for i, p in enumerate(pairs):
        for sock, stream, name in p.ends():
            what = f"{kind} connection {i} end {name}: after refill"
            got = 0
            one = select.poll()
            one.register(sock, select.POLLIN)
            while got < stream.length:
                try:
                    k = sock.recv_into(view, min(CHUNK, stream.length - got))
                except BlockingIOError:
                    left = min(deadline - time.monotonic(), OP_TIMEOUT)
                    if left <= 0 or not one.poll(left * 1000):
                        raise BenchError(f"{what}: read {got} of {stream.length} bytes, "
                                         "then nothing more came") from None
                    continue
                if k == 0:
                    raise BenchError(f"{what}: EOF after {got} of {stream.length} bytes")
                compare(view[:k], got, stream, pattern, what)
                got += k
            poller.register(sock, select.POLLIN)
    extra = poller.poll(QUIET * 1000)
    if extra:
        fd = extra[0][0]
        sock = next(s for p in pairs for s in (p.a, p.b) if s.fileno() == fd)
        try:
            more = len(sock.recv(CHUNK))
        except BlockingIOError:
            more = 0
        raise BenchError(f"{kind}: {len(extra)} ends readable after all their in-flight bytes "
                         f"were read (first one: {more} more bytes, 0 means EOF)")


# ---- measured phases ----------------------------------------------------------------

def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


@dataclass
class Sample:
    drain: float
    refill: float
    in_flight: int          # bytes, all connections, both directions
    fill: FillInfo
    rss_drained: int        # RSS after the drain over the one before it
    rss_refilled: int       # RSS after the refill (drained data still held) over the same


async def timed(name: str, deadline: float, coro, profile: cProfile.Profile | None):
    timeout = min(OP_TIMEOUT, deadline - time.monotonic())
    t0 = time.perf_counter()
    if profile:
        profile.enable()
    try:
        async with asyncio.timeout(timeout + 1.0):
            result = await coro
    except TimeoutError:
        raise TimeoutError(f"{name} did not finish within {timeout + 1.0:.1f} s") from None
    finally:
        if profile:
            profile.disable()
    return time.perf_counter() - t0, result


async def drain_refill_round(kind: str, conns: int, share: tuple[int, int], pattern: Pattern,
                             socks: Sockets, deadline: float,
                             profile: cProfile.Profile | None) -> Sample:
    offsets = random.sample(range(PATTERN_LEN), 2 * conns)
    pairs = [Pair(a, b, Stream(offsets[2 * i]), Stream(offsets[2 * i + 1]))
             for i, (a, b) in enumerate(OPENERS[kind](conns, socks))]
    for p in pairs:
        p.a.setblocking(False)
        p.b.setblocking(False)
    info = fill(pairs, share, pattern)
    in_flight = sum(p.to_a.length + p.to_b.length for p in pairs)
    check_budget(deadline)
    op = min(OP_TIMEOUT, deadline - time.monotonic())
    rss0 = rss_bytes()

    t_drain, results = await timed("drain", deadline, drain.concurrently(
        *(drain.drain(sock, p.cookie, op) for p in pairs for sock, _, _ in p.ends())), profile)
    rss1 = rss_bytes()
    check_drained(pairs, results, pattern, kind)
    check_budget(deadline)

    op = min(OP_TIMEOUT, deadline - time.monotonic())
    t_refill, _ = await timed("refill", deadline, drain.concurrently(
        *(drain.refill(sock, d, op) for (sock, _, _), d in
          zip((e for p in pairs for e in p.ends()), results))), profile)
    rss2 = rss_bytes()
    del results
    check_application(pairs, pattern, deadline, kind)
    return Sample(t_drain, t_refill, in_flight, info, rss1 - rss0, rss2 - rss0)


async def wait_fd(add, remove, fd: int) -> None:
    fut = asyncio.get_running_loop().create_future()
    add(fd, lambda: fut.done() or fut.set_result(None))
    try:
        await fut
    finally:
        remove(fd)


async def copy_through(w: socket.socket, r: socket.socket, total: int, pattern: Pattern) -> float:
    """One writer, one reader, one loop: total bytes from w to r."""
    loop = asyncio.get_running_loop()
    w.setblocking(False)
    r.setblocking(False)
    scratch = memoryview(bytearray(CHUNK))

    async def writer() -> None:
        sent = 0
        while sent < total:
            try:
                sent += w.send(pattern.chunk(sent, total - sent))
            except BlockingIOError:
                await wait_fd(loop.add_writer, loop.remove_writer, w.fileno())

    async def reader() -> None:
        got = 0
        while got < total:
            try:
                k = r.recv_into(scratch, CHUNK)
            except BlockingIOError:
                await wait_fd(loop.add_reader, loop.remove_reader, r.fileno())
                continue
            if k == 0:
                raise BenchError(f"copy: EOF after {got} of {total} bytes")
            got += k
        if got != total:
            raise BenchError(f"copy: read {got} bytes, {total} were written")

    t0 = time.perf_counter()
    await drain.concurrently(writer(), reader())
    return time.perf_counter() - t0


async def copy_round(kind: str, total: int, pattern: Pattern, socks: Sockets,
                     deadline: float) -> float:
    (w, r), = OPENERS[kind](1, socks)
    async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
        return await copy_through(w, r, total, pattern)


# ---- report --------------------------------------------------------------------------

def secs(samples: list[float]) -> str:
    return " / ".join(f"{f(samples):6.3f}" for f in (statistics.median, min, max))


def per_byte(times: list[float], nbytes: list[int]) -> float:
    return statistics.median(times) / statistics.median(nbytes)


def print_table(args, rows: dict[str, list[Sample]], copies: dict[str, list[float]],
                copy_bytes: int, defaults: dict[str, int]) -> None:
    way = "half each way" if args.direction == "both" else "all one way"
    print(f"\ndrain benchmark: {args.conns} connections x {args.mib:g} MiB in flight ({way}), "
          f"{args.runs} runs")
    print("seconds as median / min / max; MB/s = bytes in flight / median; "
          "x copy = time per byte / that of the copy baseline")
    baselines = {k: per_byte(t, [copy_bytes]) for k, t in copies.items()}
    head = f"{'transport':<10} {'phase':<13} {'seconds':^24} {'MB/s':>7}"
    head += "".join(f" {'x ' + k + ' copy':>12}" for k in copies)
    print(head)
    for kind, samples in rows.items():
        nbytes = [s.in_flight for s in samples]
        phases = {"drain": [s.drain for s in samples], "refill": [s.refill for s in samples],
                  "drain+refill": [s.drain + s.refill for s in samples]}
        for name, times in phases.items():
            rate = statistics.median(nbytes) / statistics.median(times) / 1e6
            line = f"{kind:<10} {name:<13} {secs(times):^24} {rate:7.0f}"
            line += "".join(f" {per_byte(times, nbytes) / b:11.2f}x" for b in baselines.values())
            print(line)
    for kind, times in copies.items():
        rate = copy_bytes / statistics.median(times) / 1e6
        line = f"{'copy':<10} {kind + ' x1':<13} {secs(times):^24} {rate:7.0f}"
        line += "".join(f" {per_byte(times, [copy_bytes]) / b:11.2f}x" for b in baselines.values())
        print(line)
    print(f"\ncopy baselines: {copy_bytes / MIB:.1f} MiB through one connection, default buffers")
    for kind, samples in rows.items():
        s = samples[-1]
        print(f"{kind}: {s.in_flight / MIB:.1f} MiB in flight "
              f"({s.in_flight / args.conns / MIB:.2f} MiB per connection, "
              f"{100 * s.fill.in_recv_queues / max(s.in_flight, 1):.0f}% in receive queues); "
              f"default buffers hold {defaults[kind] / 1024:.0f} KiB per direction; "
              f"SO_SNDBUF raised on {s.fill.raised} sockets, largest {s.fill.max_sndbuf / MIB:.1f} MiB; "
              f"RSS +{max(x.rss_drained for x in samples) / MIB:.0f} MiB after drain, "
              f"+{max(x.rss_refilled for x in samples) / MIB:.0f} MiB after refill "
              f"(peak RSS of the process {peak_rss() / MIB:.0f} MiB)")


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# ---- main ----------------------------------------------------------------------------

def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conns", type=int, default=100, help="connections (default 100)")
    parser.add_argument("--mib", type=float, default=4.0,
                        help="MiB in flight per connection (default 4)")
    parser.add_argument("--direction", choices=("both", "one"), default="both",
                        help="both: half of it each way (default); one: all from end a to b")
    parser.add_argument("--unix", action="store_true",
                        help="also AF_UNIX stream socketpairs (a second row)")
    parser.add_argument("--runs", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--profile", type=Path,
                        help="cProfile the drain and refill phases into this file")
    args = parser.parse_args()
    if args.conns < 1 or args.runs < 1 or args.mib <= 0:
        parser.error("--conns and --runs must be at least 1, --mib positive")
    return args


async def bench(args, pattern: Pattern, socks: Sockets, deadline: float,
                profile: cProfile.Profile | None):
    per_conn = int(args.mib * MIB)
    share = (per_conn - per_conn // 2, per_conn // 2) if args.direction == "both" \
        else (per_conn, 0)
    kinds = ["tcp", "unix"] if args.unix else ["tcp"]
    rows: dict[str, list[Sample]] = {k: [] for k in kinds}
    copies: dict[str, list[float]] = {"socketpair": [], "tcp": []}
    copy_bytes = args.conns * per_conn
    for r in range(args.runs):
        for kind in kinds:
            progress(f"run {r + 1}/{args.runs}: {kind}: {args.conns} connections, "
                     f"fill, drain, refill, verify")
            s = await drain_refill_round(kind, args.conns, share, pattern, socks, deadline,
                                         profile)
            socks.close_all()
            progress(f"  {s.in_flight / MIB:.1f} MiB: drain {s.drain:.3f} s, "
                     f"refill {s.refill:.3f} s, RSS +{s.rss_drained / MIB:.0f} MiB "
                     f"after drain, +{s.rss_refilled / MIB:.0f} MiB after refill")
            rows[kind].append(s)
            check_budget(deadline)
        for name, kind in (("socketpair", "unix"), ("tcp", "tcp")):
            t = await copy_round(kind, copy_bytes, pattern, socks, deadline)
            socks.close_all()
            progress(f"  copy {copy_bytes / MIB:.1f} MiB through {name}: {t:.3f} s")
            copies[name].append(t)
            check_budget(deadline)
    return rows, copies, copy_bytes


def main() -> int:
    args = parse_args()
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # clean up as on Ctrl-C
    deadline = time.monotonic() + TIME_BUDGET
    raise_nofile(2 * args.conns + 256)
    pattern = Pattern(secrets.randbits(64))
    socks = Sockets()
    profile = cProfile.Profile() if args.profile else None
    try:
        defaults = {k: probe_default(k, pattern) for k in OPENERS}
        rows, copies, copy_bytes = asyncio.run(bench(args, pattern, socks, deadline, profile))
        print_table(args, rows, copies, copy_bytes, defaults)
        if profile:
            profile.dump_stats(args.profile)
            progress(f"profile of the drain and refill phases in {args.profile}; top 15:")
            with contextlib.redirect_stdout(sys.stderr):
                pstats.Stats(profile).sort_stats("tottime").print_stats(15)
        return 0
    except (BenchError, drain.DrainError, OSError, TimeoutError) as exc:
        print(f"bench_drain: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        socks.close_all()


if __name__ == "__main__":
    sys.exit(main())
