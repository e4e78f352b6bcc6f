"""The coordinator's asyncio adapter: sockets in, machine, actions out."""
from __future__ import annotations

import asyncio
import logging
import socket
import time
from pathlib import Path

from dmtcp_py.coordinator import restart_script, restarter
from dmtcp_py.coordinator.machine import (
    CloseAgent,
    CoordinatorMachine,
    GenerationComplete,
    Notice,
    ReplyClient,
    MoveTrees,
    RestartGeneration,
    SendAgent,
    Shutdown,
)
from dmtcp_py.protocol import codec, messages
from dmtcp_py.protocol.messages import Cmd, Command, Hello, Message, Refused, Reply, Role
from dmtcp_py.tokens import same_token

log = logging.getLogger("coordinator")
HELLO_TIMEOUT = 10.0
TICK = 0.5            # the machine's clock, at most this far apart
TICKS_PER_BEAT = 4    # and at least this often per heartbeat


class CoordinatorServer:
    def __init__(self, machine: CoordinatorMachine, token: str, *, host: str, port: int,
                 ckptdir: Path | None, quiet: bool = False,
                 listener: socket.socket | None = None) -> None:
        """listener: a socket bound and listening already (the port is then its)."""
        self.machine = machine
        self.token = token
        self.host = host
        self.port = port
        self.ckptdir = ckptdir
        self.quiet = quiet
        self.shutdown = asyncio.Event()
        self._conns: dict[int, _Connection] = {}
        self._ids = 0
        self._server: asyncio.base_events.Server | None = None
        self._restarts: set[asyncio.Task] = set()  # recovery commands running
        self._listener = listener

    async def start(self) -> int:
        loop = asyncio.get_running_loop()
        if self._listener is not None:
            self._server = await loop.create_server(self.connection, sock=self._listener)
        else:
            self._server = await loop.create_server(self.connection, self.host, self.port)
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
            for conn in list(self._conns.values()):
                conn.close()

    async def _tick(self) -> None:
        beat = self.machine.policy.heartbeat
        period = min(TICK, beat / TICKS_PER_BEAT) if beat > 0 else TICK
        while True:
            await asyncio.sleep(period)
            self.apply(self.machine.tick(time.monotonic()))

    # ---- connections -------------------------------------------------------

    def connection(self) -> _Connection:
        self._ids += 1
        return _Connection(self, self._ids)

    def handle(self, conn: _Connection, msg: Message) -> None:
        if conn.role is None:
            self._hello(conn, msg)
        elif conn.role is Role.AGENT:
            self.apply(self.machine.agent_message(conn.conn_id, msg, time.monotonic()))
        elif isinstance(msg, Command):
            self._command(conn.conn_id, msg)
        else:
            conn.close(f"{msg.TYPE!r} from a client")

    def _hello(self, conn: _Connection, hello: Message) -> None:
        if not isinstance(hello, Hello):
            conn.close(f"{hello.TYPE!r} before hello")
            return
        if not same_token(hello.token, self.token):
            conn.write(messages.encode(Refused(error=Refused.WRONG_TOKEN)))
            conn.close("wrong token")
            return
        conn.role = hello.role
        self._conns[conn.conn_id] = conn
        if conn.role is Role.AGENT:
            self.apply(self.machine.agent_joined(conn.conn_id, hello, time.monotonic()))
            if conn.conn_id not in self.machine.agents:
                conn.close("refused")
        else:
            self.apply(self.machine.client_joined(conn.conn_id, hello, time.monotonic()))

    def lost(self, conn: _Connection) -> None:
        self._conns.pop(conn.conn_id, None)
        if conn.role is Role.AGENT:
            self.apply(self.machine.agent_left(conn.conn_id, time.monotonic()))
        elif conn.role is Role.CLIENT:
            self.apply(self.machine.client_gone(conn.conn_id, time.monotonic()))

    def _command(self, client_id: int, msg: Command) -> None:
        now = time.monotonic()
        m = self.machine
        match msg.cmd:
            case Cmd.STATUS:
                self.apply([ReplyClient(client_id, Reply(ok=True, body=m.status()))])
            case Cmd.LIST:
                self.apply([ReplyClient(client_id, Reply(
                    ok=True, body={"trees": m.listing(), **m.status()}))])
            case Cmd.GRAPH:
                self.apply([ReplyClient(client_id, Reply(ok=True, body=m.graph(now)))])
            case Cmd.CHECKPOINT:
                self.apply(m.request_checkpoint(client_id, now, blocking=msg.blocking,
                                                stop=msg.stop, progress=msg.progress))
            case Cmd.KILL:
                self.apply(m.kill(client_id))
            case Cmd.QUIT:
                self.apply(m.quit(client_id))
            case Cmd.INTERVAL:
                self.apply(m.set_interval(client_id, msg.seconds, now, auto=msg.auto))
            case Cmd.MIGRATE:
                self.apply(m.migrate(client_id, msg.trees, now, to=msg.to,
                                     with_group=msg.with_group))
            case Cmd.VACATE:
                self.apply(m.migrate(client_id, (), now, to=msg.to, vacate=msg.host))

    # ---- actions -------------------------------------------------------------

    def apply(self, actions: list) -> None:
        frames: dict[int, bytes] = {}  # id(message) -> frame: a broadcast is encoded once
        for action in actions:
            if isinstance(action, (SendAgent, ReplyClient)):
                target = action.agent_id if isinstance(action, SendAgent) else action.client_id
                conn = self._conns.get(target)
                if conn is not None:
                    conn.write(self._frame(frames, action.message))
            elif isinstance(action, GenerationComplete):
                self._write_restart_script(action)
            elif isinstance(action, Notice):
                self.notice(action.text)
            elif isinstance(action, CloseAgent):
                conn = self._conns.get(action.agent_id)
                if conn is not None:
                    conn.close("silent")
            elif isinstance(action, (RestartGeneration, MoveTrees)):
                self._start_restart(action)
            elif isinstance(action, Shutdown):
                self.notice(f"exiting: {action.reason}")
                self.shutdown.set()

    @staticmethod
    def _frame(frames: dict[int, bytes], message: Message) -> bytes:
        """The machine sends one message object to every agent of a barrier;
        the actions list keeps each object alive, so its id is a safe key
        (not the message itself: one holding a dict, a Reply or a Matched,
        cannot be hashed)."""
        frame = frames.get(id(message))
        if frame is None:
            frame = frames[id(message)] = messages.encode(message)
        return frame

    def _start_restart(self, action: RestartGeneration | MoveTrees) -> None:
        moving = isinstance(action, MoveTrees)

        def ended(serial: int, error: str | None) -> None:
            m, now = self.machine, time.monotonic()
            self.apply(m.migration_command_ended(serial, error, now) if moving
                       else m.restart_command_ended(serial, error, now))

        purpose = "migration" if moving else "recovery"
        self.notice(f"{purpose}: the restarted programs write to "
                    f"{restarter.output_path(self.port, purpose)}")
        task = asyncio.get_running_loop().create_task(restarter.run(
            action, comp_id=self.machine.comp_id, listen_host=self.host, port=self.port,
            token=self.token, ended=ended))
        self._restarts.add(task)
        task.add_done_callback(self._restarts.discard)

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


class _Connection(asyncio.Protocol):
    """One peer's socket: frames in through data_received (a callback, no
    task or future per read: barriers over a thousand agents are mostly
    this), messages to the server, frames out."""

    def __init__(self, server: CoordinatorServer, conn_id: int) -> None:
        self.server = server
        self.conn_id = conn_id
        self.role: Role | None = None  # set by a valid hello
        self._reader = messages.Reader()
        self._transport: asyncio.Transport | None = None
        self._hello_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        self._transport = transport
        self._hello_timer = asyncio.get_running_loop().call_later(
            HELLO_TIMEOUT, lambda: self.role is None and self.close("no hello"))

    def data_received(self, data: bytes) -> None:
        try:
            for message in self._reader.feed(data):
                if self._transport is None or self._transport.is_closing():
                    return
                self.server.handle(self, message)
        except (codec.FrameError, messages.MessageError) as exc:
            self.close(str(exc))

    def connection_lost(self, exc) -> None:
        if self._hello_timer is not None:
            self._hello_timer.cancel()
        self.server.lost(self)

    def write(self, frame: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(frame)

    def close(self, why: str | None = None) -> None:
        if why:
            log.warning("connection %d closed: %s", self.conn_id, why)
        if self._transport is not None:
            self._transport.close()
