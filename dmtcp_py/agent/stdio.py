"""The tree's stdio that leads outside it, and how to hand it back.

The launched tree inherits the agent's fds 0-2.  When those are pipes or
sockets, CRIU dumps one end whose peer is outside; a plain restore would
give a pipe with no reader.  We record CRIU's id for each and, at restore,
pass the restarting agent's own fd for it with inherit_fd, so the restored
program reads and writes where the restarting command does.  Terminals are
declared external at dump (tty[rdev:dev]) and handed over the same way, and
so are regular files (file[mnt_id:inode]): CRIU would otherwise refuse a log
file that grew since the checkpoint, and the output would not follow the
restarting command's redirection.  Anything else (/dev/null) is reopened by
path.
"""
from __future__ import annotations

import os
import stat


def describe() -> dict[str, dict]:
    out = {}
    for fd in (0, 1, 2):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
            st = os.fstat(fd)
        except OSError:
            continue
        if stat.S_ISFIFO(st.st_mode):
            out[str(fd)] = {"kind": "pipe", "key": target}
        elif stat.S_ISSOCK(st.st_mode):
            out[str(fd)] = {"kind": "socket", "key": target}
        elif stat.S_ISCHR(st.st_mode) and os.isatty(fd):
            out[str(fd)] = {"kind": "tty", "key": f"tty[{st.st_rdev:x}:{st.st_dev:x}]"}
        elif stat.S_ISREG(st.st_mode):
            out[str(fd)] = {"kind": "file", "key": f"file[{_mnt_id(fd):x}:{st.st_ino:x}]",
                            "path": target}
        else:
            out[str(fd)] = {"kind": "other", "key": target}
    return out


def _mnt_id(fd: int) -> int:
    with open(f"/proc/self/fdinfo/{fd}") as f:
        for line in f:
            if line.startswith("mnt_id:"):
                return int(line.split()[1])
    raise OSError(f"no mnt_id for fd {fd}")


def external_ids(stdio: dict[str, dict]) -> list[str]:
    """Ids to declare external at dump: CRIU records them by id only."""
    return sorted({d["key"] for d in stdio.values() if d["kind"] in ("tty", "file")})


def _usable(fd: int, kind: str) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    if kind == "tty":
        return os.isatty(fd)
    return True


def inherit_fds(stdio: dict[str, dict]) -> tuple[list[tuple[int, str]], list[int]]:
    """(fd, key) pairs for CRIU's inherit_fd, and the fds opened for it (the
    caller closes them after the restore).  Each is a duplicate above 2:
    pycriu closes 0-2 in the criu child.  A recorded stream with no usable
    counterpart here goes to /dev/null."""
    pairs: list[tuple[int, str]] = []
    opened: list[int] = []
    seen: set[str] = set()
    for fd_text, desc in sorted(stdio.items()):
        if desc["kind"] == "other" or desc["key"] in seen:
            continue
        seen.add(desc["key"])
        ours = int(fd_text)
        if _usable(ours, desc["kind"]):
            fd = os.dup(ours)
        else:
            fd = os.open("/dev/null", os.O_RDWR)
        os.set_inheritable(fd, True)
        opened.append(fd)
        pairs.append((fd, desc["key"]))
    return pairs, opened
