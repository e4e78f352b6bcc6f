"""The working directory of a tree's init when the tree has a PID namespace
of its own.

To dump such a tree CRIU needs a /proc of the tree's namespace.  Its
parasite, inside the namespace's init, makes one: it creates a directory
named proc.crtools in the init's working directory, mounts proc there,
opens it, and detaches and removes it again.  In the program's working
directory that would fail when it is read-only, and fail with EEXIST when
two trees that share it are dumped at once (seen here: a ring of three
trees launched from one directory).  So the init, once it has started the
program, works in a directory of its tree's own: /tmp/.dmtcp-init-<tree
id>.  The path is in the image (CRIU restores the init's working
directory), the same on every host; the agent makes it before a launch and
before a restore, and removes it once no process works in it (two copies
of one checkpoint share it).
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger("agent.init_dir")

BASE = Path("/tmp")
ENV = "DMTCP_INIT_DIR"  # the init reads it, and takes it out of the program's environment
MOUNTPOINT = "proc.crtools"  # CRIU's name (criu/pie/parasite.c)


def path(tree_id: str) -> Path:
    return BASE / f".dmtcp-init-{tree_id}"


def make(tree_id: str) -> Path:
    """The directory, made if missing (0700: only root makes namespaces)."""
    where = path(tree_id)
    where.mkdir(mode=0o700, exist_ok=True)
    return where


def clear_stale(tree_id: str) -> None:
    """Before a dump: a mount point that a killed criu left would fail every
    later dump (EEXIST).  One in use (another copy's dump under way) is
    mounted on and stays."""
    try:
        os.rmdir(path(tree_id) / MOUNTPOINT)
        log.warning("removed %s, left by an earlier dump", path(tree_id) / MOUNTPOINT)
    except OSError:
        pass


def release(tree_id: str) -> None:
    """After the tree's end: remove the directory, unless a process still
    works in it (a copy of the same checkpoint running beside)."""
    where = str(path(tree_id))
    if not os.path.isdir(where):
        return
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/cwd") == where:
                    return
            except OSError:
                continue
    try:
        os.rmdir(where)
    except OSError:
        pass
