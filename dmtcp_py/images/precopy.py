"""Pre-copy: most of a checkpoint's memory written while the program runs.

A round with pre-copy (`--precopy`) has a barrier before SUSPENDED
(State.PRECOPIED).  There each agent whose tree has write tracking
(agent/tracking.py) has CRIU pre-dump it: the tree is frozen only while
CRIU reads its page tables and write-protects the pages written since the
last tracked dump (tens of milliseconds for a GiB here), then runs again
while CRIU reads those pages (process_vm_readv) into a layer: a hidden
directory beside the image, stored like an incremental generation
(images.chunks: its chunks hashed, its new ones written and fsynced,
those of the published generation hard-linked), all while the program
runs.  The round's dump, the program stopped, then takes only the pages
written since the pre-dump, the layer as its parent, and the generation
is stored with the layer as its previous generation: its data files are
hard-linked in, so the generation stands on its own, as every one does,
and the layer's directory is removed once the generation is published or
dropped.

Correct by construction: a page the program writes after its protection,
even while CRIU reads it, is "written" for the dump, which takes it again.
A layer is the parent of the next tracked dump of its tree and of no
other; any dump consumes it (a migration's, which does not use it, too):
after another dump's protection its pages would no longer be what the
program has.
"""
from __future__ import annotations

import os
from pathlib import Path

from dmtcp_py import fault_injection
from dmtcp_py.agent import criu_driver
from dmtcp_py.frozen import record
from dmtcp_py.images import chunks, store
from dmtcp_py.images.checkpoint import PARENT_LINK, PRECOPY_SUFFIX, parent_view
from dmtcp_py.images.manifest import Manifest


@record
class Layer:
    """A pre-copy, stored: the parent of its tree's next dump."""
    directory: Path
    stored: chunks.Stored


def directory_for(ckptdir: Path, name: str, generation: int) -> Path:
    """A new, empty layer directory (0700) beside the image `name`."""
    ckptdir.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = ckptdir / f".{name}.partial-{generation}-{os.getpid()}{PRECOPY_SUFFIX}"
    store.discard(path)
    path.mkdir(mode=0o700)
    return path


def take(directory: Path, final: Path, generation: int, root_pid: int, log_path: Path,
         since: int | None, view: Path, previous: Manifest | None) -> Layer:
    """Pre-dump the running tree (root_pid) into directory (directory_for's)
    and store it there as a layer beside the image final.  since: the
    generation whose dump last protected the tree's pages; previous: the
    published generation's manifest (checkpoint.shareable_previous), if the
    layer may share its chunks: the pre-dump's parent if it is generation
    since.  CriuError, OSError or ImageError if it fails (the directory is
    removed)."""
    try:
        parent = None
        if since is not None and previous is not None and previous.generation == since:
            parent = parent_view(final, view)
        try:
            criu_driver.pre_dump(root_pid, directory, log_path, parent=parent)
        finally:
            if parent is not None:
                store.discard(parent)
            try:
                os.unlink(directory / PARENT_LINK)
            except FileNotFoundError:
                pass
        fault_injection.fail_point("PRECOPY_STORE")
        stored = chunks.store(directory, generation, final if previous is not None else None,
                              previous, tag=f"g{generation}p")
    except BaseException:
        store.discard(directory)
        raise
    return Layer(directory, stored)

