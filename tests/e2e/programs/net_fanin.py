"""Many TCP connections between two processes, every byte checked.

    net_fanin.py server ADDR PORT TICKS INTERVAL_MS [N]
    net_fanin.py clients ADDR PORT N TICKS INTERVAL_MS

The server listens on ADDR:PORT and serves every connection it accepts
(with N, it does not finish before it has accepted N of them).  The client
process opens N connections to it and keeps them all busy.  One thread
each, standard library only, non-blocking sockets.

Every connection carries a stream of 64-bit little-endian words in each
direction: word number s of connection c is DIR | DATA | c << 40 | s, where
DIR is bit 63 (set from the server to the client) and DATA is 1 << 56.  The
client numbers its connections 0..N-1; the server learns the number from
the first word and answers with the same number, so a byte lost, doubled,
reordered or delivered on the wrong connection is a wrong word: "FAIL ..."
on stderr, exit 3.  The last word before the end of file is a trailer
(tag 2 instead of 1) holding the number of data words sent, so a lost tail
is found too; an end of file or a reset without the trailer means the peer
died: FAIL as well, after a pause (a kill of the computation takes its
processes one by one: this one is killed in that pause without a word).

Each INTERVAL_MS round writes 1 KiB more on every connection and reads only
what lies beyond the last 4 KiB of each receive queue (FIONREAD), so each
direction of each connection always has 4-5 KiB in flight whatever the
socket buffer sizes are (a restart makes new sockets), and the total stays
small: about 2 MB for 200 connections.  A stop of any length (a checkpoint
stops every thread) only delays the rounds; they never catch up.  Python
retries system calls a signal interrupts (PEP 475).

Each round prints "tick N MODE conns C active A least L sent S received R"
(A: connections that received data, L: the fewest data words one of them
received; S, R: data words in all).  After TICKS
rounds each side writes its trailers, shuts the writing half of every
connection, reads each one to its end of file and prints "done TICKS MODE
conns C sent S received R", exit 0.
"""
from __future__ import annotations

import fcntl
import os
import select
import socket
import struct
import sys
import termios
import time
from array import array

# One write per line, so that processes sharing this output never split
# each other's lines: with PYTHONUNBUFFERED=1 (set on this project's machines)
# print() writes the text and its newline in two writes.
sys.stdout = open(sys.stdout.fileno(), "w", buffering=1, closefd=False)

WRITE = 1024           # bytes written per connection per round
KEEP = 4096            # bytes left unread in each receive queue
READ_MAX = 16 * WRITE  # at most this much read per connection per round
DATA, TRAILER = 1, 2
SEQ_MASK = (1 << 40) - 1
DEATH_PAUSE = 3.0      # before reporting a vanished peer (we may be killed too)
CONNECT_TIMEOUT = 30.0
FINISH_TIMEOUT = 120.0
_BIG = sys.byteorder == "big"
_INQ = array("i", [0])  # FIONREAD's answer


def fail(msg: str, pause: float = 0.0) -> None:
    if pause:
        time.sleep(pause)
    sys.stdout.flush()
    print(f"FAIL[{os.getpid()}]: {msg}", file=sys.stderr, flush=True)
    os._exit(3)


def oserr(exc: OSError) -> str:
    return os.strerror(exc.errno) if exc.errno else str(exc)


def base(direction: int, tag: int, cid: int) -> int:
    return (direction << 63) | (tag << 56) | (cid << 40)


def words(first: int, n: int) -> bytes:
    a = array("Q", range(first, first + n))
    if _BIG:
        a.byteswap()
    return a.tobytes()


class Conn:
    __slots__ = ("carry", "cid", "eof", "fd", "in_dir", "out", "out_dir", "rseq", "shut",
                 "sock", "trailer_in", "trailer_out", "wseq")

    def __init__(self, sock: socket.socket, cid: int | None, out_dir: int) -> None:
        sock.setblocking(False)
        self.sock, self.fd, self.cid = sock, sock.fileno(), cid
        self.out_dir, self.in_dir = out_dir, 1 - out_dir
        self.wseq = 0             # data words generated (written, but those in self.out)
        self.rseq = 0             # data words received and checked
        self.out = b""            # generated, not taken by the kernel yet
        self.carry = b""          # the start of a word
        self.trailer_in = False   # the peer's trailer arrived
        self.trailer_out = False  # ours is generated
        self.shut = False         # our writing half is shut
        self.eof = False

    def name(self) -> str:
        return f"connection {'?' if self.cid is None else self.cid} (fd {self.fd})"

    # ---- writing --------------------------------------------------------------
    def write(self, finishing: bool) -> None:
        """One round: 1 KiB more (or the trailer and the shutdown)."""
        if self.shut:
            return
        if not self.out:
            if self.cid is None:  # the server answers once it knows the number
                return
            if finishing:
                if self.trailer_out:
                    self._shut()
                    return
                self.out = words(base(self.out_dir, TRAILER, self.cid) | self.wseq, 1)
                self.trailer_out = True
            else:
                n = WRITE // 8
                self.out = words(base(self.out_dir, DATA, self.cid) + self.wseq, n)
                self.wseq += n
        while self.out:
            try:
                k = self.sock.send(self.out)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                fail(f"{self.name()}: send: {oserr(exc)} after {self.wseq} words", DEATH_PAUSE)
            self.out = self.out[k:]
        if self.trailer_out:
            self._shut()

    def _shut(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError as exc:
            fail(f"{self.name()}: shutdown: {oserr(exc)}", DEATH_PAUSE)
        self.shut = True

    # ---- reading --------------------------------------------------------------
    def read(self, everything: bool) -> None:
        """Read and check what lies beyond KEEP bytes (everything: up to EOF)."""
        while not self.eof:
            if everything:
                want = 1 << 16
            else:
                try:
                    fcntl.ioctl(self.fd, termios.FIONREAD, _INQ)
                except OSError as exc:
                    fail(f"{self.name()}: FIONREAD: {oserr(exc)}", DEATH_PAUSE)
                want = min(_INQ[0] - KEEP, READ_MAX)
                if want <= 0:
                    return
            try:
                data = self.sock.recv(want)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                fail(f"{self.name()}: recv: {oserr(exc)} after {self.rseq} words", DEATH_PAUSE)
            if not data:
                self.eof = True
                if self.carry:
                    fail(f"{self.name()}: the stream ends inside a word")
                if not self.trailer_in:
                    fail(f"{self.name()}: end of file without a trailer after {self.rseq} "
                         "words (the peer died?)", DEATH_PAUSE)
                return
            self.check(data)
            if not everything:
                return

    def check(self, data: bytes) -> None:
        buf = self.carry + data if self.carry else data
        n = len(buf) // 8
        self.carry = buf[n * 8:]
        if n == 0:
            return
        if self.trailer_in:
            fail(f"{self.name()}: {len(buf)} bytes after the trailer")
        if self.cid is None:
            (w,) = struct.unpack_from("<Q", buf)
            cid = (w >> 40) & 0xFFFF
            if w != base(self.in_dir, DATA, cid):
                fail(f"{self.name()}: first word {w:#018x} is not word 0 of a connection")
            self.cid = cid
            claim(self)
        whole = buf[:n * 8] if self.carry else buf
        first = base(self.in_dir, DATA, self.cid) + self.rseq
        if whole == words(first, n):
            self.rseq += n
            return
        got = array("Q")
        got.frombytes(whole)
        if _BIG:
            got.byteswap()
        i = next(i for i, w in enumerate(got) if w != first + i)
        w = got[i]
        self.rseq += i
        if w == base(self.in_dir, TRAILER, self.cid) | self.rseq:
            if i == n - 1 and not self.carry:
                self.trailer_in = True
                return
            fail(f"{self.name()}: {len(buf) - 8 * (i + 1)} bytes after the trailer")
        fail(f"{self.name()}: word {self.rseq} (stream byte {8 * self.rseq}) is {w:#018x}, "
             f"expected {first + i:#018x}")


_claimed: dict[int, Conn] = {}
_expect_n: int | None = None


def claim(conn: Conn) -> None:
    """The server: connection numbers are unique and below N."""
    if conn.cid in _claimed:
        fail(f"{conn.name()}: number {conn.cid} is already {_claimed[conn.cid].name()}")
    if _expect_n is not None and conn.cid >= _expect_n:
        fail(f"{conn.name()}: number {conn.cid} is not below {_expect_n}")
    _claimed[conn.cid] = conn


def connect(addr: tuple[str, int]) -> socket.socket:
    deadline = time.monotonic() + CONNECT_TIMEOUT
    while True:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.connect(addr)
            return sock
        except OSError as exc:
            sock.close()
            if time.monotonic() > deadline:
                fail(f"connect to {addr[0]}:{addr[1]}: {oserr(exc)}")
            time.sleep(0.05)


def main(argv: list[str]) -> int:
    global _expect_n
    if len(argv) in (6, 7) and argv[1] == "server":
        mode, addr, port, ticks, ms = "server", argv[2], int(argv[3]), int(argv[4]), int(argv[5])
        n = int(argv[6]) if len(argv) == 7 else None
    elif len(argv) == 7 and argv[1] == "clients":
        mode, addr, port, n, ticks, ms = "clients", argv[2], int(argv[3]), *map(int, argv[4:7])
    else:
        fail(f"usage: {argv[0]} server ADDR PORT TICKS INTERVAL_MS [N] | "
             "clients ADDR PORT N TICKS INTERVAL_MS")
    if ticks < 1 or ms < 1 or (n is not None and not 0 < n <= 0xFFFF):
        fail("TICKS, INTERVAL_MS and N must be positive, N at most 65535")
    _expect_n = n
    interval = ms / 1000
    conns: list[Conn] = []
    listener = None
    if mode == "server":
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((addr, port))
        listener.listen(socket.SOMAXCONN)
        listener.setblocking(False)
        print("listening", flush=True)
    else:
        conns = [Conn(connect((addr, port)), cid, 0) for cid in range(n)]
        print(f"connected {n}", flush=True)

    def accept() -> None:
        while listener is not None:
            try:
                sock, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                fail(f"accept: {oserr(exc)}")
            conns.append(Conn(sock, None, 1))

    def status(with_active: bool) -> str:
        sent = sum(c.wseq for c in conns)
        received = sum(c.rseq for c in conns)
        act = ""
        if with_active:
            act = (f" active {sum(1 for c in conns if c.rseq > 0)}"
                   f" least {min((c.rseq for c in conns), default=0)}")
        return f"{mode} conns {len(conns)}{act} sent {sent} received {received}"

    next_round = time.monotonic()

    def pause(step: float) -> None:
        nonlocal next_round
        next_round += step
        now = time.monotonic()
        if not now - step <= next_round <= now + step:
            next_round = now  # we were stopped (or the clock jumped): go on from now
        elif next_round > now:
            time.sleep(next_round - now)

    for tick in range(1, ticks + 1):
        pause(interval)
        accept()
        for c in conns:
            c.read(False)
            c.write(False)
        print(f"tick {tick} {status(True)}", flush=True)

    # the end: every connection there, trailers, shutdowns, reads to EOF
    deadline = time.monotonic() + FINISH_TIMEOUT
    while n is not None and len(conns) < n:
        if time.monotonic() > deadline:
            fail(f"only {len(conns)} of {n} connections after the last tick")
        pause(interval)
        accept()
        for c in conns:
            c.read(False)
            c.write(False)
    # from here on, wait for the sockets (the peer may still be ticking)
    busy = list(conns)
    while True:
        for c in busy:
            c.read(True)
            c.write(True)
        left = [c for c in conns if not (c.shut and c.eof)]
        if not left:
            break
        if time.monotonic() > deadline:
            fail(f"{len(left)} connections not finished: {', '.join(c.name() for c in left[:5])}")
        poller = select.poll()
        by_fd = {}
        for c in left:
            by_fd[c.fd] = c
            poller.register(c.fd, (0 if c.eof else select.POLLIN)
                            | (0 if c.shut or c.cid is None else select.POLLOUT))
        busy = [by_fd[fd] for fd, _ in poller.poll(int(interval * 1000))]
    for c in conns:
        c.sock.close()
    if listener is not None:
        listener.close()
    print(f"done {ticks} {status(False)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
