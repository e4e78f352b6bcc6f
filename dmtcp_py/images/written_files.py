"""Files the tree has open for writing, and their length at checkpoint.

A restored program is where it was at the checkpoint, but a file it kept
writing after the checkpoint (a log opened O_APPEND, say) still holds the
later records, which the program will write again.  So the length of each
such file is recorded, and at restart a file that grew is cut back to it.
The tree's stdio handed over at restart is not touched.
"""
from __future__ import annotations

import os
import stat

from dmtcp_py import deferred_log

TYPE_CHECKING = False  # (not typing's: ~4 ms of import before a restart's CRIU)
if TYPE_CHECKING:
    from dmtcp_py.images.tree_view import OpenFd, TreeView

log = deferred_log.logger("images.written")


def collect(view: TreeView, skip: set[str]) -> list[dict]:
    """An entry for each regular file the tree (view: its fds, read once
    per checkpoint) holds open for writing, except the paths in skip."""
    found: dict[str, dict] = {}
    for f in view.fds:
        entry = _describe(f)
        if entry and entry["path"] not in skip:
            found[entry["path"]] = entry
    return sorted(found.values(), key=lambda e: e["path"])


def _describe(f: OpenFd) -> dict | None:
    path, st, flags = f.target, f.st, f.flags
    if path is None or st is None or flags is None:
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
