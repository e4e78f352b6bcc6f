"""dmtcp_py.sockio on real socket pairs: exact reads (blocking and on the
loop), waiting, and peeking at a message queue without consuming it."""
from __future__ import annotations

import asyncio
import socket
import threading

import pytest

from dmtcp_py import sockio


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def test_recv_exactly_blocking_gathers_pieces_and_stops_at_n(pair):
    a, b = pair

    def write():
        for piece in (b"ab", b"cd", b"efgh"):
            a.sendall(piece)

    writer = threading.Thread(target=write)
    writer.start()
    assert sockio.recv_exactly(b, 5) == b"abcde"
    writer.join()
    assert b.recv(10) == b"fgh"  # never read past n


def test_recv_exactly_blocking_waits_on_a_non_blocking_socket(pair):
    a, b = pair
    b.setblocking(False)
    threading.Timer(0.05, a.sendall, (b"xyz",)).start()
    assert sockio.recv_exactly(b, 3) == b"xyz"


def test_recv_exactly_gives_fewer_bytes_at_eof(pair):
    a, b = pair
    a.sendall(b"12")
    a.shutdown(socket.SHUT_WR)
    assert sockio.recv_exactly(b, 4) == b"12"


def test_recv_exactly_async(pair):
    a, b = pair
    b.setblocking(False)

    async def main():
        loop = asyncio.get_running_loop()
        loop.call_later(0.02, a.sendall, b"hel")
        loop.call_later(0.04, a.sendall, b"lo!!")
        got = await asyncio.wait_for(sockio.recv_exactly_async(b, 5), 5)
        a.shutdown(socket.SHUT_WR)
        rest = await asyncio.wait_for(sockio.recv_exactly_async(b, 5), 5)
        return got, rest

    assert asyncio.run(main()) == (b"hello", b"!!")


def test_wait_writable_and_readable(pair):
    a, b = pair

    async def main():
        await asyncio.wait_for(sockio.wait_writable(a.fileno()), 5)
        asyncio.get_running_loop().call_later(0.02, a.sendall, b"x")
        await asyncio.wait_for(sockio.wait_readable(b.fileno()), 5)
        # the fd is left to others once the wait is over
        asyncio.get_running_loop().add_reader(b.fileno(), lambda: None)
        asyncio.get_running_loop().remove_reader(b.fileno())

    asyncio.run(main())


def _offset(sock: socket.socket) -> int:
    return sock.getsockopt(socket.SOL_SOCKET, sockio.SO_PEEK_OFF)


def test_peek_queue_leaves_datagrams_queued():
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        rx.bind(("127.0.0.1", 0))
        tx.bind(("127.0.0.1", 0))
        rx.setblocking(False)
        for msg in (b"one", b"", b"three"):
            tx.sendto(msg, rx.getsockname())
        before = _offset(rx)
        peeked = sockio.peek_queue(rx, 65536)
        assert [m for m, _ in peeked] == [b"one", b"", b"three"]
        assert all(src == tx.getsockname() for _, src in peeked)
        assert _offset(rx) == before
        assert [rx.recv(100) for _ in range(3)] == [b"one", b"", b"three"]
    finally:
        rx.close()
        tx.close()


def test_peek_queue_stops_at_total_past_a_shut_peer():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        for msg in (b"aa", b"bbbb"):
            a.send(msg)
        a.shutdown(socket.SHUT_WR)  # past the last message: EOF, not EAGAIN
        assert [m for m, _ in sockio.peek_queue(b, 6, total=6)] == [b"aa", b"bbbb"]
        assert b.recv(10) == b"aa"
    finally:
        a.close()
        b.close()
