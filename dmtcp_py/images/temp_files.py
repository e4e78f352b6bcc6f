"""Files and directories the tree keeps in temporary places.

A job's scratch files live where nothing outlives it: Open MPI's session
directory (/tmp/ompi.HOST.UID/pid.N: hwloc's topology file, PMIx's stores,
the PMIx server's Unix socket), MPICH's segments in /dev/shm.  They are gone
after the job is killed or the machine reboots, and were never on another
host; CRIU reopens files by path and rebinds sockets by path, so a restore
fails without them.  The agent copies every regular file the tree holds
open there into the image, and records its named pipes and the directories
that lead to them and to the tree's path-bound Unix sockets.  At restart
the directories and pipes are made again and each file is written back if
it is missing; a file that is
there is left alone (images.written_files cuts it back if it grew).
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

from dmtcp_py import deferred_log, procfs
from dmtcp_py.images import scratch, shared_files

TYPE_CHECKING = False  # (not typing's: ~4 ms of import before a restart's CRIU)
if TYPE_CHECKING:
    from dmtcp_py.images.tree_view import TreeView

log = deferred_log.logger("images.temp")

MAX_FILE = 256 << 20  # larger scratch files are not copied (the log says so)


def _tree_paths(view: TreeView):
    """(path, st) of every fd of the tree that is a path /proc could stat."""
    for f in view.fds:
        if f.target is not None and f.target.startswith("/") and f.st is not None:
            yield f.target, f.st


def _unix_socket_paths(inodes: set[int]) -> set[str]:
    """Paths of the path-bound Unix sockets among inodes (/proc/net/unix)."""
    out = set()
    try:
        with open("/proc/net/unix") as table:
            next(table)
            for line in table:
                fields = line.split()
                if len(fields) >= 8 and int(fields[6]) in inodes and fields[7].startswith("/"):
                    out.add(fields[7])
    except (OSError, StopIteration, ValueError):
        pass
    return out


def _dir_chain(path: str) -> list[str]:
    """The directories from the temporary root (exclusive) down to path's
    parent, outermost first."""
    chain = []
    parent = os.path.dirname(path)
    while parent not in ("/", "") and parent not in scratch.ROOTS:
        chain.append(parent)
        parent = os.path.dirname(parent)
    return chain[::-1]


def save(view: TreeView, image_dir: Path, skip: set[str]) -> dict:
    """Copy the tree's open scratch files (view: its fds, read once per
    checkpoint) into image_dir (temp-<n>.data); return the manifest's
    entry: {"dirs": [...], "files": [...]}."""
    files: dict[str, os.stat_result] = {}
    fifos: dict[str, dict] = {}
    sockets = {ino for f in view.fds if f.target is not None
               and (ino := procfs.socket_inode(f.target)) is not None}
    for target, st in _tree_paths(view):
        if stat.S_ISFIFO(st.st_mode) and scratch.is_scratch(target):
            fifos[target] = {"path": target, "mode": st.st_mode & 0o7777, "uid": st.st_uid,
                             "gid": st.st_gid}
        elif stat.S_ISREG(st.st_mode) and target not in skip \
                and not target.endswith(" (deleted)") and scratch.is_scratch(target):
            files[target] = st
    paths = set(files) | set(fifos) | {p for p in _unix_socket_paths(sockets) if scratch.is_scratch(p)}
    dirs: dict[str, dict] = {}
    for path in sorted(paths):
        for d in _dir_chain(path):
            if d not in dirs:
                try:
                    st = os.stat(d)
                except OSError:
                    continue
                dirs[d] = {"path": d, "mode": st.st_mode & 0o7777, "uid": st.st_uid,
                           "gid": st.st_gid}
    entries = []
    for n, path in enumerate(sorted(files)):
        st = files[path]
        if st.st_size > MAX_FILE:
            log.warning("%s (%d bytes) is too large to keep in the image; it must be "
                        "there at restart", path, st.st_size)
            continue
        entry = shared_files.keep(path, image_dir, f"temp-{n}.data")
        if entry is not None:  # else removed meanwhile: the program has it by no name
            entries.append(entry)
    return {"dirs": sorted(dirs.values(), key=lambda d: d["path"]), "files": entries,
            "fifos": sorted(fifos.values(), key=lambda f: f["path"])}


def restore(saved: dict, image_dir: Path) -> None:
    """Before CRIU restores: make the missing directories and files again."""
    for d in saved.get("dirs", []):
        if not os.path.isdir(d["path"]):
            os.makedirs(d["path"], exist_ok=True)
            os.chmod(d["path"], d["mode"])
            os.chown(d["path"], d["uid"], d["gid"])
    for entry in saved.get("files", []):
        if shared_files.put_back(entry, image_dir, only_if_missing=True):
            log.info("%s was gone: written back from the image", entry["path"])
    for fifo in saved.get("fifos", []):
        if not os.path.lexists(fifo["path"]):
            os.mkfifo(fifo["path"], fifo["mode"])
            os.chmod(fifo["path"], fifo["mode"])
            os.chown(fifo["path"], fifo["uid"], fifo["gid"])
