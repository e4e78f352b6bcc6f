"""A sha256 of every image file, taken when a generation is published and
checked at restart: a flipped byte anywhere in an image is reported with
the file's name, and the program never runs on it.  The memory pages, most
of an image's bytes, are checked while CRIU restores them into processes
that stay stopped until every digest matched (held_back); every other file
before the restart writes or starts anything.

Sealing (hashing, and with it making each file private and durable) runs
after the program is running again, while the files are still in the page
cache; checking reads each file once.  Both work on several files at a time
(hashlib and fsync let go of the GIL).  About 1.7 GB/s per core here.
"""
from __future__ import annotations

import hashlib
import os
import stat
import threading
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from dmtcp_py.errors import ImageError
from dmtcp_py.images.manifest import MANIFEST

CHUNK = 1 << 20
# A file this big is written to disk by a thread of its own while it is
# hashed: for a GiB of pages the two take about as long each.  Smaller
# files are flushed after their hash, by the thread that hashed them.
FLUSH_APART = 4 << 20
# An image smaller than this is sealed by the calling thread alone: for a
# few MiB, starting threads and handing the GIL between them costs more
# than the second core gives back, and with many trees checkpointing at
# once every core is busy anyway.
SEAL_INLINE = 32 << 20


_buffers = threading.local()


def _hash_fd(fd: int) -> str:
    # One buffer per thread, read into again and again: a fresh 1 MiB
    # bytes object per read is a fresh mmap whose every page faults in,
    # and on these VMs a page the host took back faults in ~10x slower.
    buf = getattr(_buffers, "buf", None)
    if buf is None:
        buf = _buffers.buf = memoryview(bytearray(CHUNK))
    digest = hashlib.sha256()
    while n := os.readv(fd, [buf]):
        digest.update(buf[:n])
    return digest.hexdigest()


def _sha256(path: Path) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return _hash_fd(fd)
    finally:
        os.close(fd)


def _workers() -> int:
    return os.cpu_count() or 2


def _parallel(paths: list[Path]) -> list[str]:
    with ThreadPoolExecutor(max_workers=_workers()) as pool:
        return list(pool.map(_sha256, paths))


@dataclass(frozen=True)
class Sealed:
    """What a manifest records of an image's files: name -> size, name -> sha256."""
    sizes: dict[str, int]
    sha256: dict[str, str]


def _seal_one(path: str, flusher: Executor | None) -> tuple[int, str]:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        if stat.S_IMODE(st.st_mode) != 0o600:
            os.fchmod(fd, 0o600)  # whatever CRIU's or the umask's mode was
        flushed = (flusher.submit(os.fsync, fd)
                   if flusher is not None and st.st_size >= FLUSH_APART else None)
        digest = _hash_fd(fd)
        if flushed is None:
            os.fsync(fd)
        else:
            flushed.result()
        return st.st_size, digest
    finally:
        os.close(fd)


def seal(directory: Path) -> Sealed:
    """Make every file of an image but its manifest private (0600) and
    durable, and take its size and sha256: one open and one read of each,
    the biggest first.  Files are not expected to change meanwhile."""
    entries = [e for e in os.scandir(directory)
               if e.is_file(follow_symlinks=False) and e.name != MANIFEST]
    sizes = {e.name: e.stat(follow_symlinks=False).st_size for e in entries}
    entries.sort(key=lambda e: (-sizes[e.name], e.name))
    if sum(sizes.values()) < SEAL_INLINE:
        done = [_seal_one(e.path, None) for e in entries]
    else:
        with ThreadPoolExecutor(max_workers=_workers()) as pool, \
                ThreadPoolExecutor(max_workers=1) as flusher:
            done = list(pool.map(lambda e: _seal_one(e.path, flusher), entries))
    by_name = sorted(zip((e.name for e in entries), done))
    return Sealed(sizes={name: size for name, (size, _) in by_name},
                  sha256={name: digest for name, (_, digest) in by_name})


def held_back(name: str) -> bool:
    """A file checked while CRIU restores, not before: the memory pages.
    CRIU puts them only into the restored processes, which stay stopped
    until the restart's round releases them, and the restart kills them
    instead if a digest did not match.  CRIU's descriptions of processes
    and files, and our copies of files the restart writes back, are
    checked before anything is written."""
    return name.startswith("pages-")


def split(expected: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(checked before the restart, checked while CRIU restores)."""
    before = {n: d for n, d in expected.items() if not held_back(n)}
    return before, {n: d for n, d in expected.items() if held_back(n)}


def verify(directory: Path, expected: dict[str, str],
           consequence: str = "nothing was restarted") -> None:
    """ImageError naming the first file whose content is not what was
    published (an image without digests, from an older version, passes)."""
    verify_all([(directory, expected)], consequence)


def verify_all(images: list[tuple[Path, dict[str, str]]],
               consequence: str = "nothing was restarted") -> None:
    """verify() for several images, their files hashed by one pool: a
    restart of many small trees is not one image after another."""
    files = [(directory, name, digest) for directory, expected in images
             for name, digest in sorted(expected.items())]
    try:
        actual = _parallel([directory / name for directory, name, _ in files])
    except OSError as exc:
        where = next((d for d, n, _ in files if str(d / n) == exc.filename), exc.filename)
        raise ImageError(f"image {where}: cannot read {exc.filename}: {exc.strerror}") from None
    for (directory, name, digest), got in zip(files, actual):
        if got != digest:
            raise ImageError(f"image {directory} is damaged: {name} does not match its "
                             f"checksum (sha256); {consequence}")
