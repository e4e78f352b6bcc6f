"""CRIU's memory page files, hashed and sent toward the disk while CRIU
still writes them.

Why: after the dump, sealing (integrity.seal) hashes every page file
beside its fsync, and the fsync is most of the time until the images are
durable (~0.2 s for 512 MiB here).  CRIU writes a page file from start to
end, once (it appends what it splices out of the process), so what it has
written is final: a thread of the agent hashes each page file up to where
CRIU got and starts the kernel's writeback of what it hashed
(sync_file_range, which does not wait).  Once CRIU is done, seal() goes on
from where the thread stopped: it hashes the rest of each file, and its
fsync finds most pages on the disk already.  The digest is the one seal()
takes of a whole file (one hash object fed the file in order); seal()
still fsyncs every file before the image is published.

The cost: CRIU, and with it the program's stop, takes longer, since the
thread and the disk writes compete with it (measured here at 512 MiB with
bench_checkpoint.py: `-bc` 0.38-0.44 s against 0.46 s, CRIU's frozen time
0.24-0.27 s against ~0.20 s without a follower).  Hashing alone during the
dump was no gain: it slowed CRIU as much, and the fsync after the dump
took as long as the hash it no longer waited for.  So the agent follows
only when the program's stop does not matter (tree_work._early_writeback).
"""
from __future__ import annotations

import os
import threading
from pathlib import Path

from dmtcp_py.images import integrity
from dmtcp_py.images.writeback import start_writeback

POLL = 0.005              # seconds between looks at a directory with nothing new
WB_BATCH = 8 << 20        # bytes hashed before their writeback is started


class Followed:
    """One page file being hashed: its fd (read position = bytes hashed)
    and its hash object."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.hashed = 0
        self.flushed = 0   # writeback started up to here
        self.hash = integrity.hasher(integrity.ALGORITHM)

    def catch_up(self, writeback: bool) -> int:
        """Hash what was written since; bytes hashed now."""
        before = self.hashed
        self.hashed += integrity.hash_more(self.fd, self.hash)
        if writeback and self.hashed - self.flushed >= WB_BATCH:
            start_writeback(self.fd, self.flushed, self.hashed - self.flushed)
            self.flushed = self.hashed
        return self.hashed - before


class PageFollower:
    """A thread that follows the page files of one directory from start()
    until stop(); then taken() hands them over to integrity.seal()."""

    def __init__(self, directory: Path, writeback: bool = True) -> None:
        self.directory = directory
        self.writeback = writeback
        self.files: dict[str, Followed] = {}
        self.error: OSError | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="page-follower", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop following (CRIU is done or failed); waits for the thread."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def taken(self) -> dict[str, Followed]:
        """The files followed, for seal() (which closes them); none if the
        thread failed (seal then reads every file itself)."""
        files, self.files = self.files, {}
        if self.error is not None:
            _close_all(files)
            return {}
        return files

    def close(self) -> None:
        """The image is dropped: its files' fds go."""
        self.stop()
        _close_all(self.files)
        self.files = {}

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if not self._pass():
                    self._stop.wait(POLL)
        except OSError as exc:  # a file gone or unreadable: seal() sees to it
            self.error = exc

    def _pass(self) -> int:
        """One look at the directory: new page files opened, and every one
        hashed as far as it is written.  Bytes hashed."""
        with os.scandir(self.directory) as entries:
            for entry in entries:
                if integrity.held_back(entry.name) and entry.name not in self.files:
                    fd = os.open(entry.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
                    self.files[entry.name] = Followed(fd)
        return sum(f.catch_up(self.writeback) for f in self.files.values())


def _close_all(files: dict[str, Followed]) -> None:
    for f in files.values():
        os.close(f.fd)
