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


class CoordinatorLink:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._messages = messages.Reader()
        self.last_heard = time.monotonic()  # when the coordinator last sent anything

    @property
    def where(self) -> str:
        return f"{self.host}:{self.port}"

    async def join(self, hello: messages.Hello) -> messages.Welcome:
        """Connect and say hello; the welcome, or UserError saying why not."""
        try:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
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
        return self._writer.get_extra_info("sockname")[0] if self._writer else "127.0.0.1"

    async def receive(self) -> messages.Message | None:
        """The next message; None once the coordinator closed the link.
        FrameError or MessageError: the peer is not a coordinator of ours."""
        assert self._reader is not None
        while (message := self._messages.pop()) is None:
            data = await self._reader.read(65536)
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

    def send(self, message: messages.Message) -> None:
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(messages.encode(message))

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
