"""Waking the tree's processes that have no connection to their agent.

A process under the shim connects to its agent only when the agent needs
it (hijack/src/ckpt_thread.c): at a checkpoint, and when FATE 1 comes into
force.  The agent wakes it with the shim's reserved signal, sent to its
main thread; the shim's handler connects.  The signal's default action
ends a process, so only a process whose shim has installed its handler
(SigCgt in /proc/PID/status) is sent it; across an exec the shim keeps it
blocked until the new program's shim handles it.

Never to the whole process (kill()): the kernel wakes one thread for a
process-directed signal, another may take it first, and an epoll_wait the
woken thread was in then fails with EINTR without any handler having run
(hijack/src/ckpt_thread.c).  Only a process that stayed unconnected for a
while is woken as a whole too (tree_work.WAKE_PROCESS_AFTER): older
builds of the shim, which an image made with them brings back, know the
agent's wake-up by SI_USER only.
"""
from __future__ import annotations

import ctypes
import os
import signal

from dmtcp_py import procfs


def reserved_signal(env: dict[str, str] | os._Environ = os.environ) -> int:
    """The shim's reserved signal, as suspend.c chooses it (DMTCP_SIGCKPT,
    else SIGRTMAX - 2): the tree runs with this agent's environment."""
    value = env.get("DMTCP_SIGCKPT", "")
    if value.isdigit() and 0 < int(value) < signal.NSIG:
        return int(value)
    return signal.SIGRTMAX - 2


def _mask(status: str, field: str, signum: int) -> bool:
    for line in status.splitlines():
        if line.startswith(field):
            try:
                return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
            except (IndexError, ValueError):
                return False
    return False


def _live_status(pid: int) -> str | None:
    """/proc/PID/status of a process that has not ended.  A zombie keeps
    the signal masks it had there (seen here: SigCgt with the shim's
    signal), but it never connects: woken and waited for, it held up a
    checkpoint of a program whose children ended as it stopped."""
    status = procfs.read(f"/proc/{pid}/status")
    if status is None or "\nState:\tZ" in status:
        return None
    return status


def handles(pid: int, signum: int) -> bool:
    """Whether the process catches signum now (its shim is in place)."""
    status = _live_status(pid)
    return status is not None and _mask(status, "SigCgt:", signum)


def in_exec(pid: int, signum: int) -> bool:
    """Whether the process blocks signum without catching it: between its
    shim's exec (or spawn) and the new program's shim, or a program
    without the shim that an exec of the tree gave the blocked signal."""
    status = _live_status(pid)
    return (status is not None and not _mask(status, "SigCgt:", signum)
            and _mask(status, "SigBlk:", signum))


_libc: ctypes.CDLL | None = None


def _tgkill(pid: int, signum: int) -> None:
    """signum to the main thread of process pid (OSError if it is gone)."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    if _libc.tgkill(pid, pid, signum) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def wake(pids: list[int], signum: int, whole_process: bool = False) -> list[int]:
    """Send the wake-up to those of pids that handle it; the pids sent to.
    whole_process: to the process (kill()), which a shim built before the
    wake-up went to the main thread needs, else to its main thread."""
    sent = []
    for pid in pids:
        if not handles(pid, signum):
            continue
        try:
            if whole_process:
                os.kill(pid, signum)
            else:
                _tgkill(pid, signum)
        except OSError:
            continue  # ended meanwhile
        sent.append(pid)
    return sent
