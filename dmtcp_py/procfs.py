"""Facts about other processes that only /proc has."""
from __future__ import annotations

import os

TYPE_CHECKING = False  # (not typing's: dmtcp-launch reads /proc before its heavy imports)
if TYPE_CHECKING:
    from collections.abc import Iterator


def read(path: str) -> str | None:
    """A small /proc file, or None when it is gone (or not ours).  open and
    read only (no fstat, ioctl or lseek of a buffered file); names of
    files in it keep their bytes (os.fsdecode)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    return os.fsdecode(b"".join(chunks))


def fds(pids: list[int]) -> Iterator[tuple[int, str]]:
    """(pid, fd number as /proc names it) for every open fd of pids; a
    process that is gone or not ours to read is skipped."""
    for pid in pids:
        try:
            names = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for name in names:
            yield pid, name


def socket_inode(target: str) -> int | None:
    """The inode of a socket, from what its fd links to ("socket:[5]" ->
    5); None for anything else."""
    if target.startswith("socket:[") and target.endswith("]"):
        try:
            return int(target[8:-1])
        except ValueError:
            return None
    return None


def ns_pid(pid: int) -> int | None:
    """The id of process pid in its own PID namespace (the last field of
    NSpid in its status; pid itself when it runs in /proc's), or None when
    it is gone."""
    status = read(f"/proc/{pid}/status")
    if status is None:
        return None
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            fields = line.split()[1:]
            return int(fields[-1]) if fields else pid
    return pid


def pid_namespace(pid: int) -> str | None:
    """The inode number of the PID namespace process pid runs in, as the
    digits of /proc/PID/ns/pid ("pid:[4026531836]"); None when unreadable."""
    try:
        link = os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None
    inode = link[link.find("[") + 1:-1] if link.startswith("pid:[") else ""
    return inode if inode.isdigit() else None
