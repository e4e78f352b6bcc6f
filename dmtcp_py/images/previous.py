"""The published generation, as the next tracked dump takes it: read
while the program runs, not while it waits.

A dump with write tracking leaves the pages nobody wrote to the published
generation (images.tracked_pages), so its checkpoint reads that
generation: the manifest (~200 KiB of JSON for 1 GiB), the index of its
chunks, and each pagemap with its chunks placed.  Read at the checkpoint,
that took ~15 ms of a 1 GiB program's second `-bc` here, ~5 of them
while the program was stopped (the manifest, then the pagemaps for CRIU's
view of the parent, before CRIU started).  The agent reads it instead
once a round is over (agent/tree_work.py), and the next checkpoint takes
it if the published generation is still the one read (its manifest's
inode, size and time: a publication replaces the whole directory).
"""
from __future__ import annotations

import os
from pathlib import Path

from dmtcp_py.images import chunks, tracked_pages
from dmtcp_py.images.manifest import MANIFEST, Manifest

Stamp = tuple[int, int, int]


def stamp(directory: Path) -> Stamp | None:
    """What tells one publication under that name from another."""
    try:
        st = os.stat(directory / MANIFEST)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


class Previous:
    """A published generation (directory, its manifest as read when it
    had the stamp); its chunk index and its pagemaps' plans
    (chunks.parent_pages) are made when first asked for, or all at once
    by warm() (a dump that reads the generation at the checkpoint makes
    them once the program runs again, in finish())."""

    def __init__(self, directory: Path, manifest: Manifest, read_at: Stamp | None) -> None:
        self.directory, self.manifest, self.read_at = directory, manifest, read_at
        self._index: chunks.ChunkIndex | None = None
        self._parents: dict[str, tracked_pages.ParentPages | None] = {}
        self._warm = False

    @property
    def index(self) -> chunks.ChunkIndex:
        if self._index is None:
            self._index = chunks.ChunkIndex(self.directory, self.manifest)
        return self._index

    def parent(self, pagemap: str) -> tracked_pages.ParentPages | None:
        if pagemap not in self._parents:
            self._parents[pagemap] = chunks.parent_pages(self.directory / pagemap, self.manifest)
        return self._parents[pagemap]

    def warm(self) -> Previous:
        _ = self.index  # (made now, not at the checkpoint)
        for path in self.directory.glob("pagemap-*.img"):
            self.parent(path.name)
        self._warm = True
        return self

    def pages_ids(self) -> dict[str, int] | None:
        """pagemap name -> its pages file's id, if warm() read every
        pagemap and each could be; else None."""
        if not self._warm or not self._parents or None in self._parents.values():
            return None
        return {name: got.pages_id for name, got in self._parents.items() if got is not None}

    def current(self) -> bool:
        """Still the generation published under its name."""
        return self.read_at is not None and stamp(self.directory) == self.read_at
