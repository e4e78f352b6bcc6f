"""Files the tree has open for writing, and their length at checkpoint.

A restored program is where it was at the checkpoint, but a file it kept
writing after the checkpoint (a log opened O_APPEND, say) still holds the
later records, which the program will write again.  So the length of each
such file is recorded, and at restart a file that grew is cut back to it.
The tree's stdio handed over at restart is not touched.
"""
from __future__ import annotations

import logging
import os
import stat

from dmtcp_py import procfs

log = logging.getLogger("images.written")


def collect(pids: list[int], skip: set[str]) -> list[dict]:
    found: dict[str, dict] = {}
    for pid, fd in procfs.fds(pids):
        entry = _describe(pid, fd)
        if entry and entry["path"] not in skip:
            found[entry["path"]] = entry
    return sorted(found.values(), key=lambda e: e["path"])


def _describe(pid: int, fd: str) -> dict | None:
    try:
        path = os.readlink(f"/proc/{pid}/fd/{fd}")
        with open(f"/proc/{pid}/fdinfo/{fd}") as info:
            flags = next(int(line.split()[1], 8) for line in info if line.startswith("flags:"))
        st = os.stat(f"/proc/{pid}/fd/{fd}")
    except (OSError, StopIteration, ValueError):
        return None
    if not stat.S_ISREG(st.st_mode) or flags & os.O_ACCMODE == os.O_RDONLY \
            or not path.startswith("/") or path.endswith(" (deleted)"):
        return None
    return {"path": path, "size": st.st_size, "inode": st.st_ino}


def rollback(entries: list[dict]) -> None:
    for entry in entries:
        try:
            st = os.stat(entry["path"])
        except OSError:
            continue  # CRIU will say what it misses
        if st.st_ino == entry["inode"] and st.st_size > entry["size"]:
            log.warning("%s grew after the checkpoint: cut back from %d to %d bytes",
                        entry["path"], st.st_size, entry["size"])
            os.truncate(entry["path"], entry["size"])
