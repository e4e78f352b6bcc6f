"""System V IPC of a tree without an IPC namespace of its own.

The tree's init gives the tree an IPC namespace of its own when it may
(CAP_SYS_ADMIN: root), and CRIU then saves the tree's SysV shared memory,
semaphores and message queues with it.  A tree of a user who is not root
shares the host's IPC namespace (a user namespace would give it one, but
CRIU 4.2 cannot dump a user namespace unprivileged: tried here).  Then
CRIU refuses to dump SysV shared memory at all, which this module says
before the dump in a sentence of its own; message queues and semaphores it
leaves out of the image, which is said once per tree: they survive only
where they are (a restart on this host before a reboot finds them, one
after a reboot or on another host does not).  What can be told from /proc:
shared memory the tree maps, message queues it last sent to or received
from.  Semaphores name no process and cannot be told apart.
"""
from __future__ import annotations

import os

from dmtcp_py import procfs


def has_own_namespace(root_pid: int) -> bool:
    """The tree's IPC namespace is not ours (the agent's, the host's)."""
    try:
        return os.readlink(f"/proc/{root_pid}/ns/ipc") != os.readlink("/proc/self/ns/ipc")
    except OSError:
        return True  # gone: nothing to say


def segments(maps_texts: list[str]) -> int:
    """How many SysV shared memory segments these /proc/PID/maps texts
    map: a segment's inode is its id (0 included), its name only its key."""
    found = set()
    for text in maps_texts:
        for line in text.splitlines():
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith("/SYSV"):
                found.add(fields[4])
    return len(found)


def queues(pids: set[int], text: str | None = None) -> int:
    """How many SysV message queues a process of pids last used (/proc/sysvipc/msg)."""
    text = procfs.read("/proc/sysvipc/msg") if text is None else text
    count = 0
    for line in (text or "").splitlines()[1:]:
        fields = line.split()
        try:
            if int(fields[5]) in pids or int(fields[6]) in pids:
                count += 1
        except (IndexError, ValueError):
            continue
    return count


def shared_memory_refusal(root_pid: int, pids: set[int]) -> str | None:
    """Why the tree cannot be dumped, if it maps SysV shared memory outside
    an IPC namespace of its own; None otherwise."""
    if has_own_namespace(root_pid):
        return None
    shm = segments([procfs.read(f"/proc/{pid}/maps") or "" for pid in sorted(pids)])
    if not shm:
        return None
    return (f"the tree maps {shm} System V shared memory segment{'s' * (shm != 1)}, which "
            "CRIU saves only in an IPC namespace of the tree's own, and only root can give "
            "it one: this tree cannot be checkpointed by a user who is not root")


def left_out(root_pid: int, pids: set[int]) -> str | None:
    """The warning for a tree whose SysV message queues are not in its image, or None."""
    if has_own_namespace(root_pid):
        return None
    msg = queues(pids)
    if not msg:
        return None
    return (f"the tree uses {msg} System V message queue{'s' * (msg != 1)} outside an IPC "
            "namespace of its own (one needs root): they are not in its images; a restart "
            "finds them only on this host until they are removed or it reboots")
