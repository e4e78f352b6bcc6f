"""agent.drain on real sockets: TCP loopback, AF_UNIX stream, SOCK_SEQPACKET,
connected SOCK_DGRAM; both ends drained and refilled concurrently; the
"application" is the test itself, which writes seeded random streams until
the kernel buffers are full and checks every byte in order afterwards."""
from __future__ import annotations

import asyncio
import json
import os
import random
import select
import socket
import threading
import time

import pytest

from dmtcp_py.agent.drain import Drained, DrainError, drain, refill

T = 5.0  # generous per-call timeout; a hang fails instead of blocking
_SO_SNDBUFFORCE = 32


@pytest.fixture
def track():
    """Register sockets to be closed when the test ends, pass or fail."""
    socks: list[socket.socket] = []

    def add(*new: socket.socket):
        socks.extend(new)
        return new if len(new) > 1 else new[0]

    yield add
    for s in socks:
        s.close()


def tcp_pair(track, family=socket.AF_INET, host="127.0.0.1"):
    listener = track(socket.create_server((host, 0), family=family))
    a = track(socket.create_connection(listener.getsockname()[:2]))
    b, _ = listener.accept()
    track(b)
    listener.close()
    return a, b


def unix_pair(track, type_=socket.SOCK_STREAM, big=True):
    a, b = track(*socket.socketpair(socket.AF_UNIX, type_))
    if big:  # several MiB in flight, not the default 200 KiB
        for s in (a, b):
            s.setsockopt(socket.SOL_SOCKET, _SO_SNDBUFFORCE, 2 << 20)
    return a, b


PAIRS = {"tcp": tcp_pair, "unix": unix_pair}


class Flow:
    """One direction of the application's byte stream: a seeded random
    sequence, so any byte lost, doubled or moved is caught."""

    def __init__(self, seed: int, size: int = 16 << 20) -> None:
        self.expect = random.Random(seed).randbytes(size)
        self.written = 0
        self.read = 0

    @property
    def in_flight(self) -> int:
        return self.written - self.read

    def write_until_full(self, sock: socket.socket, limit: int | None = None) -> int:
        end = len(self.expect) if limit is None else min(len(self.expect), self.written + limit)
        old = sock.gettimeout()
        sock.setblocking(False)
        try:
            while self.written < end:
                try:
                    self.written += sock.send(self.expect[self.written:min(end, self.written + (256 << 10))])
                except BlockingIOError:
                    break
        finally:
            sock.settimeout(old)
        return self.written

    def recv(self, sock: socket.socket, n: int) -> None:
        assert self.read + n <= self.written
        buf = bytearray(1 << 20)
        old = sock.gettimeout()
        sock.settimeout(T)
        try:
            while n:
                k = sock.recv_into(buf, min(n, len(buf)))
                assert k, f"EOF with {n} bytes missing"
                assert buf[:k] == self.expect[self.read:self.read + k], f"mismatch at offset {self.read}"
                self.read += k
                n -= k
        finally:
            sock.settimeout(old)

    def read_rest(self, sock: socket.socket) -> None:
        self.recv(sock, self.in_flight)


def nothing_pending(sock: socket.socket) -> bool:
    return not select.select([sock], [], [], 0.01)[0]


def assert_eof(sock: socket.socket) -> None:
    sock.settimeout(T)
    assert sock.recv(1) == b""


async def drain_both(a, b, cookie, timeout=T):
    return await asyncio.gather(drain(a, cookie, timeout), drain(b, cookie, timeout))


async def refill_both(a, da, b, db, timeout=T, shut_a=False, shut_b=False):
    ab, ba = asyncio.Queue(), asyncio.Queue()  # the coordinator's relay
    return await asyncio.gather(
        refill(a, da, timeout, relay_send=ab.put, relay_recv=ba.get, shut_after=shut_a),
        refill(b, db, timeout, relay_send=ba.put, relay_recv=ab.get, shut_after=shut_b),
        return_exceptions=True)


def checked(results):
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


def traffic_goes_on(a, b, ab: Flow, ba: Flow, amount=300_000) -> None:
    for _ in range(2):
        ab.write_until_full(a, amount)
        ba.write_until_full(b, amount)
        ab.read_rest(b)
        ba.read_rest(a)
    assert nothing_pending(a) and nothing_pending(b)


# --- streams -------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["tcp", "unix"])
def test_full_buffers_both_ways(track, kind):
    a, b = PAIRS[kind](track)
    ab, ba = Flow(1), Flow(2)
    ab.write_until_full(a)
    ba.write_until_full(b)
    ab.recv(b, 100_001)  # the application read a little
    ba.recv(a, 77_777)
    ab.write_until_full(a)
    ba.write_until_full(b)
    assert ab.in_flight > (2 << 20) and ba.in_flight > (2 << 20)
    a.settimeout(2.5)  # the application's settings survive
    cookie = os.urandom(16)

    da, db = asyncio.run(drain_both(a, b, cookie))
    assert (da.kind, db.kind) == ("stream", "stream")
    assert da.nbytes + db.nbytes == ab.in_flight + ba.in_flight
    assert db.data == ab.expect[ab.read:ab.written]
    assert da.data == ba.expect[ba.read:ba.written]
    assert not (da.peer_shut_wr or da.self_shut_wr or db.peer_shut_wr or db.self_shut_wr)
    assert a.gettimeout() == 2.5 and not os.get_blocking(a.fileno())
    assert b.gettimeout() is None and os.get_blocking(b.fileno())

    checked(asyncio.run(refill_both(a, da, b, db)))
    assert a.gettimeout() == 2.5 and b.gettimeout() is None and os.get_blocking(b.fileno())
    ab.read_rest(b)
    ba.read_rest(a)
    assert nothing_pending(a) and nothing_pending(b)
    traffic_goes_on(a, b, ab, ba)


@pytest.mark.parametrize("kind", ["tcp", "unix"])
def test_empty_connection(track, kind):
    a, b = PAIRS[kind](track)
    da, db = asyncio.run(drain_both(a, b, os.urandom(16)))
    assert da == Drained("stream") and db == Drained("stream")
    checked(asyncio.run(refill_both(a, da, b, db)))
    assert nothing_pending(a) and nothing_pending(b)
    traffic_goes_on(a, b, Flow(3, 1 << 20), Flow(4, 1 << 20))


@pytest.mark.parametrize("kind", ["tcp", "unix"])
def test_one_direction_only(track, kind):
    a, b = PAIRS[kind](track)
    ab, ba = Flow(5), Flow(6, 1 << 20)
    ab.write_until_full(a)
    da, db = asyncio.run(drain_both(a, b, os.urandom(16)))
    assert da.data == b"" and db.data == ab.expect[:ab.written]
    checked(asyncio.run(refill_both(a, da, b, db)))
    ab.read_rest(b)
    assert nothing_pending(a) and nothing_pending(b)
    traffic_goes_on(a, b, ab, ba)


def test_tcp_ipv6(track):
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        a, b = tcp_pair(track, socket.AF_INET6, "::1")
    except OSError:
        pytest.skip("no ::1")
    ab, ba = Flow(7, 1 << 20), Flow(8, 1 << 20)
    ab.write_until_full(a, 500_000)
    ba.write_until_full(b, 300_000)
    da, db = asyncio.run(drain_both(a, b, os.urandom(16)))
    checked(asyncio.run(refill_both(a, da, b, db)))
    ab.read_rest(b)
    ba.read_rest(a)
    traffic_goes_on(a, b, ab, ba)


def test_ends_in_separate_threads_and_loops(track):
    """Two agents: each end on its own event loop, in its own thread."""
    a, b = tcp_pair(track)
    ab, ba = Flow(9), Flow(10)
    ab.write_until_full(a)
    ba.write_until_full(b)
    cookie = os.urandom(16)

    def both(make):
        results = [None, None]

        def run(i, coro_fn):
            try:
                results[i] = asyncio.run(coro_fn())
            except BaseException as exc:  # noqa: BLE001 - reported below
                results[i] = exc

        threads = [threading.Thread(target=run, args=(i, f)) for i, f in enumerate(make())]
        for t in threads:
            t.start()
        for t in threads:
            t.join(2 * T)
        return checked(results)

    da, db = both(lambda: (lambda: drain(a, cookie, T), lambda: drain(b, cookie, T)))
    assert db.data == ab.expect[:ab.written] and da.data == ba.expect[:ba.written]
    both(lambda: (lambda: refill(a, da, T), lambda: refill(b, db, T)))
    ab.read_rest(b)
    ba.read_rest(a)
    traffic_goes_on(a, b, ab, ba)


def test_echo_raises_sndbuf_only_when_needed(track):
    a, b = unix_pair(track, big=False)
    before = a.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
    ab = Flow(11, 1 << 20)
    ab.write_until_full(a, 1000)  # a small echo fits the default buffer
    da, db = asyncio.run(drain_both(a, b, os.urandom(16)))
    checked(asyncio.run(refill_both(a, da, b, db)))
    assert a.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) == before
    ab.read_rest(b)
    # on a fresh pair, 1 MiB to echo needs more than the default ~200 KiB
    a2, b2 = unix_pair(track, big=False)
    db.data = ab.expect[:1 << 20]
    checked(asyncio.run(refill_both(a2, Drained("stream"), b2, db)))
    assert a2.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) >= 1 << 20
    assert b2.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) == before
    check = Flow(11, 1 << 20)
    check.written = 1 << 20
    check.read_rest(b2)
    assert nothing_pending(b2)


# --- message kinds --------------------------------------------------------------

def make_messages(seed: int, n: int, sizes=(0, 1, 7, 100, 1500, 4000, 30000)) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(rng.choice(sizes)) for _ in range(n)]


def send_until_full(sock, msgs, start=0) -> int:
    sock.setblocking(False)
    try:
        i = start
        while i < len(msgs):
            try:
                sock.send(msgs[i])
            except BlockingIOError:
                break
            i += 1
        return i
    finally:
        sock.setblocking(True)


def recv_messages(sock, expect: list[bytes]) -> None:
    sock.settimeout(T)
    for i, m in enumerate(expect):
        assert sock.recv(1 << 16) == m, f"message {i}"


@pytest.mark.parametrize("type_", [socket.SOCK_SEQPACKET, socket.SOCK_DGRAM], ids=["seqpacket", "dgram"])
def test_message_boundaries(track, type_):
    a, b = unix_pair(track, type_, big=False)
    for s in (a, b):
        s.setsockopt(socket.SOL_SOCKET, _SO_SNDBUFFORCE, 1 << 20)
    m_ab, m_ba = make_messages(12, 5000), make_messages(13, 5000)
    w_ab = send_until_full(a, m_ab)
    w_ba = send_until_full(b, m_ba)
    assert 50 < w_ab < len(m_ab) and 50 < w_ba < len(m_ba)
    recv_messages(b, m_ab[:10])
    cookie = os.urandom(16)

    da, db = asyncio.run(drain_both(a, b, cookie))
    assert (da.kind, db.kind) == ("message", "message")
    assert db.messages == m_ab[10:w_ab] and da.messages == m_ba[:w_ba]
    assert da.nbytes == sum(map(len, m_ba[:w_ba]))
    checked(asyncio.run(refill_both(a, da, b, db)))
    recv_messages(b, m_ab[10:w_ab])
    recv_messages(a, m_ba[:w_ba])
    assert nothing_pending(a) and nothing_pending(b)
    more = [b"", b"after", b"x" * 5000]
    for m in more:
        a.send(m)
        b.send(m)
    recv_messages(a, more)
    recv_messages(b, more)
    assert nothing_pending(a) and nothing_pending(b)


def test_connected_udp(track):
    a, b = track(socket.socket(socket.AF_INET, socket.SOCK_DGRAM),
                 socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
    a.bind(("127.0.0.1", 0))
    b.bind(("127.0.0.1", 0))
    a.connect(b.getsockname())
    b.connect(a.getsockname())
    small = (0, 1, 100, 1500)  # well within the receive buffers: UDP drops
    m_ab, m_ba = make_messages(21, 30, small), make_messages(22, 20, small)
    for m in m_ab:
        a.send(m)
    for m in m_ba:
        b.send(m)
    recv_messages(b, m_ab[:5])
    da, db = asyncio.run(drain_both(a, b, os.urandom(16)))
    assert db.messages == m_ab[5:] and da.messages == m_ba
    checked(asyncio.run(refill_both(a, da, b, db)))
    recv_messages(b, m_ab[5:])
    recv_messages(a, m_ba)
    assert nothing_pending(a) and nothing_pending(b)


def test_seqpacket_half_closed(track):
    a, b = unix_pair(track, socket.SOCK_SEQPACKET, big=False)
    m_ab, m_ba = [b"one", b"", b"three"], make_messages(14, 50)
    for m in m_ab:
        a.send(m)
    a.shutdown(socket.SHUT_WR)
    m_ba = m_ba[:send_until_full(b, m_ba)]
    assert m_ba
    da, db = asyncio.run(drain_both(a, b, os.urandom(16)))
    assert da.self_shut_wr and db.peer_shut_wr and db.kept == 3
    assert db.messages == m_ab and da.messages == m_ba
    checked(asyncio.run(refill_both(a, da, b, db)))
    recv_messages(b, m_ab)
    assert_eof(b)
    recv_messages(a, m_ba)
    b.send(b"still")
    recv_messages(a, [b"still"])


# --- half-closed streams ----------------------------------------------------------

def wait_fin(sock):
    p = select.poll()
    p.register(sock, select.POLLRDHUP)
    assert p.poll(int(T * 1000)), "the FIN did not arrive"


@pytest.mark.parametrize("kind", ["tcp", "unix"])
def test_half_closed(track, kind):
    """a sent some data and shut its write side; b is still sending."""
    a, b = PAIRS[kind](track)
    ab, ba = Flow(15, 1 << 20), Flow(16)
    ab.write_until_full(a, 20_000)  # fits b's receive buffer: the FIN is there
    a.shutdown(socket.SHUT_WR)
    ba.write_until_full(b)
    wait_fin(b)

    da, db = asyncio.run(drain_both(a, b, os.urandom(16)))
    assert da.self_shut_wr and not da.peer_shut_wr
    assert db.peer_shut_wr and not db.self_shut_wr
    assert db.data == ab.expect[:ab.written] and db.kept == ab.written
    assert da.data == ba.expect[:ba.written]

    checked(asyncio.run(refill_both(a, da, b, db)))
    ab.read_rest(b)
    assert_eof(b)
    ba.read_rest(a)
    ba.write_until_full(b, 300_000)
    ba.read_rest(a)
    assert nothing_pending(a)


def restart_onto(track, kind, da: Drained, db: Drained, shut_a: bool):
    """The restart: records through the manifest (JSON), a new connection."""
    da = Drained.from_json(json.loads(json.dumps(da.to_json())))
    db = Drained.from_json(json.loads(json.dumps(db.to_json())))
    a2, b2 = PAIRS[kind](track)
    checked(asyncio.run(refill_both(a2, da, b2, db, shut_a=shut_a)))
    return a2, b2


@pytest.mark.parametrize("half", [False, True], ids=["open", "half-closed"])
@pytest.mark.parametrize("kind", ["tcp", "unix"])
def test_restart_on_fresh_sockets(track, kind, half):
    a, b = PAIRS[kind](track)
    ab, ba = Flow(17), Flow(18)
    ab.write_until_full(a, 50_000 if half else None)
    if half:
        a.shutdown(socket.SHUT_WR)
        wait_fin(b)
    ba.write_until_full(b)
    da, db = asyncio.run(drain_both(a, b, os.urandom(16)))
    assert db.peer_shut_wr == half and da.self_shut_wr == half
    a.close()
    b.close()

    a2, b2 = restart_onto(track, kind, da, db, shut_a=half)
    ab.read_rest(b2)
    if half:
        assert_eof(b2)
    ba.read_rest(a2)
    if half:
        ba.write_until_full(b2, 300_000)
        ba.read_rest(a2)
    else:
        traffic_goes_on(a2, b2, ab, ba)


def test_tcp_fin_behind_full_send_queue(track):
    """A FIN stuck behind megabytes in the peer's send queue is seen only
    after drain read part of that data: the original socket cannot be
    refilled (DrainError says so), the records still restart correctly."""
    a, b = tcp_pair(track)
    ab, ba = Flow(19), Flow(20, 1 << 20)
    ab.write_until_full(a)
    a.shutdown(socket.SHUT_WR)
    ba.write_until_full(b, 100_000)
    da, db = asyncio.run(drain_both(a, b, os.urandom(16)))
    assert db.peer_shut_wr and da.self_shut_wr
    assert db.data == ab.expect[:ab.written] and db.kept < len(db.data)
    ra, rb = asyncio.run(refill_both(a, da, b, db))
    assert isinstance(ra, DrainError) and "cannot be written back" in str(ra)
    assert rb is None

    a2, b2 = restart_onto(track, "tcp", da, db, shut_a=True)
    ab.read_rest(b2)
    assert_eof(b2)
    ba.read_rest(a2)


# --- failures ----------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["tcp", "unix"])
def test_timeout_when_peer_never_answers(track, kind):
    a, _b = PAIRS[kind](track)
    a.settimeout(3.0)
    start = time.monotonic()
    with pytest.raises(DrainError, match="did not arrive"):
        asyncio.run(drain(a, os.urandom(16), 0.3))
    assert time.monotonic() - start < 1.5
    assert a.gettimeout() == 3.0


def test_message_timeout(track):
    a, _b = unix_pair(track, socket.SOCK_SEQPACKET, big=False)
    with pytest.raises(DrainError):
        asyncio.run(drain(a, os.urandom(16), 0.2))


def test_reset_is_a_drain_error(track):
    a, b = tcp_pair(track)
    b.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    b.close()  # RST
    time.sleep(0.05)
    with pytest.raises(DrainError):
        asyncio.run(drain(a, os.urandom(16), T))


def test_refill_rejects_garbage(track):
    a, b = unix_pair(track, big=False)
    b.sendall(b"not a refill request at all")
    with pytest.raises(DrainError, match="not a stream refill request"):
        asyncio.run(refill(a, Drained("stream"), T))


def test_json_roundtrip():
    d = Drained("message", messages=[b"", b"\x00\xff"], peer_shut_wr=True, kept=1)
    assert Drained.from_json(json.loads(json.dumps(d.to_json()))) == d
    s = Drained("stream", data=bytes(range(256)) * 3, self_shut_wr=True)
    assert Drained.from_json(s.to_json()) == s and s.nbytes == 768
    with pytest.raises(ValueError):
        Drained.from_json({"kind": "bogus"})
