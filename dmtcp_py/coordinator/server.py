"""The coordinator's asyncio adapter: sockets in, machine, actions out."""
from __future__ import annotations

import asyncio
import hmac
import logging
import time
from pathlib import Path

from dmtcp_py.coordinator import restart_script
from dmtcp_py.coordinator.machine import (
    CoordinatorMachine,
    GenerationComplete,
    Notice,
    ReplyClient,
    SendAgent,
    Shutdown,
)
from dmtcp_py.protocol import codec, messages

log = logging.getLogger("coordinator")
HELLO_TIMEOUT = 10.0


class CoordinatorServer:
    def __init__(self, machine: CoordinatorMachine, token: str, *, host: str, port: int,
                 ckptdir: Path | None, quiet: bool = False) -> None:
        self.machine = machine
        self.token = token
        self.host = host
        self.port = port
        self.ckptdir = ckptdir
        self.quiet = quiet
        self.shutdown = asyncio.Event()
        self._writers: dict[int, asyncio.StreamWriter] = {}
        self._ids = 0
        self._server: asyncio.base_events.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def run_until_shutdown(self) -> None:
        ticker = asyncio.create_task(self._tick())
        try:
            await self.shutdown.wait()
        finally:
            ticker.cancel()
            if self._server:
                self._server.close()
            for writer in self._writers.values():
                writer.close()

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            self.apply(self.machine.tick(time.monotonic()))

    # ---- connections -------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._ids += 1
        conn_id = self._ids
        decoder = codec.Decoder()
        pending: list[dict] = []
        role = None
        try:
            hello = await asyncio.wait_for(self._next(reader, decoder, pending), HELLO_TIMEOUT)
            if hello is None or hello["type"] != "hello":
                return
            if not hmac.compare_digest(hello["token"].encode(), self.token.encode()):
                writer.write(codec.encode(messages.make("refused", error="wrong computation token")))
                log.warning("connection %d refused: wrong token", conn_id)
                return
            role = hello["role"]
            self._writers[conn_id] = writer
            if role == "agent":
                self.apply(self.machine.agent_joined(conn_id, hello, time.monotonic()))
                if conn_id not in self.machine.agents:
                    return  # refused
            else:
                writer.write(codec.encode(messages.make(
                    "welcome", comp_id=self.machine.comp_id, agent_id=conn_id)))
            while True:
                msg = await self._next(reader, decoder, pending)
                if msg is None:
                    return
                if role == "agent":
                    self.apply(self.machine.agent_message(conn_id, msg, time.monotonic()))
                else:
                    self._command(conn_id, msg)
        except (codec.FrameError, messages.MessageError) as exc:
            log.warning("connection %d closed: %s", conn_id, exc)
        except (asyncio.TimeoutError, ConnectionError, OSError):
            pass
        finally:
            self._writers.pop(conn_id, None)
            if role == "agent":
                self.apply(self.machine.agent_left(conn_id, time.monotonic()))
            writer.close()

    @staticmethod
    async def _next(reader, decoder, pending) -> dict | None:
        while not pending:
            data = await reader.read(65536)
            if not data:
                return None
            pending.extend(decoder.feed(data))
        return messages.validate(pending.pop(0))

    def _command(self, client_id: int, msg: dict) -> None:
        now = time.monotonic()
        cmd = msg["cmd"]
        m = self.machine
        if cmd == "status":
            self.apply([ReplyClient(client_id, messages.make("reply", ok=True, **m.status()))])
        elif cmd == "list":
            self.apply([ReplyClient(client_id, messages.make(
                "reply", ok=True, trees=m.listing(), **m.status()))])
        elif cmd == "checkpoint":
            self.apply(m.request_checkpoint(client_id, now, blocking=bool(msg.get("blocking")),
                                            stop=bool(msg.get("stop"))))
        elif cmd == "kill":
            self.apply(m.kill(client_id))
        elif cmd == "quit":
            self.apply(m.quit(client_id))
        elif cmd == "interval":
            self.apply(m.set_interval(client_id, float(msg.get("seconds", 0)), now))

    # ---- actions -------------------------------------------------------------

    def apply(self, actions: list) -> None:
        frames: dict[int, bytes] = {}  # id(message) -> frame: a broadcast is encoded once
        for action in actions:
            if isinstance(action, (SendAgent, ReplyClient)):
                target = action.agent_id if isinstance(action, SendAgent) else action.client_id
                writer = self._writers.get(target)
                if writer is not None and not writer.is_closing():
                    writer.write(self._frame(frames, action.message))
            elif isinstance(action, GenerationComplete):
                self._write_restart_script(action)
            elif isinstance(action, Notice):
                self.notice(action.text)
            elif isinstance(action, Shutdown):
                self.notice(f"exiting: {action.reason}")
                self.shutdown.set()

    @staticmethod
    def _frame(frames: dict[int, bytes], message: dict) -> bytes:
        """The machine sends one message object to every agent of a barrier;
        the actions list keeps each object alive, so its id is a safe key."""
        frame = frames.get(id(message))
        if frame is None:
            frame = frames[id(message)] = codec.encode(message)
        return frame

    def notice(self, text: str) -> None:
        log.info("%s", text)
        if not self.quiet:
            print(f"[dmtcp-coordinator] {text}", flush=True)

    def _write_restart_script(self, done: GenerationComplete) -> None:
        try:
            paths = restart_script.write(done.images, comp_id=self.machine.comp_id,
                                         generation=done.generation, coord_host=self.host,
                                         coord_port=self.port, ckptdir=self.ckptdir)
            for path in paths:
                log.info("wrote %s", path)
        except OSError as exc:
            self.notice(f"could not write the restart script: {exc}")
