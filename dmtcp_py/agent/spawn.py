"""How a tree's root is started: posix_spawn, as pid 1 of a PID namespace
of the tree's own when this process may make one, under a subreaper.

Light (os, ctypes and the C half of signal): dmtcp-launch starts the
program with these before the agent's modules load (early.py).
"""
from __future__ import annotations

import _signal
import ctypes
import errno
import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

_PR_SET_CHILD_SUBREAPER = 36
_CLONE_NEWPID = 0x20000000
# back to their defaults in the tree (the agent ignores or handles them)
DEFAULT_SIGNALS = (_signal.SIGPIPE, _signal.SIGXFSZ, _signal.SIGINT, _signal.SIGQUIT)

_libc = None


def _c():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def become_subreaper() -> None:
    if _c().prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def spawn_in_new_pid_namespace(spawn: Callable[[], int]) -> int | None:
    """spawn() with its child as pid 1 of a new PID namespace: the pid
    (ours) of that child, or None when this process may not make one
    (no CAP_SYS_ADMIN: a user who is not root), and nothing was spawned.

    unshare(CLONE_NEWPID) changes only where this thread's next children
    go (each thread has its own); the thread goes back to its own namespace
    at once, so criu, the coordinator and whatever else the agent starts
    stay where it is."""
    libc = _c()
    own = os.open("/proc/thread-self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.unshare(_CLONE_NEWPID) != 0:
            err = ctypes.get_errno()
            if err in (errno.EPERM, errno.EINVAL, errno.ENOSPC, errno.EUSERS):
                return None  # (the tree runs without one)
            raise OSError(err, "unshare(CLONE_NEWPID)")
        try:
            return spawn()
        finally:
            if libc.setns(own, _CLONE_NEWPID) != 0:  # (never seen: it is our own)
                raise OSError(ctypes.get_errno(), "setns(own PID namespace)")
    finally:
        os.close(own)


def spawn_root(path: str, argv: list[str], env: dict[str, str], *, pid_namespace: bool,
               sigmask: Iterable[int]) -> tuple[int, bool]:
    """posix_spawn: only fds 0-2 are inheritable in this process, so the
    tree gets nothing of the agent's; the signals of DEFAULT_SIGNALS are
    back to default and its signal mask is sigmask.  pid_namespace: the
    root becomes pid 1 of a new PID namespace, if this process may make
    one.  (pid, whether it did)."""
    def run() -> int:
        return os.posix_spawn(path, argv, env, setsigdef=DEFAULT_SIGNALS, setsigmask=sigmask)
    pid = spawn_in_new_pid_namespace(run) if pid_namespace else None
    if pid is not None:
        return pid, True
    return run(), False
