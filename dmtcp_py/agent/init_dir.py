"""The working directory of a tree's init when the tree has a PID namespace
of its own.

To dump such a tree CRIU needs a /proc of the tree's namespace.  Its
parasite, inside the namespace's init, makes one: it creates a directory
named proc.crtools in the init's working directory, mounts proc there,
opens it, and detaches and removes it again.  In the program's working
directory that would fail when it is read-only, and fail with EEXIST when
two trees that share it are dumped at once (seen here: a ring of three
trees launched from one directory).  So the init, once it has started the
program, works in a directory of its tree's own, init-<tree id> in the run
directory.  The path is in the image (CRIU restores the init's working
directory) and in the manifest: a restore makes it again, on any host.
The agent removes it once no process works in it (two copies of one
checkpoint share it); one left by a killed agent goes with the run
directory.
"""
from __future__ import annotations

import os

from dmtcp_py.paths import run_dir_name

# Light (os only, no logging or pathlib): dmtcp-launch makes the directory
# before it starts the program, before the agent's modules load.

ENV = "DMTCP_INIT_DIR"  # the init reads it, and takes it out of the program's environment
MOUNTPOINT = "proc.crtools"  # CRIU's name (criu/pie/parasite.c)


def for_tree(tree_id: str) -> str:
    return os.path.join(run_dir_name(), f"init-{tree_id}")


def make(where: str | os.PathLike) -> str:
    """The directory, made if missing (0700: only root makes namespaces)."""
    os.makedirs(where, 0o700, exist_ok=True)
    return os.fspath(where)


def clear_stale(where: str | os.PathLike) -> None:
    """Before a dump: a mount point that a killed criu left would fail every
    later dump (EEXIST).  One in use (another copy's dump under way) is
    mounted on and stays."""
    stale = os.path.join(where, MOUNTPOINT)
    try:
        os.rmdir(stale)
    except OSError:
        return
    import logging
    logging.getLogger("agent.init_dir").warning("removed %s, left by an earlier dump", stale)


def release(where: str | os.PathLike) -> None:
    """After the tree's end: remove the directory, unless a process still
    works in it (a copy of the same checkpoint running beside)."""
    name = os.fspath(where)
    if not os.path.isdir(name):
        return
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/cwd") == name:
                    return
            except OSError:
                continue
    try:
        os.rmdir(name)
    except OSError:
        pass
