"""The process tree under one agent: watch it, reap, kill (dmtcp-launch
starts it before the agent loads: spawn.py, early.py).

The agent is a child subreaper, so processes orphaned inside the tree come
back to it instead of init: it reaps them, and they stay countable.

Where the agents of several trees share one process (a restart of trees
that each run in a PID namespace of their own: agent/together.py), no
orphan comes back to it (each namespace's init, the tree's root, reaps
its own), and a tree's processes are its root and what is below it: a
child of the process that is not its root is another tree's, or CRIU's.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from typing import TYPE_CHECKING, Callable

from dmtcp_py import procfs

if TYPE_CHECKING:
    import psutil

log = logging.getLogger("agent.tree")
_WALL = 0x40000000  # waitid: children of any kind, as /proc lists them
ORPHANS_POLL = 0.2  # seconds between looks at the orphans left, besides SIGCHLD


def _children() -> bool | None:
    """Whether this process has children, and whether one has ended, without
    psutil's scan of every process in /proc (several ms per call, more on a
    busy host): None when it has none, False when none has ended, True when
    one waits to be reaped (left waitable: WNOWAIT)."""
    try:
        ended = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT | _WALL)
    except ChildProcessError:
        return None
    return ended is not None


def children_of(pid: int) -> list[int]:
    """The children of every thread of pid, from /proc/PID/task/TID/children
    (CONFIG_PROC_CHILDREN): a child belongs to the thread that forked it,
    and an orphan comes back to any live thread of a subreaper.  Unlike
    psutil's children(), which reads /proc/*/stat of every process of the
    host, this costs only the process asked about.  [] when pid is gone."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    out: list[int] = []
    for tid in tids:
        text = procfs.read(f"/proc/{pid}/task/{tid}/children")
        if text is not None:  # else the thread ended meanwhile
            out.extend(int(c) for c in text.split())
    return out


def descendants(roots: list[int]) -> list[int]:
    """roots and everything below them (each pid once, parents first)."""
    seen: set[int] = set()
    out: list[int] = []
    stack = list(reversed(roots))
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        out.append(pid)
        stack.extend(reversed(children_of(pid)))
    return out


def _stat(pid: int) -> tuple[str, list[str]] | None:
    """The command name of /proc/PID/stat and the fields after it, from the
    state letter on (None: gone)."""
    stat = procfs.read(f"/proc/{pid}/stat")
    if stat is None:
        return None
    # "pid (comm) S ...": comm may hold spaces and parentheses
    left, right = stat.find("("), stat.rfind(")")
    if left < 0 or right < left:
        return None
    return stat[left + 1:right], stat[right + 2:].split()


def _state_and_name(pid: int) -> tuple[str, str] | None:
    """The state letter and the command name of /proc/PID/stat (None: gone)."""
    found = _stat(pid)
    if found is None or not found[1]:
        return None
    return found[1][0], found[0]


def killed_zombie(pid: int) -> tuple[str, int, bool] | None:
    """(name, signal, core dumped) of a zombie that a signal killed; None
    for a live process, an exit, or one gone.  The wait status is the last
    field of /proc/PID/stat (exit_code, Linux 3.5)."""
    found = _stat(pid)
    if found is None or not found[1] or found[1][0] != "Z":
        return None
    name, fields = found
    try:
        status = int(fields[-1])
    except ValueError:
        return None
    signum = status & 0x7F
    if signum == 0 or signum == 0x7F:
        return None
    return name, signum, bool(status & 0x80)


def _is_criu(pid: int) -> bool:
    """Whether PID is a CRIU process (one of the agent's dumps or restores,
    never part of the tree)."""
    found = _state_and_name(pid)
    return found is not None and found[1] == "criu"


def _ended(pid: int) -> bool:
    """Whether PID is a zombie or gone."""
    found = _state_and_name(pid)
    return found is None or found[0] == "Z"


CRIU_EXIT_WAIT = 2.0  # seconds for a killed CRIU to be gone


def _kill_criu(mark: str | None = None) -> None:
    """SIGKILL this agent's CRIU processes (a restore or dump under way)
    and wait until each is dead (a zombie, or reaped already).  mark: only
    those whose command line names it (the tree's id, in the image's name:
    a restore, its lazy pages, the processes it is making; or, for a
    dump's `criu swrk`, its log's), where other trees' agents run in this
    process."""
    from dmtcp_py.agent.criu_driver import dump_pids
    dumps = dump_pids(mark) if mark is not None else []
    criu = [pid for pid in children_of(os.getpid()) if _is_criu(pid)
            and (mark is None or pid in dumps
                 or mark in (procfs.read(f"/proc/{pid}/cmdline") or ""))]
    for pid in criu:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + CRIU_EXIT_WAIT
    while criu and time.monotonic() < deadline:
        criu = [pid for pid in criu if not _ended(pid)]
        if criu:
            time.sleep(0.002)


class Tree:
    def __init__(self, shared_by: str | None = None) -> None:
        """shared_by: the tree's id, where the agents of other trees run in
        this process too (module doc)."""
        self.shared_by = shared_by
        self.root_pid: int | None = None
        self.exit_status: int | None = None
        self.exited = asyncio.Event()
        self._hold = False
        self._pidfd: int | None = None
        self._child_ended = asyncio.Event()  # set at every SIGCHLD (reap_orphans)
        # the root is pid 1 of a PID namespace of the tree's own (spawn, or
        # the image's, restored by CRIU)
        self.own_namespace = False
        self.init_dir: str | None = None  # the root's working directory then (init_dir.py)
        # the program's wait status, as the root told it (it cannot end
        # by the program's signal as pid 1 of a namespace)
        self._program_status: int | None = None
        # an orphan reaped here was killed by a signal: (pid, signal, core)
        self.on_killed: Callable[[int, int, bool], None] = lambda pid, signum, core: None

    def adopt(self, pid: int) -> None:
        self.root_pid = pid
        if not self.own_namespace:  # (a restored tree: as its image made it)
            self.own_namespace = procfs.ns_pid(pid) == 1
        self._pidfd = os.pidfd_open(pid)  # a zombie too: it is ours to reap
        asyncio.get_running_loop().add_reader(self._pidfd, self._root_exited)

    def _root_exited(self) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(self._pidfd)
        os.close(self._pidfd)
        self._pidfd = None
        try:
            _, status = os.waitpid(self.root_pid, 0)
            self.exit_status = os.waitstatus_to_exitcode(status)
        except ChildProcessError:
            self.exit_status = 0
        log.info("root %d exited with %s", self.root_pid, self.exit_status)
        self.exited.set()
        self.reap_orphans()

    def program_ended(self, status: int) -> None:
        """The root, pid 1 of the tree's namespace, told how the program
        ended (a wait status)."""
        self._program_status = status

    def settle_status(self) -> None:
        """After the root's end and what it said before it (ShimLink.settle):
        the program's own end, when the root could only tell it."""
        if self._program_status is not None and self.exited.is_set():
            try:
                self.exit_status = os.waitstatus_to_exitcode(self._program_status)
            except ValueError:
                return
            log.info("the program ended with %s", self.exit_status)

    @property
    def hold_reaping(self) -> bool:
        """While CRIU runs, its processes are not ours to reap."""
        return self._hold

    @hold_reaping.setter
    def hold_reaping(self, value: bool) -> None:
        self._hold = value
        if not value:
            self.reap_orphans()  # what exited meanwhile

    def reap_orphans(self) -> None:
        self._child_ended.set()
        if self._hold or self.shared_by or not _children():  # (none ours) or none ended
            return
        for pid in children_of(os.getpid()):
            if pid == self.root_pid and not self.exited.is_set():
                continue  # the root's end is _root_exited's to collect
            criu = _is_criu(pid)  # (read while it is there to read)
            try:
                reaped, status = os.waitpid(pid, os.WNOHANG)  # only if it has ended
            except ChildProcessError:
                continue
            if reaped and os.WIFSIGNALED(status) and not criu:
                self.on_killed(reaped, os.WTERMSIG(status), os.WCOREDUMP(status))

    def pids(self) -> list[int]:
        """Every live process of the tree: the root's descendants and the
        orphans that came back to us (our children but CRIU and those that
        have ended, and everything below them).  A walk down from us through
        /proc/PID/task/TID/children: no look at the host's other processes."""
        if self.shared_by:
            root = self.root_pid
            alive = root is not None and not self.exited.is_set() and not _ended(root)
            return descendants([root]) if alive else []
        tops = [pid for pid in children_of(os.getpid())
                if not _ended(pid) and not _is_criu(pid)]
        return descendants(tops)

    def processes(self) -> list[psutil.Process]:
        """pids() as psutil's processes, for what /proc alone does not say."""
        import psutil  # (loaded once the agent runs: agent/runner.py, CHECKPOINT_MODULES)
        out = []
        for pid in self.pids():
            try:
                out.append(psutil.Process(pid))
            except psutil.Error:
                pass  # ended meanwhile
        return out

    @staticmethod
    def alive(pids: set[int]) -> set[int]:
        """The pids that are running (a zombie never reconnects)."""
        return {pid for pid in pids if not _ended(pid)}

    def has_live_processes(self) -> bool:
        return _children() is not None and bool(self.pids())

    async def wait_for_orphans(self) -> None:
        """After the root: until the orphans that came back to us, still the
        program's processes, are gone.  Each one that ends sends SIGCHLD;
        the poll only backs that up."""
        while True:
            self._child_ended.clear()
            if not self.has_live_processes():
                return
            try:
                await asyncio.wait_for(self._child_ended.wait(), ORPHANS_POLL)
            except asyncio.TimeoutError:
                pass

    def reap_all(self, timeout: float = 5.0) -> None:
        """Before the agent exits: collect every child, zombies included.
        A killed tree's processes can come back to us as zombies while
        their threads finish exiting; left unreaped, their pids stay taken
        and the next restore fails ('Can't fork ...: File exists')."""
        if self.shared_by:  # (the root is collected as it ends; nothing else is ours)
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                time.sleep(0.005)

    def kill(self) -> None:
        """Every process of the tree, CRIU first.  A restore under way holds
        the tree's processes under ptrace: one killed then stays a zombie
        that its parent cannot reap, and CRIU waits for ever for its next
        restore stage (seen here: a restart called off by another tree's
        damaged pages hung in zap_pid_ns_processes).  A dead CRIU lets go,
        and forks nothing more after the walk below."""
        import psutil
        _kill_criu(self.shared_by)
        for proc in self.processes():
            try:
                proc.kill()
            except psutil.Error:
                pass

    def signal_root(self, signum: int) -> None:
        if self.root_pid is not None and not self.exited.is_set():
            try:
                os.kill(self.root_pid, signum)
            except ProcessLookupError:
                pass
