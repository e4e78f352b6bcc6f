"""Reading from and waiting on one socket: what the agent's modules
(drain, network, shimlink, udp) and the ssh relay's frames all need.

Nothing here imports asyncio at import time: dmtcp-ssh, which starts for
every remote command, reads its frames with the blocking half, and asyncio
would cost it more than the rest of its start-up.
"""
from __future__ import annotations

import select
import socket

SO_PEEK_OFF = getattr(socket, "SO_PEEK_OFF", 42)  # Linux's value; Python may lack the name


async def wait_readable(fd: int) -> None:
    """Until fd is readable, on the running loop."""
    await _wait(fd, writable=False)


async def wait_writable(fd: int) -> None:
    """Until fd is writable, on the running loop."""
    await _wait(fd, writable=True)


async def _wait(fd: int, *, writable: bool) -> None:
    import asyncio  # see the module's docstring

    loop = asyncio.get_running_loop()
    add, remove = (loop.add_writer, loop.remove_writer) if writable \
        else (loop.add_reader, loop.remove_reader)
    woken = loop.create_future()
    add(fd, lambda: woken.done() or woken.set_result(None))
    try:
        await woken
    finally:
        remove(fd)


class _ExactRead:
    """Reading n bytes, or fewer at EOF, never more, in steps, so that one
    loop serves the blocking and the asyncio callers below: each waits its
    own way between steps."""

    def __init__(self, sock: socket.socket, n: int) -> None:
        self.sock, self.n, self.got = sock, n, 0
        self.view = memoryview(bytearray(n))

    def step(self) -> bool:
        """Read what the socket has; True when done, False when a
        (non-blocking) socket has nothing yet."""
        while self.got < self.n:
            try:
                k = self.sock.recv_into(self.view[self.got:], self.n - self.got)
            except (BlockingIOError, InterruptedError):
                return False
            if k == 0:
                break
            self.got += k
        return True

    def data(self) -> bytes:
        return bytes(self.view[:self.got])


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    """n bytes from sock, fewer only at EOF; blocks this thread."""
    reading = _ExactRead(sock, n)
    while not reading.step():
        # a non-blocking socket with nothing yet (poll, not select: any fd number)
        waiting = select.poll()
        waiting.register(sock, select.POLLIN)
        waiting.poll()
    return reading.data()


async def recv_exactly_async(sock: socket.socket, n: int) -> bytes:
    """n bytes from a non-blocking sock, fewer only at EOF; on the running loop."""
    reading = _ExactRead(sock, n)
    while not reading.step():
        await wait_readable(sock.fileno())
    return reading.data()


def peek_queue(sock: socket.socket, bufsize: int, *,
               total: int | None = None) -> list[tuple[bytes, object]]:
    """Copies of the messages queued on a datagram or SOCK_SEQPACKET socket,
    each with its sender's address, left in the queue: MSG_PEEK reads from
    SO_PEEK_OFF, which each read moves on, so every read sees the next
    message.  The offset the socket had is restored.

    Stops at ``total`` bytes when given (the caller's FIONREAD: past the
    last message, a socket whose peer shut down answers EOF, not EAGAIN),
    else when a read would block (the socket must be non-blocking).
    ``bufsize``: the largest message expected."""
    old = sock.getsockopt(socket.SOL_SOCKET, SO_PEEK_OFF)
    sock.setsockopt(socket.SOL_SOCKET, SO_PEEK_OFF, 0)
    view = memoryview(bytearray(bufsize))
    out, seen = [], 0
    try:
        while total is None or seen < total:
            try:
                n, addr = sock.recvfrom_into(view, bufsize, socket.MSG_PEEK)
            except (BlockingIOError, InterruptedError):
                if total is not None:
                    raise  # FIONREAD said there is more
                break
            out.append((bytes(view[:n]), addr))
            seen += n
    finally:
        sock.setsockopt(socket.SOL_SOCKET, SO_PEEK_OFF, old)
    return out
