"""Drain and refill of one end of a connection whose two ends are both ours.

At a checkpoint the processes are stopped and the agent holds their
connected sockets.  For every connection whose two ends are under control,
the agents of the two ends (one agent, or two on different hosts) call
:func:`drain` on their end, concurrently, and later :func:`refill`.  The
application never notices: after the refill each end's byte stream goes on
exactly where it stopped, no byte lost, doubled or reordered, including the
bytes that sat in kernel buffers (one end's receive queue, the other end's
send queue) when the processes stopped.  This module knows nothing of the
coordinator, of CRIU or of the shims; it moves bytes on one socket.

Drain (DMTCP's cookie protocol)
-------------------------------
Each end writes a cookie behind whatever the application queued and reads
until the peer's cookie is the tail of what it received; everything before
the cookie was in flight toward this end.  The caller passes the same
random cookie (16 bytes or more) to both ends: the stream toward each end
ends with the cookie the peer wrote, whatever value it has.  Why a cookie:
nothing is ever added to the application's stream outside a checkpoint (no
framing, no per-connection handshake), and the end of the in-flight data is
found without any knowledge of the application's protocol.  A stream is
scanned by its tail only (bytes appended to one ``bytearray``, the last
``len(cookie)`` compared), so many MiB cost linear time; a cookie that the
application's own data happens to end with at a read boundary would fool it,
hence a random cookie.  For SOCK_SEQPACKET and connected SOCK_DGRAM sockets
(kind ``"message"``) the cookie is one message and boundaries are kept.

Half-closed connections: if our write side is shut, sending the cookie fails
(EPIPE/ENOTCONN/ESHUTDOWN) and ``self_shut_wr`` is set.  If the peer's write
side is shut (POLLRDHUP; on TCP that means its FIN arrived in order, so all
of its data is in our receive queue; on AF_UNIX it is always so) the peer
cannot send a cookie: drain copies what is queued with MSG_PEEK instead of
reading it, sets ``peer_shut_wr`` and counts the copied tail in ``kept``.
Those bytes and the EOF behind them stay in the original socket, because
nobody could write them into it again.  Known limits: on TCP, a FIN still
stuck behind data in the peer's send queue is only seen after drain has read
part of that data; those bytes cannot be refilled on the original socket
(refill raises :class:`DrainError` saying how many) though they are in
``data`` for a restart.  A zero-length SOCK_SEQPACKET message right before
the peer's shutdown looks like EOF and is lost.  A connected SOCK_DGRAM
whose peer shut its write side gives no EOF: drain times out.  SCM_RIGHTS
and MSG_OOB data in flight are not handled.

Refill (the data goes back the way DMTCP does it)
-------------------------------------------------
Bytes can only enter a receive queue by being written by the peer.  So each
end sends the peer a *request*: a header (magic, length or message count,
``kept``) and its own ``Drained`` payload, i.e. the bytes that were in
flight toward itself; it reads exactly the peer's request, not one byte
more, since what follows in the stream is the echo meant for the
application; then, only when its own request is completely written, it
writes the peer's payload back (the *echo*).  On the wire each end's
outgoing stream is ``request | echo``, and the peer consumes the request, so
the application finds exactly the echo, i.e. its own in-flight data, in its
receive queue.  Requests go both ways at once with concurrent send and
receive, so large payloads never deadlock.  Nobody reads the echo until the
application runs again, so before writing it the socket's SO_SNDBUF is
raised with SO_SNDBUFFORCE (the agent runs as root) to hold it all, when the
current size is too small and only then (this pins the send buffer size;
TCP stops autotuning it).  For UDP the receiving end also raises its
SO_RCVBUF to hold its own payload, since UDP drops what does not fit; UDP is
best effort all the same (a dropped cookie or request datagram ends in a
DrainError by timeout).

An end whose write side is shut (``self_shut_wr``) cannot send its request
on the socket: it goes through ``relay_send(bytes)`` (the coordinator, in
production) and the peer, which knows it from its own ``peer_shut_wr``,
takes it from ``relay_recv()``.  Such an end cannot echo on the original
socket either, and does not need to: what was in flight toward its peer was
kept in the peer's receive queue, followed by the EOF, which therefore
reaches the application again.  After a restart the sockets are fresh: the
formerly shut end echoes like any other, then the caller must shut it again
with ``shutdown(SHUT_WR)``, which ``refill(..., shut_after=True)`` does
after the echo, so that the peer's application sees the EOF after the data.

Both functions set the socket non-blocking and restore its original
blocking flag (O_NONBLOCK of the open file description, shared with the
application) and Python timeout at the end.
"""
from __future__ import annotations

import array
import asyncio
import base64
import contextlib
import errno
import fcntl
import inspect
import os
import select
import socket
import struct
import termios
from collections.abc import Awaitable, Callable

from dmtcp_py.frozen import field, mutable_record
from dmtcp_py.sockio import peek_queue, recv_exactly_async, wait_readable, wait_writable

__all__ = ["MESSAGE", "STREAM", "DrainError", "Drained", "drain", "refill"]

STREAM = "stream"
MESSAGE = "message"

_STREAM_MAGIC = b"DMTCPRFs"
_MESSAGE_MAGIC = b"DMTCPRFm"
_HEADER = struct.Struct("!8sQQ")  # magic, length in bytes or message count, kept
_LEN = struct.Struct("!I")  # one message in a relayed request
_CHUNK = 1 << 20
_SO_SNDBUFFORCE = getattr(socket, "SO_SNDBUFFORCE", 32)  # Linux values; Python lacks these
_SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)
_SHUT_ERRNOS = (errno.EPIPE, errno.ENOTCONN, errno.ESHUTDOWN)
_MSG_OVERHEAD = 1024  # kernel memory per queued message, beyond its bytes
_SLACK = 64 << 10
_INT_MAX = 2**31 - 1


class DrainError(Exception):
    """Drain or refill of one connection end failed (timeout, reset, a
    protocol error, or bytes that cannot be written back); the message
    says which."""


@mutable_record
class Drained:
    """What drain took out of one connection end.

    ``data`` (stream) or ``messages`` (message kinds) is what was in flight
    toward this end.  ``kept`` counts the trailing bytes (stream) or
    messages of it that are still in this socket's receive queue, because
    the peer's write side was shut; only refill on the original socket
    cares."""
    kind: str
    data: bytes = b""
    messages: list[bytes] = field(default_factory=list)
    peer_shut_wr: bool = False
    self_shut_wr: bool = False
    kept: int = 0

    def __repr__(self) -> str:  # short: asyncio and logs repr results
        what = f"{len(self.data)} bytes" if self.kind == STREAM else \
            f"{len(self.messages)} messages, {self.nbytes} bytes"
        return (f"Drained({self.kind}, {what}, kept={self.kept}, "
                f"peer_shut_wr={self.peer_shut_wr}, self_shut_wr={self.self_shut_wr})")

    @property
    def nbytes(self) -> int:
        if self.kind == STREAM:
            return len(self.data)
        return sum(len(m) for m in self.messages)

    @property
    def count(self) -> int:
        """Bytes for a stream, messages for the message kinds."""
        return len(self.data) if self.kind == STREAM else len(self.messages)

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "data": base64.b64encode(self.data).decode("ascii"),
            "messages": [base64.b64encode(m).decode("ascii") for m in self.messages],
            "peer_shut_wr": self.peer_shut_wr,
            "self_shut_wr": self.self_shut_wr,
            "kept": self.kept,
        }

    @classmethod
    def from_json(cls, obj: dict) -> Drained:
        try:
            kind = obj["kind"]
            if kind not in (STREAM, MESSAGE):
                raise ValueError(f"unknown kind {kind!r}")
            return cls(
                kind=kind,
                data=base64.b64decode(obj.get("data", ""), validate=True),
                messages=[base64.b64decode(m, validate=True) for m in obj.get("messages", [])],
                peer_shut_wr=bool(obj.get("peer_shut_wr", False)),
                self_shut_wr=bool(obj.get("self_shut_wr", False)),
                kept=int(obj.get("kept", 0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a drained-connection record: {exc}") from None


# --- one socket, non-blocking, on the running loop ---------------------------

def _kind(sock: socket.socket) -> str:
    if sock.fileno() < 0:
        raise DrainError("socket is closed")
    stype = sock.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE)
    if stype == socket.SOCK_STREAM:
        return STREAM
    if stype in (socket.SOCK_SEQPACKET, socket.SOCK_DGRAM):
        return MESSAGE
    raise DrainError(f"cannot drain a socket of type {stype}")


class _End:
    """The socket made non-blocking for the duration, plus await helpers."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.kind = _kind(sock)
        stype = sock.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE)
        self.seqpacket = stype == socket.SOCK_SEQPACKET
        self.udp = stype == socket.SOCK_DGRAM and sock.family in (socket.AF_INET, socket.AF_INET6)
        self._timeout = sock.gettimeout()
        self._blocking = os.get_blocking(self.fd)
        self._buf = bytearray(0)
        self._one = bytearray(1)
        self.sends = 0  # successful send calls
        sock.setblocking(False)
        self._poll = select.poll()
        self._poll.register(self.fd, select.POLLRDHUP)

    def restore(self) -> None:
        if self.sock.fileno() == self.fd:
            self.sock.settimeout(self._timeout)
            os.set_blocking(self.fd, self._blocking)

    async def readable(self) -> None:
        await wait_readable(self.fd)

    async def writable(self) -> None:
        await wait_writable(self.fd)

    def peer_shut(self) -> bool:
        """POLLRDHUP: the peer shut its write side (or we our read side)."""
        return any(ev & select.POLLRDHUP for _, ev in self._poll.poll(0))

    def inq(self) -> int:
        """FIONREAD: stream and SOCK_SEQPACKET: all queued bytes; SOCK_DGRAM
        (AF_UNIX, UDP): the length of the next datagram."""
        n = array.array("i", [0])
        fcntl.ioctl(self.fd, termios.FIONREAD, n)
        return n[0]

    def scratch(self, size: int) -> memoryview:
        if len(self._buf) < size:
            self._buf = bytearray(max(size, 2 * len(self._buf)))
        return memoryview(self._buf)[:size]

    # stream
    async def send_all(self, data) -> None:
        view = memoryview(data).cast("B")
        while view:
            try:
                n = self.sock.send(view, socket.MSG_NOSIGNAL)
            except (BlockingIOError, InterruptedError):
                await self.writable()
                continue
            view = view[n:]
            self.sends += 1

    async def recv_exact(self, n: int) -> bytes:
        """Exactly n bytes, never more."""
        data = await recv_exactly_async(self.sock, n)
        if len(data) < n:
            raise DrainError(f"connection closed with {n - len(data)} bytes "
                             "of a refill request missing")
        return data

    def peek_stream(self) -> bytes:
        n = self.inq()
        if n <= 0:
            return b""
        view = self.scratch(n)
        got = self.sock.recv_into(view, n, socket.MSG_PEEK)
        if got != n:
            raise DrainError(f"could copy only {got} of the {n} bytes queued before the peer's EOF")
        return bytes(view)

    # messages
    async def send_message(self, msg: bytes) -> None:
        while True:
            try:
                self.sock.send(msg, socket.MSG_NOSIGNAL)
                self.sends += 1
                return
            except (BlockingIOError, InterruptedError):
                await self.writable()

    def recv_message(self) -> bytes:
        """One whole message; BlockingIOError when none is queued.  Its
        length comes first from a 1-byte MSG_PEEK|MSG_TRUNC read (AF_UNIX
        and UDP return the real length), so nothing is truncated."""
        size = self.sock.recv_into(self._one, 1, socket.MSG_PEEK | socket.MSG_TRUNC)
        view = self.scratch(max(size, 1))
        n = self.sock.recv_into(view, len(view))
        return bytes(view[:n])

    async def recv_message_async(self) -> bytes:
        while True:
            try:
                return self.recv_message()
            except (BlockingIOError, InterruptedError):
                await self.readable()

    def peek_messages(self) -> list[bytes]:
        """Copies of the queued SOCK_SEQPACKET messages, left in the queue."""
        total = self.inq()
        if total <= 0:
            return []
        return [msg for msg, _ in peek_queue(self.sock, total, total=total)]


async def concurrently(*aws: Awaitable):
    """Run all; the first failure cancels the others and is raised."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            if not task.done():
                task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _call(fn: Callable, *args):
    """Call a relay function, sync or async."""
    result = fn(*args)
    if inspect.isawaitable(result):
        result = await result
    return result


def _describe(exc: OSError) -> str:
    return os.strerror(exc.errno) if exc.errno else str(exc)


@contextlib.asynccontextmanager
async def _working_on(sock: socket.socket, timeout: float, what: str, too_late: str):
    """The socket as an _End for at most ``timeout`` seconds, restored
    after; the one place where running out of time and OSError become
    DrainError (``too_late``, or ``what: the error``)."""
    end = _End(sock)
    try:
        async with asyncio.timeout(timeout):
            yield end
    except TimeoutError:
        raise DrainError(too_late) from None
    except OSError as exc:
        raise DrainError(f"{what}: {_describe(exc)}") from exc
    finally:
        end.restore()


# --- drain --------------------------------------------------------------------

async def drain(sock: socket.socket, cookie: bytes, timeout: float) -> Drained:
    """Write ``cookie`` behind the application's data and read everything in
    flight toward this end, up to the peer's cookie or EOF.  Both ends get
    the same cookie and run concurrently.  Raises DrainError on timeout or
    when the connection is reset."""
    if not cookie:
        raise ValueError("the cookie must not be empty")
    async with _working_on(sock, timeout, "drain",
                           f"drain: the peer's cookie did not arrive within {timeout:g} s") as end:
        out = Drained(end.kind)
        receive = _drain_stream(end, cookie, out) if end.kind == STREAM \
            else _drain_messages(end, cookie, out)
        out.self_shut_wr, _ = await concurrently(_send_cookie(end, cookie), receive)
    return out


async def _send_cookie(end: _End, cookie: bytes) -> bool:
    """Returns self_shut_wr."""
    try:
        if end.kind == STREAM:
            await end.send_all(cookie)
        else:
            await end.send_message(cookie)
    except OSError as exc:
        if exc.errno in _SHUT_ERRNOS:
            return True
        raise
    return False


async def _drain_stream(end: _End, cookie: bytes, out: Drained) -> None:
    got = bytearray()
    scratch = end.scratch(_CHUNK)
    n = len(cookie)
    while True:
        if end.peer_shut():
            # every byte the peer will ever send is queued: copy, keep
            rest = end.peek_stream()
            got += rest
            out.kept = len(rest)
            out.peer_shut_wr = True
            break
        try:
            k = end.sock.recv_into(scratch, _CHUNK)
        except (BlockingIOError, InterruptedError):
            await end.readable()
            continue
        if k == 0:  # the FIN came between the poll and the read
            out.peer_shut_wr = True
            break
        got += scratch[:k]
        if len(got) >= n and got[-n:] == cookie:
            del got[-n:]
            break
    out.data = bytes(got)


async def _drain_messages(end: _End, cookie: bytes, out: Drained) -> None:
    while True:
        if end.seqpacket and end.peer_shut():
            rest = end.peek_messages()
            out.messages.extend(rest)
            out.kept = len(rest)
            out.peer_shut_wr = True
            return
        try:
            msg = end.recv_message()
        except (BlockingIOError, InterruptedError):
            await end.readable()
            continue
        if msg == cookie:
            return
        if not msg and end.seqpacket and end.peer_shut() and end.inq() == 0:
            out.peer_shut_wr = True  # EOF (or a last zero-length message)
            return
        out.messages.append(msg)


# --- refill -------------------------------------------------------------------

@mutable_record
class _Request:
    payload: bytes | list[bytes]
    kept: int


async def refill(sock: socket.socket, mine: Drained, timeout: float, *,
                 relay_send: Callable[[bytes], Awaitable[None] | None] | None = None,
                 relay_recv: Callable[[], Awaitable[bytes] | bytes] | None = None,
                 shut_after: bool = False) -> None:
    """Put ``mine`` (what was in flight toward this end) back into this
    end's receive queue by having the peer write it again, and write the
    peer's in-flight data back to it; both ends call this concurrently.

    ``relay_send(blob)`` is needed when ``mine.self_shut_wr`` (our request
    cannot go on the socket), ``relay_recv() -> blob`` when
    ``mine.peer_shut_wr``; they carry one opaque bytes object from this end
    to the peer's ``relay_recv`` (sync or async callables).
    ``shut_after``: shutdown(SHUT_WR) once done; after a restart the caller
    must pass it for an end whose write side was shut at checkpoint time (on
    a fresh socket it is open).  On fresh sockets the caller may as well
    clear ``self_shut_wr``, ``peer_shut_wr`` and ``kept`` in both records
    (both write sides are open, nothing sits in a queue): no relay is then
    needed, and ``shut_after`` alone restores the EOF.  On the original
    socket such an end needs nothing: its write side is still shut, and the
    EOF its peer saw is still queued there.  Raises DrainError on timeout, reset, protocol errors, or
    when in-flight bytes cannot be written back (see the module docstring)."""
    kind = _kind(sock)
    if mine.kind != kind:
        raise ValueError(f"a {mine.kind} record cannot refill a {kind} socket")
    if mine.self_shut_wr and relay_send is None:
        raise ValueError("our write side is shut: relay_send is needed")
    if mine.peer_shut_wr and relay_recv is None:
        raise ValueError("the peer's write side is shut: relay_recv is needed")
    async with _working_on(sock, timeout, "refill",
                           f"refill did not finish within {timeout:g} s") as end:
        if end.udp:
            _ensure_buffer(end.sock, socket.SO_RCVBUF, _SO_RCVBUFFORCE,
                           _memory(mine.kind, mine.messages))
        base = _outq(end)  # what the peer kept in its queue stays counted
        if mine.self_shut_wr:
            send = _call(relay_send, _encode(mine))
        else:
            send = _send_request(end, mine)
        if mine.peer_shut_wr:
            receive = _relayed_request(end.kind, relay_recv)
        else:
            receive = _recv_request(end)
        # the echo starts only when our request is completely written
        _, peer = await concurrently(send, receive)
        lost = await _echo(end, peer, base)
        if shut_after:
            sock.shutdown(socket.SHUT_WR)
    if lost:
        unit = "bytes" if kind == STREAM else "messages"
        raise DrainError(
            f"refill: {lost} {unit} in flight toward the peer cannot be written back: "
            "our write side is shut (on a restart, refill the fresh socket instead)")


def _header(kind: str, count: int, kept: int) -> bytes:
    return _HEADER.pack(_STREAM_MAGIC if kind == STREAM else _MESSAGE_MAGIC, count, kept)


def _parse_header(kind: str, raw: bytes) -> tuple[int, int]:
    if len(raw) != _HEADER.size:
        raise DrainError(f"refill: expected a {_HEADER.size}-byte request header, got {len(raw)} bytes")
    magic, count, kept = _HEADER.unpack(raw)
    if magic != (_STREAM_MAGIC if kind == STREAM else _MESSAGE_MAGIC):
        raise DrainError(f"refill: not a {kind} refill request (got {raw[:8]!r})")
    if kept > count:
        raise DrainError("refill: corrupt request header")
    return count, kept


def _encode(mine: Drained) -> bytes:
    """A request as one blob, for the relay."""
    head = _header(mine.kind, mine.count, mine.kept)
    if mine.kind == STREAM:
        return head + mine.data
    return head + b"".join(_LEN.pack(len(m)) + m for m in mine.messages)


def _decode(kind: str, blob: bytes) -> _Request:
    count, kept = _parse_header(kind, blob[:_HEADER.size])
    body = memoryview(blob)[_HEADER.size:]
    if kind == STREAM:
        if len(body) != count:
            raise DrainError(f"refill: relayed request holds {len(body)} bytes, header says {count}")
        return _Request(bytes(body), kept)
    msgs, pos = [], 0
    for _ in range(count):
        if pos + _LEN.size > len(body):
            raise DrainError("refill: relayed request truncated")
        (n,) = _LEN.unpack_from(body, pos)
        pos += _LEN.size
        if pos + n > len(body):
            raise DrainError("refill: relayed request truncated")
        msgs.append(bytes(body[pos:pos + n]))
        pos += n
    if pos != len(body):
        raise DrainError("refill: relayed request has trailing bytes")
    return _Request(msgs, kept)


async def _relayed_request(kind: str, relay_recv) -> _Request:
    blob = await _call(relay_recv)
    return _decode(kind, bytes(blob))


async def _send_request(end: _End, mine: Drained) -> None:
    head = _header(mine.kind, mine.count, mine.kept)
    if end.kind == STREAM:
        await end.send_all(head)
        await end.send_all(mine.data)
    else:
        await end.send_message(head)
        for msg in mine.messages:
            await end.send_message(msg)


async def _recv_request(end: _End) -> _Request:
    if end.kind == STREAM:
        count, kept = _parse_header(STREAM, await end.recv_exact(_HEADER.size))
        return _Request(await end.recv_exact(count), kept)
    count, kept = _parse_header(MESSAGE, await end.recv_message_async())
    return _Request([await end.recv_message_async() for _ in range(count)], kept)


def _memory(kind: str, payload) -> int:
    """Kernel memory that payload takes when queued, generously."""
    if kind == STREAM:
        return len(payload) + len(payload) // 4 + _SLACK
    return sum(len(m) + _MSG_OVERHEAD for m in payload) + _SLACK


def _ensure_buffer(sock: socket.socket, opt: int, force: int, need: int) -> None:
    """Raise a buffer to ``need`` bytes (the kernel doubles the value it is
    given for its bookkeeping) when it is smaller, and only then.  The
    *FORCE option needs CAP_NET_ADMIN; without it, the plain option, which
    the sysctl net.core.[wr]mem_max caps, is the best we can do."""
    if sock.getsockopt(socket.SOL_SOCKET, opt) >= need:
        return
    need = min(need, _INT_MAX // 2)
    try:
        sock.setsockopt(socket.SOL_SOCKET, force, need)
    except PermissionError:
        sock.setsockopt(socket.SOL_SOCKET, opt, need)


def _outq(end: _End) -> int:
    """SIOCOUTQ: bytes we sent that the peer has not consumed (Unix; what
    the peer kept in its queue counts too) or not acknowledged (TCP)."""
    outq = array.array("i", [0])
    try:
        fcntl.ioctl(end.sock.fileno(), termios.TIOCOUTQ, outq, True)
    except OSError:
        return 0  # UDP and others: nothing to wait for
    return outq[0]


async def _outq_down_to(end: _End, base: int) -> None:
    """Until the peer took our request: the queue back where it was."""
    pause = 0.0005
    while _outq(end) > base:
        await asyncio.sleep(pause)
        pause = min(pause * 2, 0.02)


async def _echo(end: _End, peer: _Request, base: int) -> int:
    """Write the peer's payload back.  Returns how many bytes/messages could
    not be written because our write side is shut and the peer did not keep
    them in its queue."""
    if not peer.payload:
        return 0
    # Nobody reads the echo before the program runs again, so it must fit
    # in the send buffer at once: once a send says EAGAIN, a Unix socket is
    # writable again only when 3/4 of its buffer drained (unix_writable),
    # which never happens here.  So first wait until the peer took our
    # request out of the same buffer, then size the buffer for the echo.
    await _outq_down_to(end, base)
    _ensure_buffer(end.sock, socket.SO_SNDBUF, _SO_SNDBUFFORCE,
                   base + _memory(end.kind, peer.payload))
    before = end.sends
    try:
        if end.kind == STREAM:
            await end.send_all(peer.payload)
        else:
            for msg in peer.payload:
                await end.send_message(msg)
    except OSError as exc:
        # a shut write side fails the first send, before anything is written
        if exc.errno in _SHUT_ERRNOS and end.sends == before:
            return len(peer.payload) - peer.kept
        raise
    return 0
