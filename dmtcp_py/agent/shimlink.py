"""The agent's end of the shim link: one Unix stream connection per process.

The records are those of hijack/include/dmtcp_record.h (records.py).  The
listening socket lives in the abstract namespace under a name that is fixed
for the tree, so the shims of a restored tree find the new agent on any
host, followed by the inode number of the tree's PID namespace, so that
two copies of one checkpoint, each in a namespace of its own, find each its
own agent on one host (hijack/include/agent_addr.h).

Processes are known by their pids in the agent's namespace (SO_PEERCRED);
the pids a record carries are the sender's own (its namespace's), and are
translated through what each process said in its HELLO.
"""
from __future__ import annotations

import array
import asyncio
import logging
import os
import socket
import struct
from dataclasses import dataclass, field
from typing import Callable

from dmtcp_py import procfs
from dmtcp_py.agent import wake
from dmtcp_py.agent.records import (
    CHECKPOINT,
    CHILD_KILLED,
    CKPT_REQUEST,
    CKPT_REQUESTED,
    FATE,
    HELLO,
    MAGIC,
    PARK,
    PARK_LEADER,
    PARK_MAX,
    PARKED,
    PARKED_FD,
    PROGRAM_ENDED,
    READY,
    RECORD,
    RESUME,
    SUSPEND,
    SUSPENDED,
    TRACK,
    TRACKER,
    UNPARK,
    UNPARK_FD,
    UNPARKED,
    VERSION,
    hello_of,
    killed_of,
    pack,
)
from dmtcp_py.sockio import wait_readable, wait_writable

log = logging.getLogger("agent.shimlink")

_FD_SPACE = socket.CMSG_SPACE(4 * array.array("i").itemsize)
# settle(): how long the connections made before the tree's end may take
# to say their first record (each says it at once)
SETTLE_TIMEOUT = 1.0
# the names of this many processes that said hello are remembered (a
# process's parent tells of its death once its connection is gone)
NAMES_KEPT = 4096
# a request unanswered this long: its process is woken again.  The agent's
# writes signal the thread that served the link last (ckpt_thread.c); if
# that thread has ended, nothing else tells the process a request came.
NUDGE_AFTER = 0.25


@dataclass(frozen=True)
class ParkedFd:
    """One socket a process handed over: its fd number there, whether that
    process leads the open file description, and our copy of it."""
    pid: int
    fd: int
    leader: bool
    sock: socket.socket = field(compare=False)


@dataclass(eq=False)
class Shim:
    pid: int  # as the agent sees it (SO_PEERCRED)
    sock: socket.socket
    replies: asyncio.Queue = field(default_factory=asyncio.Queue)
    parked: list[ParkedFd] = field(default_factory=list)
    label: list | None = None  # what the coordinator is told of it (the agent fills it in)
    tracker: int | None = None  # the userfaultfd its TRACKER carried, until taken
    asked: _Asked | None = None  # the request_all it owes an answer to, if any
    own: int = 0  # its pid in its own PID namespace, as its hello said
    link_fd: int | None = None  # the number of this connection's fd in it, as its hello said


@dataclass(eq=False)
class _Asked:
    """One request_all: the answers its shims owe, taken as each
    connection's reader hears them (no task per process)."""
    answer: int
    then_eof: bool                  # done with a shim once its connection ends too
    missing: set[Shim]
    done: asyncio.Future
    answered: set[Shim] = field(default_factory=set)  # (then_eof) its end to come
    said: dict[int, int] = field(default_factory=dict)  # pid -> its answer's arg, if not 0

    def take(self, shim: Shim, type_: int, arg: int = 0) -> bool:
        """A record heard from shim: whether it was its answer (a stale
        record of another type is not: see owes_resume)."""
        if type_ != self.answer or shim not in self.missing or shim in self.answered:
            return False
        if arg:
            self.said[shim.pid] = arg
        if self.then_eof:
            self.answered.add(shim)
        else:
            self.settle(shim)
        return True

    def settle(self, shim: Shim) -> None:
        """shim owes nothing more: it answered, or it went away (which is
        no failure: a process that exits meanwhile is simply gone)."""
        self.missing.discard(shim)
        if not self.missing and not self.done.done():
            self.done.set_result(None)

    def unanswered(self) -> list[Shim]:
        return [s for s in self.missing if s not in self.answered]


def _close(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


async def _recv_record(sock: socket.socket) -> tuple[bytes, int | None]:
    """One record and the socket riding on it, if any.  Reads never go past
    the record, so a passed socket always belongs to the record it came with."""
    data, passed = b"", None
    while len(data) < RECORD.size:
        try:
            chunk, ancdata, _flags, _addr = sock.recvmsg(
                RECORD.size - len(data), _FD_SPACE, socket.MSG_CMSG_CLOEXEC)
        except (BlockingIOError, InterruptedError):
            await wait_readable(sock.fileno())
            continue
        for level, type_, payload in ancdata:
            if level == socket.SOL_SOCKET and type_ == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
                for fd in fds:
                    if passed is None:
                        passed = fd
                    else:
                        os.close(fd)
        if not chunk:
            if passed is not None:
                os.close(passed)
            raise ConnectionError("shim closed the connection")
        data += chunk
    return data, passed


async def _send(sock: socket.socket, data: bytes, passed: int | None = None) -> None:
    loop = asyncio.get_running_loop()
    if passed is None:
        await loop.sock_sendall(sock, data)
        return
    while True:
        try:
            sent = sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                          array.array("i", [passed]))])
            break
        except (BlockingIOError, InterruptedError):
            await wait_writable(sock.fileno())
    if sent < len(data):
        await loop.sock_sendall(sock, data[sent:])


def _send_now(sock: socket.socket, data: bytes) -> bytes:
    """Send what the socket takes at once (all of a record, but to a
    process that stopped reading); the rest, for _send."""
    try:
        return data[sock.send(data):]
    except (BlockingIOError, InterruptedError):
        return data
    except OSError:
        return b""  # gone: the wait for its answer sees its end


class ShimLink:
    def __init__(self, name: str, on_change: Callable[[], None] = lambda: None,
                 owes_resume: Callable[[bool], bool] = lambda suspended: False,
                 owes_suspend: Callable[[bool], bool] = lambda suspended: False,
                 resume_arg: Callable[[], int] = lambda: 0,
                 on_ckpt_request: Callable[[int], None] = lambda pid: None,
                 die_with_agent: Callable[[], bool] = lambda: False,
                 on_child_killed: Callable[[int, int, bool, str], None]
                 = lambda pid, signum, core, name: None,
                 on_program_ended: Callable[[int], None] = lambda status: None) -> None:
        self.base = name  # the tree's, in its manifest
        self.namespace: str | None = None  # the tree's PID namespace (bind_to_tree)
        self.shims: set[Shim] = set()
        self._on_change = on_change
        self._listener: socket.socket | None = None
        self._accepting: asyncio.Task | None = None
        # a round's release address (listen(released=)), until the next
        # round stops listening
        self._released: tuple[socket.socket, asyncio.Task] | None = None
        self._changed = asyncio.Event()
        # a process that says hello while still suspended may be owed a
        # RESUME at once (the agent's machine decides)
        self._owes_resume = owes_resume
        self._owes_suspend = owes_suspend
        self._resume_arg = resume_arg            # what a RESUME tells the process
        self._on_ckpt_request = on_ckpt_request  # a program's dmtcp_checkpoint()
        self._die_with_agent = die_with_agent    # what FATE tells each process
        # a process reaped a child a failure signal killed: (pid, signal,
        # core, name), the name as the child said hello, else "?"
        self._on_child_killed = on_child_killed
        self._on_program_ended = on_program_ended  # the status the tree's init told
        self._names: dict[int, str] = {}
        self._signum = wake.reserved_signal()
        # a process's pid in the tree's namespace -> ours, as it said hello
        self._ours: dict[int, int] = {}
        # one per connection until its first record is read (settle())
        self._first_records: set[asyncio.Future] = set()

    @property
    def name(self) -> str:
        """The abstract name listened on: the tree's, '-', its PID
        namespace's inode number (as agent_addr.h makes it)."""
        return f"{self.base}-{self.namespace}" if self.namespace else self.base

    def bind_to_tree(self, root_pid: int) -> None:
        """The name follows the namespace the tree's root runs in (before
        listen)."""
        self.namespace = procfs.pid_namespace(root_pid)

    def our_pid(self, pid: int) -> int:
        """Our pid of a process a record named by its tree's id (as it is
        when the tree has no namespace of its own, or never said hello)."""
        return self._ours.get(pid, pid)

    @property
    def address(self) -> str:
        """The value of DMTCP_AGENT_SOCK for the shims (which add the
        namespace themselves)."""
        return "@" + self.base

    async def listen(self, listening=None, released=None) -> None:
        """Accept the shims' connections, on a socket made here, or on
        listening (made before: early.py's before the tree started,
        listener()'s as a dump ended); and on released, a round's release
        address (listener(token)), if given."""
        sock = socket.socket(fileno=listening.detach()) if listening is not None \
            else self.listener()
        sock.setblocking(False)
        self._listener = sock
        self._accepting = asyncio.create_task(self._accept(sock))
        if released is not None:
            extra = socket.socket(fileno=released.detach())
            extra.setblocking(False)
            self._released = (extra, asyncio.create_task(self._accept(extra)))

    def listener(self, token: int = 0) -> socket.socket:
        """The socket the shims connect to, bound and listening: what
        connects waits in its backlog until listen() takes it.  System
        calls only, so any thread may make it (the dump's, at CRIU's
        post-dump).  token: at the release address of a round whose
        CHECKPOINT carried it instead (hijack/include/agent_addr.h): a
        process that connects there runs again at once."""
        name = f"{self.name}~{token:08x}" if token else self.name
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.bind("\0" + name)
            sock.listen(1024)
        except OSError:
            sock.close()
            raise
        return sock

    @property
    def listening(self) -> bool:
        return self._listener is not None

    def stop_listening(self) -> None:
        """Free the name at once: a shim that tries to reconnect during the
        dump must fail, or CRIU would meet a socket that leads outside."""
        if self._accepting is not None:
            self._accepting.cancel()
            self._accepting = None
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        if self._released is not None:  # (every process came back: see listen())
            sock, task = self._released
            task.cancel()
            sock.close()
            self._released = None

    def pids(self) -> list[int]:
        return sorted(s.pid for s in self.shims)

    def link_fds(self) -> dict[int, int]:
        """pid -> the number of its link's fd, of the connected processes
        whose hello said it."""
        return {s.pid: s.link_fd for s in self.shims if s.link_fd is not None}

    def own_pids(self) -> dict[int, int]:
        """pid -> its id in its own PID namespace, of the connected
        processes (each said it, and is alive while it is connected)."""
        return {s.pid: s.own for s in self.shims if s.own > 0}

    def name_of(self, pid: int) -> str:
        """The command name of a process that said hello, or "?"."""
        return self._names.get(pid, "?")

    async def settle(self, timeout: float = SETTLE_TIMEOUT) -> None:
        """Before the tree's end is told: what its processes said before
        they ended is heard (a parent tells of a killed child, then exits).
        The connections still in the backlog are taken, and each
        connection's first record is read."""
        listeners = [self._listener, self._released[0] if self._released else None]
        for listener in filter(None, listeners):
            while True:
                try:
                    sock, _ = listener.accept()
                except OSError:  # BlockingIOError: none left
                    break
                self._open(sock)
        if self._first_records:
            await asyncio.wait(set(self._first_records), timeout=timeout)

    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            sock, _ = await loop.sock_accept(listener)
            self._open(sock)

    def _open(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        first = asyncio.get_running_loop().create_future()
        self._first_records.add(first)
        first.add_done_callback(self._first_records.discard)
        asyncio.create_task(self._serve(sock, first))

    def _remember_name(self, pid: int) -> None:
        comm = procfs.read(f"/proc/{pid}/comm")
        if comm is None:
            return
        self._names.pop(pid, None)  # the newest last: the oldest go first
        self._names[pid] = comm.rstrip("\n") or "?"
        while len(self._names) > NAMES_KEPT:
            del self._names[next(iter(self._names))]

    def _remember_pid(self, own: int, ours: int) -> None:
        if own <= 0 or own == ours:
            return
        self._ours.pop(own, None)  # the newest last: the oldest go first
        self._ours[own] = ours
        while len(self._ours) > NAMES_KEPT:
            del self._ours[next(iter(self._ours))]

    async def _serve(self, sock: socket.socket, first: asyncio.Future) -> None:
        pid, _uid, _gid = struct.unpack("3i", sock.getsockopt(
            socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        shim = Shim(pid, sock)
        try:
            while True:
                data, passed = await _recv_record(sock)
                if not first.done():
                    first.set_result(None)
                magic, version, type_, own_pid, _pp, arg = RECORD.unpack(data)
                if magic != MAGIC or version != VERSION:
                    log.warning("pid %d sent a foreign record; dropping it", pid)
                    return
                if type_ == PARKED_FD and passed is not None:
                    shim.parked.append(ParkedFd(pid, arg & 0xFFFFFFFF, bool(arg & PARK_LEADER),
                                                socket.socket(fileno=passed)))
                    continue
                if type_ == TRACKER and passed is not None:
                    _close(shim.tracker)
                    shim.tracker, passed = passed, None
                if passed is not None:
                    os.close(passed)
                if type_ == CHILD_KILLED and shim not in self.shims:
                    # a wait wrapper, or the tree's init, on a connection
                    # of its own: one record, then it closes
                    child, signum, core = killed_of(arg)
                    child = self.our_pid(child)
                    log.warning("pid %d reaped its child %d, killed by signal %d%s",
                                pid, child, signum, " (core dumped)" if core else "")
                    self._on_child_killed(child, signum, core, self.name_of(child))
                    return
                if type_ == PROGRAM_ENDED and shim not in self.shims:
                    status = arg & 0xFFFFFFFF
                    self._on_program_ended(status - (1 << 32) if status >> 31 else status)
                    return
                if type_ == CKPT_REQUEST and shim not in self.shims:
                    # dmtcp_checkpoint(): answer, and ask only once this
                    # connection is gone (it must not be in the dump)
                    await _send(sock, pack(CKPT_REQUESTED, 0))
                    try:
                        while True:
                            await _recv_record(sock)
                    except (ConnectionError, OSError):
                        pass
                    self._on_ckpt_request(pid)
                    return
                if type_ == HELLO:
                    # state: 1 suspended (back from a dump or a restore),
                    # HELLO_RELEASED back from a dump and running: both
                    # in the round, neither to suspend; 0 running.  Back
                    # from a dump, its name is as it was (not read again
                    # while the program waits)
                    state, shim.link_fd = hello_of(arg)
                    if not (state and pid in self._names):
                        self._remember_name(pid)
                    self._remember_pid(own_pid, pid)
                    shim.own = own_pid
                    self.shims.add(shim)
                    self._notify()
                    if self._die_with_agent():
                        await _send(sock, pack(FATE, 1))
                    if self._owes_resume(bool(state)):
                        log.warning("pid %d came back suspended after the checkpoint; resuming it", pid)
                        await _send(sock, pack(RESUME, self._resume_arg()))
                    elif self._owes_suspend(bool(state)):
                        # records are taken in order: this one before any
                        # request of the round; its answer is skipped as stale
                        log.info("pid %d joined during a checkpoint; suspending it", pid)
                        await _send(sock, pack(SUSPEND, 0))
                else:
                    if type_ == SUSPENDED and arg:
                        log.warning("pid %d: %d threads would not stop", pid, arg)
                    if shim.asked is None or not shim.asked.take(shim, type_, arg):
                        shim.replies.put_nowait((type_, arg))
        except (ConnectionError, OSError):
            pass
        finally:
            if not first.done():
                first.set_result(None)
            sock.close()
            for item in shim.parked:
                item.sock.close()
            _close(shim.tracker)
            shim.tracker = None
            shim.replies.put_nowait(None)
            if shim.asked is not None:
                shim.asked.settle(shim)
            if shim in self.shims:
                self.shims.discard(shim)
                self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._on_change()

    async def _ask(self, shim: Shim, request: bytes, answer: int) -> int | None:
        """Send a request, wait for its answer; the answer's arg, or None if
        the process went away."""
        try:
            await _send(shim.sock, request)
        except OSError:
            return None
        got = await self._reply(shim)
        while got is not None and got[0] != answer:  # a stale answer (see owes_resume)
            got = await shim.replies.get()
        return None if got is None else got[1]

    async def _reply(self, shim: Shim) -> tuple[int, int] | None:
        """The next record the process answers with (None: it went away),
        waking it again every NUDGE_AFTER until it comes."""
        get = asyncio.ensure_future(shim.replies.get())
        try:
            while not (await asyncio.wait({get}, timeout=NUDGE_AFTER))[0]:
                wake.wake([shim.pid], self._signum)
            return get.result()
        finally:
            get.cancel()

    async def tell_all(self, record: int, arg: int = 0) -> None:
        """A record every connected process takes without answering."""
        for shim in list(self.shims):
            try:
                await _send(shim.sock, pack(record, arg))
            except OSError:
                pass  # gone: its connection's end removes it

    async def request_all(self, request: int, answer: int, timeout: float,
                          *, then_eof: bool = False, arg: int = 0,
                          said: dict[int, int] | None = None) -> list[int]:
        """Ask every connected shim; return the pids that did not answer.
        A process that exits meanwhile is simply gone, not a failure.
        said: filled with the answers' args that are not 0, by pid."""
        # In pid order, every time: a round stops and releases the
        # processes in the same order, so that none waits for the whole
        # spread of both (the connections come back after a dump in any
        # order, the set's order with them).  All records first, each
        # with one send, and the answers taken by the connections' readers
        # (_Asked): no task, future and timer per process, whose CPU time
        # the processes' stop shared with them (two cores here).
        shims = sorted(self.shims, key=lambda s: s.pid)
        if not shims:
            return []
        loop = asyncio.get_running_loop()
        asked = _Asked(answer, then_eof, set(shims), loop.create_future())
        for shim in shims:
            shim.asked = asked
            self._take_queued(shim, asked)
        record = pack(request, arg)
        sending = [asyncio.ensure_future(self._send_rest(shim, rest, asked))
                   for shim in shims if (rest := _send_now(shim.sock, record))]
        deadline = loop.time() + timeout
        try:
            while not asked.done.done() and (left := deadline - loop.time()) > 0:
                await asyncio.wait({asked.done}, timeout=min(NUDGE_AFTER, left))
                if not asked.done.done():  # woken again until they answer
                    wake.wake([s.pid for s in asked.unanswered()], self._signum)
        finally:
            for shim in shims:
                shim.asked = None
            for task in sending:
                task.cancel()
            if said is not None:
                said.update(asked.said)
        return sorted(s.pid for s in asked.missing if s in self.shims)

    @staticmethod
    def _take_queued(shim: Shim, asked: _Asked) -> None:
        """What the shim said before the request: records of other types
        are stale and dropped, as _ask drops them; an answer or its end
        counts for the request."""
        while not shim.replies.empty():
            got = shim.replies.get_nowait()
            if got is None:
                shim.replies.put_nowait(None)  # (for _ask's sake, it is still the end)
                asked.settle(shim)
                return
            if asked.take(shim, *got) and not asked.then_eof:
                return

    @staticmethod
    async def _send_rest(shim: Shim, rest: bytes, asked: _Asked) -> None:
        try:
            await _send(shim.sock, rest)
        except OSError:
            asked.settle(shim)  # gone: its connection's end says so too

    async def park(self, fds_by_pid: dict[int, list[int]], timeout: float) -> list[ParkedFd]:
        """DRAINED: each process hands over the sockets named for it."""
        shims = [s for s in self.shims if fds_by_pid.get(s.pid)]

        async def one(shim: Shim) -> list[ParkedFd]:
            fds = fds_by_pid[shim.pid][:PARK_MAX]
            shim.parked = []
            request = pack(PARK, len(fds)) + struct.pack(f"={len(fds)}i", *fds)
            if await self._ask(shim, request, PARKED) is None:
                raise ConnectionError(f"process {shim.pid} went away while parking its sockets")
            parked, shim.parked = shim.parked, []
            return parked

        results = await asyncio.wait_for(asyncio.gather(*(one(s) for s in shims)), timeout)
        return [p for result in results for p in result]

    async def unpark(self, socks_by_pid: dict[int, list[tuple[int, int]]],
                     timeout: float) -> dict[int, int]:
        """REFILLED: give each process a socket (a file descriptor of ours,
        passed, not consumed) for each (fd number, fileno); returns, per
        pid, how many parked numbers got none."""
        shims = [s for s in self.shims if s.pid in socks_by_pid]

        async def one(shim: Shim) -> int:
            for number, fileno in socks_by_pid[shim.pid]:
                await _send(shim.sock, pack(UNPARK_FD, number), fileno)
            left = await self._ask(shim, pack(UNPARK), UNPARKED)
            return 0 if left is None else left

        lefts = await asyncio.wait_for(asyncio.gather(*(one(s) for s in shims)), timeout)
        return {s.pid: left for s, left in zip(shims, lefts)}

    async def trackers(self, pids: set[int], timeout: float) -> dict[int, int | str]:
        """TRACK (processes suspended, or running for a pre-copy): each process of pids makes a
        userfaultfd of its memory and hands it over (agent/tracking.py);
        pid -> the fd (ours to close), or why it could not.  A shim that
        does not know TRACK (an older one, brought back by its image) does
        not answer: it is not waited for beyond timeout."""
        shims = [s for s in self.shims if s.pid in pids]

        async def one(shim: Shim) -> int | str:
            _close(shim.tracker)
            shim.tracker = None
            err = await self._ask(shim, pack(TRACK), TRACKER)
            fd, shim.tracker = shim.tracker, None
            if fd is not None:
                return fd
            return "it went away" if err is None else os.strerror(err)

        tasks = [asyncio.ensure_future(one(s)) for s in shims]
        if not tasks:
            return {}
        done, pending = await asyncio.wait(tasks, timeout=timeout)
        for task in pending:
            task.cancel()
        return {s.pid: t.result() if t in done else "its shim does not answer TRACK"
                for s, t in zip(shims, tasks)}

    async def park_all(self, timeout: float, token: int = 0) -> tuple[list[int], list[int]]:
        """CHECKPOINT: every shim answers READY and closes its connection.
        token: the round's release address (listener(token)).  Returns the
        pids that did not, and those that took message queues out."""
        said: dict[int, int] = {}
        stuck = await self.request_all(CHECKPOINT, READY, timeout, then_eof=True, arg=token,
                                       said=said)
        return stuck, sorted(said)

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
