"""The agent's end of the shim link: one Unix stream connection per process.

Mirrors hijack/include/dmtcp_record.h.  The listening socket lives in the
abstract namespace under a name that is fixed for the tree, so the shims of
a restored tree find the new agent on any host.
"""
from __future__ import annotations

import asyncio
import logging
import socket
import struct
from dataclasses import dataclass, field
from typing import Callable

log = logging.getLogger("agent.shimlink")

RECORD = struct.Struct("=IHHiiQ")
MAGIC = 0x444D5443
VERSION = 1
HELLO, SUSPEND, SUSPENDED, CHECKPOINT, READY, RESUME, RESUMED, ELECT, ELECTED = range(1, 10)


def pack(type_: int, arg: int = 0) -> bytes:
    return RECORD.pack(MAGIC, VERSION, type_, 0, 0, arg)


@dataclass(eq=False)
class Shim:
    pid: int  # as the agent sees it (SO_PEERCRED)
    writer: asyncio.StreamWriter
    replies: asyncio.Queue = field(default_factory=asyncio.Queue)


class ShimLink:
    def __init__(self, name: str, on_change: Callable[[], None] = lambda: None) -> None:
        self.name = name
        self.shims: set[Shim] = set()
        self._on_change = on_change
        self._server: asyncio.base_events.Server | None = None
        self._changed = asyncio.Event()
        # False from SUSPENDED until RUNNING: a shim that says hello while
        # still suspended outside that window is owed a RESUME at once
        self.running = True

    @property
    def address(self) -> str:
        """The value of DMTCP_AGENT_SOCK for the shims."""
        return "@" + self.name

    async def listen(self) -> None:
        self._server = await asyncio.start_unix_server(self._serve, path="\0" + self.name)

    def stop_listening(self) -> None:
        """Free the name at once: a shim that tries to reconnect during the
        dump must fail, or CRIU would meet a socket that leads outside."""
        if self._server is not None:
            self._server.close()
            self._server = None

    def pids(self) -> list[int]:
        return sorted(s.pid for s in self.shims)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        pid, _uid, _gid = struct.unpack("3i", sock.getsockopt(
            socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        shim = Shim(pid, writer)
        try:
            while True:
                magic, version, type_, _p, _pp, arg = RECORD.unpack(
                    await reader.readexactly(RECORD.size))
                if magic != MAGIC or version != VERSION:
                    log.warning("pid %d sent a foreign record; dropping it", pid)
                    return
                if type_ == HELLO:
                    self.shims.add(shim)
                    self._notify()
                    if arg and self.running:
                        log.warning("pid %d came back suspended after the checkpoint; resuming it", pid)
                        writer.write(pack(RESUME))
                else:
                    if type_ == SUSPENDED and arg:
                        log.warning("pid %d: %d threads would not stop", pid, arg)
                    shim.replies.put_nowait(type_)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            shim.replies.put_nowait(None)
            if shim in self.shims:
                self.shims.discard(shim)
                self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._on_change()

    async def _ask(self, shim: Shim, request: int, answer: int, *, then_eof: bool) -> bool:
        try:
            shim.writer.write(pack(request))
            await shim.writer.drain()
        except ConnectionError:
            return False
        got = await shim.replies.get()
        while got is not None and got != answer:  # a stale answer (see running)
            got = await shim.replies.get()
        if got is None:
            return False
        if then_eof:
            while await shim.replies.get() is not None:
                pass
        return True

    async def request_all(self, request: int, answer: int, timeout: float,
                          *, then_eof: bool = False) -> list[int]:
        """Ask every connected shim; return the pids that did not answer.
        A process that exits meanwhile is simply gone, not a failure."""
        shims = list(self.shims)
        if not shims:
            return []
        tasks = [asyncio.ensure_future(self._ask(s, request, answer, then_eof=then_eof))
                 for s in shims]
        done, pending = await asyncio.wait(tasks, timeout=timeout)
        for task in pending:
            task.cancel()
        return [s.pid for s, t in zip(shims, tasks)
                if t in pending and s in self.shims]

    async def park_all(self, timeout: float) -> list[int]:
        """CHECKPOINT: every shim answers READY and closes its connection."""
        return await self.request_all(CHECKPOINT, READY, timeout, then_eof=True)

    async def wait_for(self, pids: set[int], timeout: float) -> set[int]:
        """Wait until every pid in pids has (re)connected; return the missing."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            missing = pids - {s.pid for s in self.shims}
            remaining = deadline - loop.time()
            if not missing or remaining <= 0:
                return missing
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except asyncio.TimeoutError:
                pass
