"""One agent's part in keeping network connections alive (DESIGN.md 3-4).

At a checkpoint: the tree's network sockets are parked with the agent
(DRAINED), reported to the coordinator, which matches the two ends of each
connection under control; both ends' agents drain it (drain.py).  The
table of sockets and the drained bytes go into the image (CHECKPOINTED).
At REFILLED the drained bytes go back into the kernel buffers (refill) and
the sockets go back to their processes, on their fd numbers.

At a restart: before CRIU restores the tree, every socket is made again.
Listeners rebind their port; the two ends of each connection under control
find each other through the coordinator's names and connect (so a tree
may come back on another host, with other addresses); a connection that
led out of the computation comes back closed, with a warning naming it.
"""
from __future__ import annotations

import asyncio
import base64
import dataclasses
import errno
import json
import logging
import os
import socket
from pathlib import Path
from typing import Awaitable, Callable

from dmtcp_py import fault_injection
from dmtcp_py.agent import drain, fdtable, holding, time_wait, udp
from dmtcp_py.agent.fdtable import SocketEntry
from dmtcp_py.agent.shimlink import ShimLink
from dmtcp_py.errors import say
from dmtcp_py.images import socket_table
from dmtcp_py.images.socket_table import Connection, SocketInfo, SocketRow
from dmtcp_py.listing import address_text
from dmtcp_py.protocol import messages
from dmtcp_py.protocol.ids import endpoint_id
from dmtcp_py.sockio import recv_exactly_async

log = logging.getLogger("agent.network")

DRAIN_TIMEOUT = 30.0
CONNECT_TIMEOUT = 60.0


def _connect_timeout() -> float:
    """How long a connection's end waits for the other (CONNECT_TIMEOUT;
    tests shorten it: fault_injection.connect_timeout)."""
    return fault_injection.connect_timeout(CONNECT_TIMEOUT)


HANDSHAKE = 16  # bytes of sha256(connection id) a reconnecting end sends first


def _sha256(text: str) -> bytes:
    import hashlib  # (OpenSSL's: ~4 ms; loaded once the agent runs: runner.CHECKPOINT_MODULES)
    return hashlib.sha256(text.encode()).digest()


def _cookie(comp_id: str, conn: str, generation: int) -> bytes:
    return _sha256(f"dmtcp-drain {comp_id} {conn} {generation}")


def _tag(conn: str) -> bytes:
    return _sha256(f"dmtcp-conn {conn}")[:HANDSHAKE]


class Network:
    def __init__(self, shims: ShimLink, send: Callable[[messages.Message], None]) -> None:
        self.shims = shims
        self._send = send
        self._matched: asyncio.Future | None = None
        self._found: dict[str, asyncio.Future] = {}
        self._relays: dict[str, asyncio.Queue] = {}
        self.warnings: list[str] = []
        # the parked sockets, by inode, each with what it is (e.info,
        # fixed when parked); what the round learns of them is kept apart:
        self.entries: dict[int, SocketEntry] = {}
        self.conns: dict[int, Connection] = {}      # connections under control
        self.outside: set[int] = set()              # connections leading out of the computation
        self.peer_known: dict[int, bool] = {}       # UDP: is the peer in the computation
        self.drained: dict[int, drain.Drained] = {}
        self.datagrams: dict[int, list] = {}  # ino -> [(data, source, source key, known)]
        self.external: list[str] = []  # the outside connections, as the coordinator shows them
        self.failed_conns: list[str] = []
        # restart: ends whose write side the program had shut; shut again
        # once refilled
        self._shut_after: dict[int, bool] = {}
        self._restored = False  # the sockets are new ones (restart)
        # migration: a staying tree's sockets before they were made again
        # toward a moved tree (ino -> socket, drained, shut after), and a
        # moving tree's listeners let go so that its new copy may bind
        # their ports: both come back if the migration fails (roll_back)
        self._before_move: dict[int, tuple[socket.socket, drain.Drained | None, bool | None]] = {}
        self._released: set[int] = set()
        self._repointed: set[int] = set()
        self._move_cancelled: asyncio.Future | None = None
        # connections held while their peer moves (holding.py), by the
        # inode of the program's end; they outlive the round that made them
        self.held: dict[int, holding.Held] = {}
        self._after_refill: dict[int, bytes] = {}  # swapped: what the program wrote meanwhile

    # ---- messages from the coordinator ----------------------------------------

    def on_message(self, msg: messages.Message) -> None:
        """The coordinator's answers about connections: matches, names, relayed data."""
        if isinstance(msg, messages.Matched):
            if self._matched is not None and not self._matched.done():
                self._matched.set_result(msg)
        elif isinstance(msg, messages.Found):
            fut = self._found.get(msg.key)
            if fut is not None and not fut.done():
                fut.set_result(msg.value)
        elif isinstance(msg, messages.Relay):
            self._relay_queue(msg.conn).put_nowait(base64.b64decode(msg.data))
        elif isinstance(msg, messages.CancelMove):
            called_off = self._cancel_move()
            if not called_off.done():
                called_off.set_result(None)

    def _cancel_move(self) -> asyncio.Future:
        if self._move_cancelled is None:
            self._move_cancelled = asyncio.get_running_loop().create_future()
        return self._move_cancelled

    def _relay_queue(self, conn: str) -> asyncio.Queue:
        return self._relays.setdefault(conn, asyncio.Queue())

    async def _lookup(self, key: str, timeout: float) -> str:
        fut = self._found.setdefault(key, asyncio.get_running_loop().create_future())
        self._send(messages.Lookup(key=key))
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout)
        finally:
            self._found.pop(key, None)

    # ---- checkpoint ----------------------------------------------------------------

    async def park_and_drain(self, pids: list[int], comp_id: str, generation: int,
                             timeout: float, wanted: dict[int, list[int]] | None = None) -> None:
        """DRAINED.  Raises on failure (the checkpoint fails; RUNNING still
        hands every parked socket back).  wanted: fdtable.to_park(pids), if
        it was read since the processes stopped."""
        self.close()
        if wanted is None:
            wanted = await asyncio.get_running_loop().run_in_executor(None, fdtable.to_park,
                                                                      pids)
        await self._park(wanted, timeout)
        infos = [e.info for e in self.entries.values()]
        endpoints = [messages.Endpoint(local=i.key, peer=i.peer_key or "", udp=True)
                     for i in infos if i.is_udp]
        endpoints += [messages.Endpoint(local=i.key, peer=i.peer_key)
                      for i in infos if i.peer_key and not i.is_udp]
        self._matched = asyncio.get_running_loop().create_future()
        self._send(messages.Sockets(generation=generation, endpoints=tuple(endpoints)))
        answer: messages.Matched = await asyncio.wait_for(self._matched, timeout)
        by_key = answer.peers
        udp_known = set(answer.udp)
        for ino, e in self.entries.items():
            info = e.info
            if info.is_udp:
                self.peer_known[ino] = bool(info.peer_key) and info.peer_key in udp_known
                if e.leader:
                    self.datagrams[ino] = [
                        (data, src, key, key in udp_known)
                        for data, src, key in udp.peek_queue(e.sock, fdtable.netns_id())]
                continue
            match = by_key.get(endpoint_id(info.key, info.peer_key or ""))
            if match is not None and info.peer_key:
                self.conns[ino] = Connection(match.conn, match.side)
            elif info.peer_key and not info.listening:
                self.outside.add(ino)
                self.external.append(f"{address_text(info.local)} -> {address_text(info.peer)}")
                log.info("connection %s leads out of the computation", self.external[-1])
        jobs = {ino: drain.drain(self.entries[ino].sock,
                                 _cookie(comp_id, c.conn, generation), DRAIN_TIMEOUT)
                for ino, c in self.conns.items() if self.entries[ino].leader}
        results = await asyncio.gather(*jobs.values(), return_exceptions=True)
        self.drained = {ino: r for ino, r in zip(jobs, results) if not isinstance(r, BaseException)}
        # a connection one end could not drain is broken for this
        # checkpoint: the coordinator tells both ends to leave it alone
        self.failed_conns = sorted(self.conns[ino].conn for ino, r in zip(jobs, results)
                                   if isinstance(r, BaseException))
        if self.failed_conns:
            first = next(r for r in results if isinstance(r, BaseException))
            raise drain.DrainError(f"{len(self.failed_conns)} connections: {first}")
        total = sum(d.nbytes for d in self.drained.values())
        log.info("parked %d sockets, %d connections under control, %d bytes drained, "
                 "%d datagrams queued", len(self.entries), len(self.conns), total,
                 sum(len(d) for d in self.datagrams.values()))

    async def _park(self, wanted: dict[int, list[int]], timeout: float) -> None:
        """The named fds come to us, one entry per socket."""
        parked = await self.shims.park(wanted, timeout) if wanted else []
        # in a thread: /proc and netlink reads, off the event loop
        self.entries = await asyncio.get_running_loop().run_in_executor(
            None, fdtable.entries, parked)
        # every copy but one per socket is closed now; the entry keeps one
        keep = {id(e.sock) for e in self.entries.values()}
        for p in parked:
            if id(p.sock) not in keep:
                p.sock.close()

    def table(self, image_dir: Path) -> list[dict]:
        """The manifest's socket table (socket_table.SocketRow, as JSON);
        drained bytes and queued datagrams go to files beside it."""
        rows = []
        for ino, e in sorted(self.entries.items()):
            drained = datagrams = None
            d = self.drained.get(ino)
            if d is not None:
                drained = f"socket-{ino}.drained.json"
                _write_json(image_dir / drained, d.to_json())
            queued = self.datagrams.get(ino)
            if queued:
                datagrams = f"socket-{ino}.datagrams.json"
                _write_json(image_dir / datagrams,
                            [[base64.b64encode(data).decode(), list(src), key, known]
                             for data, src, key, known in queued])
            rows.append(SocketRow(
                info=e.info, copies=tuple(e.copies), leader=e.leader,
                connection=self.conns.get(ino), external=ino in self.outside,
                peer_known=self.peer_known.get(ino),
                drained=drained, drained_bytes=d.nbytes if d is not None else 0,
                datagrams=datagrams, datagram_count=len(queued) if queued else 0))
        return socket_table.encode(rows)

    async def refill_and_unpark(self, timeout: float, skip: frozenset[str] = frozenset()) -> None:
        """REFILLED: bytes back into the kernel, sockets back on their fds.
        Connections in skip failed to drain at one end: no refill there."""
        jobs = []
        for ino, d in self.drained.items():
            conn = self.conns[ino].conn
            if conn in skip:
                log.warning("connection %s failed to drain; %d bytes in flight are lost",
                            conn, d.nbytes)
                continue
            jobs.append(drain.refill(self.entries[ino].sock, d, DRAIN_TIMEOUT,
                                     relay_send=self._relay_sender(conn),
                                     relay_recv=self._relay_receiver(conn),
                                     shut_after=self._shut_after.get(ino, False)))
        errors = [r for r in await asyncio.gather(*jobs, return_exceptions=True)
                  if isinstance(r, BaseException)]
        if self._restored:
            try:
                await self._inject_datagrams()
            except Exception as exc:  # never keep the sockets from their processes
                errors.append(exc)
        errors += await self._send_after_refill()
        await self.unpark(timeout)
        if errors:
            raise errors[0]

    async def _send_after_refill(self) -> list[BaseException]:
        """A connection held while its peer moved: what the program wrote
        meanwhile follows the peer's refill (holding.py)."""
        loop = asyncio.get_running_loop()
        errors: list[BaseException] = []
        for ino, data in self._after_refill.items():
            sock = self.entries[ino].sock
            blocking = sock.getblocking()
            try:
                sock.setblocking(False)
                await asyncio.wait_for(loop.sock_sendall(sock, data), DRAIN_TIMEOUT)
            except (OSError, asyncio.TimeoutError) as exc:
                errors.append(exc)
            finally:
                sock.setblocking(blocking)
        self._after_refill = {}
        return errors

    async def abandon(self, timeout: float) -> None:
        """The round is over without a coordinator: bytes drained from a
        connection cannot go back (its peer re-sends them through the
        coordinator), so such a connection is shut down, never left with a
        gap in its stream; every socket goes back to its process."""
        for ino, d in self.drained.items():
            if d.nbytes:
                conn = self.conns[ino].conn if ino in self.conns else "?"
                log.warning("connection %s had %d bytes in flight that cannot go back "
                            "without the coordinator: shut down", conn, d.nbytes)
                try:
                    self.entries[ino].sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        await self.unpark(timeout)

    # ---- migration ------------------------------------------------------------------

    async def remake(self, conns: frozenset[str], reach_ip: str) -> None:
        """A staying tree in a migration: each parked connection in conns
        (its other end moves) is made again toward the moved end's new
        copy, the way a restart makes it; the drained bytes then refill
        the new socket.  The old socket is kept until the round ends.
        Raises if a connection cannot be made, or the migration is called
        off (CancelMove) while waiting."""
        self.publish_datagram_sockets(reach_ip)
        await self._repoint_datagram_sockets(conns)
        todo = {ino: c for ino, c in self.conns.items() if c.conn in conns}
        if not todo:
            return
        cancelled = self._cancel_move()
        if cancelled.done():
            raise RuntimeError("the migration was called off")
        jobs = asyncio.gather(*(self._reconnect(self.entries[ino].info, c, reach_ip)
                                for ino, c in todo.items()), return_exceptions=True)
        await asyncio.wait({jobs, cancelled}, return_when=asyncio.FIRST_COMPLETED)
        if not jobs.done():
            jobs.cancel()
            await asyncio.gather(jobs, return_exceptions=True)
            raise RuntimeError("the migration was called off")
        results = jobs.result()
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            for r in results:
                if isinstance(r, socket.socket):
                    r.close()
            raise RuntimeError(f"{len(errors)} of {len(todo)} connections to the moved trees "
                               f"could not be made again: {errors[0]}")
        for (ino, _), sock in zip(todo.items(), results):
            e = self.entries[ino]
            fdtable.set_options(sock, e.info.options)
            d = self.drained.get(ino)
            self._before_move[ino] = (e.sock, d, self._shut_after.get(ino))
            e.sock = sock
            if d is not None:
                # a fresh socket, as at a restart (recreate)
                self.drained[ino] = dataclasses.replace(d, self_shut_wr=False,
                                                        peer_shut_wr=False, kept=0)
                self._shut_after[ino] = d.self_shut_wr
        log.info("made %d connections again toward the moved trees", len(todo))

    def publish_datagram_sockets(self, reach_ip: str) -> None:
        """Where each datagram socket is: a moved tree's socket connected
        to one of ours looks it up, as at a restart."""
        for e in self.entries.values():
            if e.info.is_udp:
                self._publish_udp(e.sock, e.info, reach_ip)

    def _publish_udp(self, sock: socket.socket, info: SocketInfo, reach_ip: str) -> None:
        here = sock.getsockname()
        public = here[0] if here[0] not in ("0.0.0.0", "::") \
            else _reach(socket.AddressFamily(info.family), reach_ip)
        self._send(messages.Publish(key=f"udp:{info.key}", value=f"{public}|{here[1]}"))

    async def _repoint_datagram_sockets(self, conns: frozenset[str]) -> None:
        """Datagram sockets connected to a moving tree's socket: connected
        to its new place (roll_back points them back)."""
        for e in self.entries.values():
            info = e.info
            if not (info.is_udp and info.peer_key and f"udp:{info.peer_key}" in conns):
                continue
            where = await self._lookup_or_cancel(f"udp:{info.peer_key}")
            e.sock.connect(_mapped(where, e.sock.getsockname()[0]))
            self._repointed.add(e.info.ino)

    async def _lookup_or_cancel(self, key: str) -> str:
        cancelled = self._cancel_move()
        lookup = asyncio.ensure_future(self._lookup(key, _connect_timeout()))
        await asyncio.wait({lookup, cancelled}, return_when=asyncio.FIRST_COMPLETED)
        if not lookup.done():
            lookup.cancel()
            await asyncio.gather(lookup, return_exceptions=True)
            raise RuntimeError("the migration was called off")
        return lookup.result()

    def hold(self, conns: frozenset[str], reach_ip: str) -> bool:
        """A staying tree that may run on while its peers move: each parked
        connection in conns is held (holding.py) and made again toward the
        moved end's new copy in the background.  False, and nothing
        changed, if one of them cannot be held (the tree then waits)."""
        todo = {ino: c for ino, c in self.conns.items() if c.conn in conns}
        if not todo or any(c.startswith("udp:") for c in conns) or not all(
                holding.can_hold(self.entries[ino].info, self.drained.get(ino)) for ino in todo):
            return False
        for ino, c in todo.items():
            e = self.entries[ino]
            d = self.drained.pop(ino, None)
            a, b = holding.local_pair(e.info.family)
            try:
                fdtable.set_options(a, e.info.options)
            except OSError as exc:  # an option of the original the pair does not take
                log.debug("held connection %s: %s", c.conn, exc)
            holding.small_buffers(a, b)
            held = holding.Held(conn=c, info=e.info, old=e.sock, mine=b,
                                a_ino=holding.inode(a), inbound=d.data if d else b"")
            e.sock = a
            held.start()
            held.remade = asyncio.ensure_future(self._reconnect(e.info, c, reach_ip))
            self.held[held.a_ino] = held
        log.info("holding %d connections toward moving trees; the program runs on", len(todo))
        return True

    async def swap_park(self, pids: list[int], generation: int, comp_id: str,
                        timeout: float) -> None:
        """The program is stopped again: the ends of its held connections
        come back to us; both ends of each pair are drained here."""
        self.close()
        found = await asyncio.get_running_loop().run_in_executor(None, fdtable.tree_sockets, pids)
        wanted = {pid: sorted(fd for fd, ino in fds.items() if ino in self.held)
                  for pid, fds in found.items()}
        await self._park({pid: fds for pid, fds in wanted.items() if fds}, timeout)
        for ino in [i for i in self.held if i not in self.entries]:
            log.info("the program closed a held connection while its peer moved")
            self.held.pop(ino).close()
        await asyncio.gather(*(self.held[ino].swap_out(e.sock, _cookie(
            comp_id, self.held[ino].conn.conn, generation), DRAIN_TIMEOUT)
            for ino, e in self.entries.items()))

    async def swap_in(self, rollback: bool) -> None:
        """The new connection (or with rollback the old one) takes each
        held connection's place; the refill that follows puts back what
        the program had not read, then what it wrote."""
        held, self.held = self.held, {}
        try:
            for ino, e in self.entries.items():
                h = held[ino]
                if rollback:
                    sock, h.old = h.old, None
                else:
                    assert h.remade is not None
                    sock = await asyncio.wait_for(asyncio.shield(h.remade), _connect_timeout())
                    h.remade = None
                fdtable.set_options(sock, e.info.options)
                e.sock.close()
                e.sock = sock
                self.conns[ino] = h.conn
                self.drained[ino] = drain.Drained(drain.STREAM, data=h.unread)
                self._after_refill[ino] = bytes(h.outbound)
                holding.grow_send_buffer(sock, len(h.outbound))
        finally:
            for h in held.values():
                h.close()

    def release_listeners(self) -> None:
        """A moving tree, dumped: its listening sockets let go of their
        ports, for its new copy (which may be on this host) to bind.  (A
        Unix listener keeps its path: a restart does not bind it again.)"""
        for ino, e in self.entries.items():
            if e.info.listening and e.info.family != socket.AF_UNIX:
                e.sock.close()
                self._released.add(ino)

    def roll_back(self) -> None:
        """The migration failed: the connections made again are dropped and
        the old ones come back; released listeners listen again."""
        for ino, (sock, d, shut) in self._before_move.items():
            e = self.entries[ino]
            e.sock.close()
            e.sock = sock
            if d is not None:
                self.drained[ino] = d
            if shut is None:
                self._shut_after.pop(ino, None)
            else:
                self._shut_after[ino] = shut
        self._before_move = {}
        for ino in sorted(self._released):
            e = self.entries[ino]
            info = e.info
            sock = socket.socket(socket.AddressFamily(info.family),
                                 socket.SocketKind(info.type), info.proto)
            fdtable.set_options(sock, info.options)
            self._bind(sock, info.family, info.local)
            sock.listen(socket.SOMAXCONN)
            e.sock = sock
        self._released = set()
        for ino in sorted(self._repointed):
            e = self.entries[ino]
            if e.info.peer:
                e.sock.connect(e.info.peer)
        self._repointed = set()
        for w in self.warnings:
            log.warning("%s", w)

    def renumber(self, pids: dict[int, int]) -> None:
        """After a restore into a new PID namespace: the processes that hold
        each socket have new pids (ours), old -> new."""
        for e in self.entries.values():
            e.copies = [(pids.get(pid, pid), fd) for pid, fd in e.copies]

    async def unpark(self, timeout: float) -> None:
        by_pid: dict[int, list[tuple[int, int]]] = {}
        for e in self.entries.values():
            for pid, fd in e.copies:
                by_pid.setdefault(pid, []).append((fd, e.sock.fileno()))
        if by_pid:
            left = await self.shims.unpark(by_pid, timeout)
            for pid, n in left.items():
                if n:
                    log.warning("process %d kept %d sockets as /dev/null", pid, n)
        self.close()

    def _relay_sender(self, conn: str) -> Callable[[bytes], Awaitable[None]]:
        async def send(data: bytes) -> None:
            self._send(messages.Relay(conn=conn, data=base64.b64encode(data).decode()))
        return send

    def _relay_receiver(self, conn: str) -> Callable[[], Awaitable[bytes]]:
        async def recv() -> bytes:
            return await self._relay_queue(conn).get()
        return recv

    def holds_sockets(self) -> bool:
        """Sockets of the tree are with us (parked, or kept from before a
        move): a round must hand them back through its refill."""
        return bool(self.entries or self._before_move)

    def close(self) -> None:
        for e in self.entries.values():
            e.sock.close()
        for sock, _, _ in self._before_move.values():
            sock.close()
        self._before_move, self._released, self._repointed = {}, set(), set()
        self._after_refill = {}
        self._move_cancelled = None
        self.entries, self.conns, self.drained, self.datagrams = {}, {}, {}, {}
        self.outside, self.peer_known = set(), {}
        self.external, self.failed_conns = [], []
        self._shut_after = {}
        self._restored = False
        self._relays.clear()

    # ---- restart ------------------------------------------------------------------------

    async def recreate(self, table: list[dict], image_dir: Path, reach_ip: str) -> None:
        """Make every socket of the manifest's table again, before the tree
        is restored.  ImageError if a row is corrupt."""
        rows = socket_table.decode(table, str(image_dir / "manifest.json"))
        self.close()
        results = await asyncio.gather(*(self._recreate_one(row, image_dir, reach_ip)
                                         for row in rows), return_exceptions=True)
        self._restored = True
        for row, result in zip(rows, results):
            if isinstance(result, BaseException):
                for r in results:
                    if isinstance(r, SocketEntry):
                        r.sock.close()
                if isinstance(result, TimeoutError):  # (its text is empty)
                    why = (f"its other end did not come back within {_connect_timeout():g} s: "
                           "restart the tree it leads to too (every image of the "
                           "checkpoint, as dmtcp_restart_script.sh does)")
                else:
                    why = str(result) or type(result).__name__
                raise RuntimeError(f"connection {address_text(row.info.local)} -> "
                                   f"{address_text(row.info.peer)}: {why}")
            self.entries[row.info.ino] = result
        for w in self.warnings:
            log.warning("%s", w)
            say(f"dmtcp-restart: warning: {w}")

    async def _recreate_one(self, row: SocketRow, image_dir: Path, reach_ip: str) -> SocketEntry:
        info = row.info
        family, type_ = socket.AddressFamily(info.family), socket.SocketKind(info.type)
        ino = info.ino
        if info.is_udp:
            sock = await self._recreate_udp(row, image_dir, reach_ip)
        elif row.connection is not None:
            sock = await self._reconnect(info, row.connection, reach_ip)
            if row.drained:
                d = drain.Drained.from_json(json.loads((image_dir / row.drained).read_text()))
                # a fresh socket: both write sides are open, nothing was kept
                # in a queue; the end the program had shut is shut again
                # once refilled, so its peer reads the EOF after the data
                self.drained[ino] = dataclasses.replace(d, self_shut_wr=False, peer_shut_wr=False,
                                                        kept=0)
                self._shut_after[ino] = d.self_shut_wr
            self.conns[ino] = row.connection
        elif info.listening or not info.peer:
            sock = socket.socket(family, type_, info.proto)
            fdtable.set_options(sock, info.options)
            if info.local and family != socket.AF_UNIX:
                self._bind(sock, family, info.local)
            if info.listening:
                sock.listen(socket.SOMAXCONN)
        else:
            sock = _closed_connection(family, type_)
            self.warnings.append(f"connection {address_text(info.local)} -> "
                                 f"{address_text(info.peer)} "
                                 "led out of the computation; it comes back closed")
        fdtable.set_options(sock, info.options)
        return SocketEntry(ino, sock, info, list(row.copies), row.leader)

    def _bind(self, sock: socket.socket, family: int, local: tuple[str, int]) -> None:
        """The old port, on this host's equivalent of the old address; when
        it is taken (trees that used one port on their own hosts, now on
        one host), another port, with a warning.  A TCP port that only the
        killed tree's connections in TIME_WAIT hold is taken back."""
        where = _local_address(family, local)
        if _bound(sock, where) or (sock.type == socket.SOCK_STREAM and time_wait.end(
                family, where[0], where[1]) and _bound(sock, where)):
            return
        sock.bind((where[0], 0))
        self.warnings.append(f"port {where[1]} is taken here: the socket that was bound "
                             f"to {address_text(local)} is now on port {sock.getsockname()[1]}")

    async def _recreate_udp(self, row: SocketRow, image_dir: Path, reach_ip: str) -> socket.socket:
        """A datagram socket: the same port, published under its old
        address; connected again to its peer, wherever that is now."""
        info = row.info
        family = socket.AddressFamily(info.family)
        sock = socket.socket(family, socket.SOCK_DGRAM, info.proto)
        try:
            fdtable.set_options(sock, info.options)
            self._bind(sock, family, info.local)
            here = sock.getsockname()
            self._publish_udp(sock, info, reach_ip)
            if info.peer:
                peer = info.peer
                if row.peer_known:
                    peer = _mapped(await self._lookup(f"udp:{info.peer_key}", _connect_timeout()),
                                   here[0])
                sock.connect(peer)
            if row.datagrams:
                raw = json.loads((image_dir / row.datagrams).read_text())
                self.datagrams[info.ino] = [(base64.b64decode(d), tuple(src), key, known)
                                            for d, src, key, known in raw]
            return sock
        except BaseException:
            sock.close()
            raise

    async def _inject_datagrams(self) -> None:
        """Datagrams that sat in a receive queue at the checkpoint go back
        in, from their sender's address (where that sender is now)."""
        for ino, queued in self.datagrams.items():
            sock = self.entries[ino].sock
            target = sock.getsockname()
            lost_source = 0
            for data, src, key, known in queued:
                if known:
                    src = _mapped(await self._lookup(f"udp:{key}", _connect_timeout()), target[0])
                if not udp.inject(data, src, target):
                    lost_source += 1
            if lost_source:
                self.warnings.append(f"{lost_source} queued datagrams of {address_text(target)} "
                                     "went back without their sender's address")
                log.warning("%s", self.warnings[-1])

    async def _reconnect(self, info: SocketInfo, connection: Connection,
                         reach_ip: str) -> socket.socket:
        """The two ends of a connection meet again: side a listens and
        publishes where, side b looks it up and connects, then sends the
        connection's tag so a stray connection is never taken for it."""
        loop = asyncio.get_running_loop()
        family, type_ = socket.AddressFamily(info.family), socket.SocketKind(info.type)
        conn = connection.conn
        key = f"conn:{conn}"
        if connection.side == "a":
            listener = socket.socket(family, type_ if type_ != socket.SOCK_DGRAM else socket.SOCK_STREAM)
            try:
                if family == socket.AF_UNIX:
                    name = f"dmtcp-conn-{_sha256(key).hex()[:24]}-{os.getpid()}"
                    listener.bind("\0" + name)
                    where = "@" + name
                else:
                    listener.bind((_reach(family, reach_ip), 0))
                    where = "%s|%d" % listener.getsockname()[:2]
                listener.listen(8)
                listener.setblocking(False)
                self._send(messages.Publish(key=key, value=where))
                wait = _connect_timeout()
                while True:
                    sock, _ = await asyncio.wait_for(loop.sock_accept(listener), wait)
                    sock.setblocking(False)
                    tag = await asyncio.wait_for(recv_exactly_async(sock, HANDSHAKE), wait)
                    if tag == _tag(conn):
                        sock.setblocking(True)
                        return sock
                    sock.close()
            finally:
                listener.close()
        where = await self._lookup(key, _connect_timeout())
        sock = socket.socket(family, type_)
        try:
            sock.setblocking(False)
            if family == socket.AF_UNIX:
                await loop.sock_connect(sock, "\0" + where[1:])
            else:
                host, port = where.rsplit("|", 1)
                await loop.sock_connect(sock, (_in_family(family, host), int(port)))
            await loop.sock_sendall(sock, _tag(conn))
            sock.setblocking(True)
            return sock
        except BaseException:
            sock.close()
            raise


def _write_json(path: Path, value) -> None:
    """A file of the image, 0600 (the image holds the program's data)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(value, f)


def _mapped(where: str, here_ip: str) -> tuple[str, int]:
    """A published "ip|port"; a wildcard address means the publisher's host,
    reached as we reach our own when it is ours."""
    ip, port = where.rsplit("|", 1)
    if ip in ("0.0.0.0", "::"):
        ip = here_ip if here_ip not in ("0.0.0.0", "::") else "127.0.0.1"
    return (ip, int(port))


def _reach(family: int, ip: str) -> str:
    if family == socket.AF_INET6 and ":" not in ip:
        return "::ffff:" + ip
    return ip


def _in_family(family: int, ip: str) -> str:
    """The peer's published address as a socket of our family reaches it:
    the two ends of one connection may differ (a dual-stack IPv6 socket
    talking to an IPv4 one), and so may their meeting point."""
    if family == socket.AF_INET and ip.lower().startswith("::ffff:") and "." in ip:
        return ip[len("::ffff:"):]
    return _reach(family, ip)


def _is_here(family: int, ip: str) -> bool:
    probe = socket.socket(family, socket.SOCK_DGRAM)
    try:
        probe.bind((ip, 0))
        return True
    except OSError:
        return False
    finally:
        probe.close()


def _bound(sock: socket.socket, where: tuple) -> bool:
    """Bound to where; False if another socket has it."""
    try:
        sock.bind(where)
        return True
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        return False


def _local_address(family: int, local: tuple[str, int]) -> tuple:
    """The same port; the same address if this host has it, else any."""
    ip, port = local[0], local[1]
    if fdtable.is_namespace_local(ip) or _is_here(family, ip):
        return (ip, port)
    return ("::" if family == socket.AF_INET6 else "0.0.0.0", port)


def _closed_connection(family: int, type_: int) -> socket.socket:
    """A connected socket whose peer is gone: reads see EOF, writes EPIPE."""
    if family == socket.AF_UNIX:
        a, b = socket.socketpair(socket.AF_UNIX, type_)
        b.close()
        return a
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.bind(("::1" if family == socket.AF_INET6 else "127.0.0.1", 0))
        listener.listen(1)
        sock = socket.socket(family, type_)
        if type_ == socket.SOCK_STREAM:
            sock.connect(listener.getsockname()[:2])
            peer, _ = listener.accept()
            peer.close()
        return sock
    finally:
        listener.close()
