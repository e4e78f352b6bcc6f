"""The agent's connection to its coordinator: join, messages in and out.

Thin: it frames and unframes typed messages and turns a connection that
cannot be had into one clear UserError.  What the messages mean is the
machine's.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

from dmtcp_py.client import refusal
from dmtcp_py.errors import UserError
from dmtcp_py.protocol import codec, messages

log = logging.getLogger("agent")

JOIN_TIMEOUT = 10.0


class _Inbox(asyncio.Protocol):
    """What the coordinator sent, in order, until it is read; then the
    link's end.  asyncio's StreamReader raised a reset before the bytes
    that came ahead of it: a coordinator killed with our last heartbeat
    unread (its kernel then resets the connection) took its last messages
    with it, such as the GenerationDone of the round it had just ended
    (seen in CI: the agent rejoined the next coordinator a generation
    behind)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._received = bytearray()
        self._ended = False
        self._error: Exception | None = None
        self._waiter: asyncio.Future | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._received += data
        self._wake()

    def eof_received(self) -> bool:
        self._ended = True
        self._wake()
        return False  # (the transport closes)

    def connection_lost(self, exc: Exception | None) -> None:
        self._ended, self._error = True, exc
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def take(self) -> bytes:
        """The bytes received since the last take; b"" at the end (after
        every byte that came before it), or the error that ended the link."""
        while not self._received:
            if self._ended:
                if self._error is not None:
                    raise self._error
                return b""
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        data = bytes(self._received)
        self._received.clear()
        return data


class CoordinatorLink:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._inbox: _Inbox | None = None
        self._messages = messages.Reader()
        self.last_heard = time.monotonic()  # when the coordinator last sent anything

    @property
    def where(self) -> str:
        return f"{self.host}:{self.port}"

    async def join(self, hello: messages.Hello) -> messages.Welcome:
        """Connect and say hello; the welcome, or UserError saying why not."""
        try:
            _, self._inbox = await asyncio.get_running_loop().create_connection(
                _Inbox, self.host, self.port)
        except OSError as exc:
            raise UserError(f"no coordinator at {self.where} ({exc.strerror or exc})") from None
        self._messages = messages.Reader()
        self.send(hello)
        try:
            reply = await asyncio.wait_for(self.receive(), JOIN_TIMEOUT)
        except asyncio.TimeoutError:
            self.close()
            raise UserError(f"{self.where} did not answer as a dmtcp coordinator "
                            f"within {JOIN_TIMEOUT:g} s") from None
        except (codec.FrameError, messages.MessageError) as exc:
            self.close()
            raise UserError(f"{self.where} is not a dmtcp coordinator ({exc})") from None
        if reply is None:
            raise UserError(f"coordinator at {self.where} closed the connection")
        if isinstance(reply, messages.Refused):
            self.close()
            raise UserError(refusal(self.host, self.port, reply))
        if not isinstance(reply, messages.Welcome):
            self.close()
            raise UserError(f"{self.where} is not a dmtcp coordinator "
                            f"(it answered {reply.TYPE!r})")
        return reply

    @property
    def local_ip(self) -> str:
        """Our address on the coordinator's network: where peers reach us."""
        transport = self._transport()
        return transport.get_extra_info("sockname")[0] if transport else "127.0.0.1"

    async def receive(self) -> messages.Message | None:
        """The next message; None once the coordinator closed the link.
        FrameError or MessageError: the peer is not a coordinator of ours."""
        assert self._inbox is not None
        while (message := self._messages.pop()) is None:
            data = await self._inbox.take()
            if not data:
                return None
            self.last_heard = time.monotonic()
            self._messages.push(data)
        return message

    async def __aiter__(self) -> AsyncIterator[messages.Message]:
        """Messages until the link ends (closed, broken or garbled)."""
        try:
            while (msg := await self.receive()) is not None:
                yield msg
        except (codec.FrameError, messages.MessageError, ConnectionError) as exc:
            log.error("coordinator link broken: %s", exc)

    def _transport(self) -> asyncio.Transport | None:
        return self._inbox.transport if self._inbox is not None else None

    def send(self, message: messages.Message) -> None:
        transport = self._transport()
        if transport is not None and not transport.is_closing():
            transport.write(messages.encode(message))

    def close(self) -> None:
        transport = self._transport()
        if transport is not None:
            transport.close()
