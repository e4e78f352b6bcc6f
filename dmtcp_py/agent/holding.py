"""A staying tree's connection to a moving tree, held while its peer moves
(migration, issue 16).

After the drain, the staying program gets back, on the connection's fd, one
end of a local pair of its own family (`a`); the agent keeps the other end
(`b`).  Through `b` the agent hands the program the bytes that were in
flight toward it (drained), and takes, into memory, what the program sends
meanwhile.  The program runs on; to it the peer is slow.  Meanwhile the
agent makes the connection again toward the moved tree's new copy.  When
every new copy is there the program is stopped once more, only long enough
to swap: both ends of the pair are drained (what the program has not read
yet, what it wrote), the new connection takes the fd, and the refill puts
the unread bytes back in front of the program and what it wrote behind the
peer's in-flight data.  If the migration fails the old connection takes the
fd instead, with the same refill toward the old copy.

Only plain connections are held: both write sides open, nothing kept in a
queue (drain.Drained flags); others stay stopped through the migration.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import socket

from dmtcp_py.agent import drain
from dmtcp_py.frozen import field, mutable_record
from dmtcp_py.images.socket_table import Connection, SocketInfo

# What the program may send toward a moving peer before it waits, as a
# program waits for a slow peer.  At the swap all of it goes into the new
# connection before the peer runs again, so it must fit in our send buffer
# (which root may force, SO_SNDBUFFORCE) and the peer's receive buffer: the
# agent's own memory (SEND_LIMIT) and the pair's buffers (PAIR_BUFFER) are
# kept to that.  Without root the send buffer stops at net.core.wmem_max.
SEND_LIMIT = (1 << 20) if os.geteuid() == 0 else (64 << 10)
PAIR_BUFFER = 32 << 10
_SO_SNDBUFFORCE = getattr(socket, "SO_SNDBUFFORCE", 32)


def can_hold(info: SocketInfo, drained: drain.Drained | None) -> bool:
    return (info.type == socket.SOCK_STREAM and not info.listening
            and (drained is None or (not drained.peer_shut_wr and not drained.self_shut_wr
                                     and drained.kept == 0)))


def small_buffers(program_end: socket.socket, ours: socket.socket) -> None:
    """What waits in the pair's kernel buffers at the swap is written to the
    new connection too: keep it small."""
    with contextlib.suppress(OSError):
        program_end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, PAIR_BUFFER)
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, PAIR_BUFFER)


def local_pair(family: int) -> tuple[socket.socket, socket.socket]:
    """Two connected stream sockets of the family: the program's and ours."""
    if family == socket.AF_UNIX:
        return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    here = "::1" if family == socket.AF_INET6 else "127.0.0.1"
    with socket.socket(family, socket.SOCK_STREAM) as listener:
        listener.bind((here, 0))
        listener.listen(1)
        a = socket.socket(family, socket.SOCK_STREAM)
        try:
            a.connect(listener.getsockname()[:2])
            b, _ = listener.accept()
        except BaseException:
            a.close()
            raise
    return a, b


@mutable_record
class Held:
    """One held connection."""
    conn: Connection
    info: SocketInfo
    old: socket.socket | None          # the parked original, toward the old copy
    mine: socket.socket                # our end of the pair
    a_ino: int                         # the program's end, by inode
    inbound: bytes                     # in flight toward the program at the drain
    sent_in: int = 0                   # ... of which handed to the program
    outbound: bytearray = field(default_factory=bytearray)  # what the program sent
    tasks: list[asyncio.Task] = field(default_factory=list)
    remade: asyncio.Task | None = None  # -> the new connection
    unread: bytes = b""                 # at the swap: the program had not read this

    def start(self) -> None:
        self.mine.setblocking(False)
        self.tasks = [asyncio.ensure_future(self._hand_in()),
                      asyncio.ensure_future(self._take_out())]

    async def _hand_in(self) -> None:
        loop = asyncio.get_running_loop()
        view = memoryview(self.inbound)
        while self.sent_in < len(view):
            self.sent_in += await loop.sock_send(self.mine, view[self.sent_in:])

    async def _take_out(self) -> None:
        loop = asyncio.get_running_loop()
        while len(self.outbound) < SEND_LIMIT:
            data = await loop.sock_recv(self.mine, min(1 << 16, SEND_LIMIT - len(self.outbound)))
            if not data:
                return  # (the program shut its write side: the swap meets its EOF)
            self.outbound += data

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.tasks = []

    async def swap_out(self, program_end: socket.socket, cookie: bytes, timeout: float) -> None:
        """The program is stopped and its end parked with us: what it has
        not read (then what we had not handed in yet) and what it wrote."""
        await self.stop()
        theirs, ours = await asyncio.gather(drain.drain(program_end, cookie, timeout),
                                            drain.drain(self.mine, cookie, timeout))
        if theirs.self_shut_wr or ours.peer_shut_wr:
            raise drain.DrainError("the program shut its connection to a moving tree "
                                   "while it moved; that end cannot be held")
        self.unread = theirs.data + self.inbound[self.sent_in:]
        self.outbound += ours.data

    def close(self) -> None:
        for task in (*self.tasks, *([self.remade] if self.remade else [])):
            task.cancel()
        for sock in (self.old, self.mine):
            if sock is not None:
                sock.close()
        if self.remade is not None and self.remade.done() and not self.remade.cancelled() \
                and self.remade.exception() is None:
            self.remade.result().close()


def grow_send_buffer(sock: socket.socket, extra: int) -> None:
    """Room for what the program wrote, behind the peer's refill, without
    the peer reading (it runs only after the round)."""
    with contextlib.suppress(OSError):
        have = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        sock.setsockopt(socket.SOL_SOCKET, _SO_SNDBUFFORCE, have + 2 * extra)


def inode(sock: socket.socket) -> int:
    return os.fstat(sock.fileno()).st_ino

