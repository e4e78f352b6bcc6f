"""A digest of every image file, taken when a generation is published and
checked at restart: a flipped byte anywhere in an image is reported with
the file's name, and the program never runs on it.  The memory pages, most
of an image's bytes, are checked while CRIU restores them into processes
that stay stopped until every digest matched (held_back); every other file
before the restart writes or starts anything.

Sealing (hashing, and with it making each file private and durable) runs
after the program is running again, while the files are still in the page
cache; checking reads each file once.  Both work on several files at a time
(the hashes and fsync let go of the GIL).

The digest is XXH3-128 (the xxhash package, 128 bits): it is there to
find damage (a flipped bit, a torn write, a file cut short, a copy that
went wrong), and anyone who could forge a page file could rewrite the
manifest beside it, so a cryptographic hash buys nothing here but time.
Btrfs and ZFS check their blocks the same way (xxhash, fletcher).  Here one
GiB in the page cache took 0.1 s on one core (mapped), against 0.35 s for
BLAKE3 on both cores and 0.65-0.7 s on one, and 0.74 s for sha256 (OpenSSL,
with the CPU's SHA instructions); at a restart the check runs beside CRIU
on these two cores, so that CPU time was the restart's.  Incremental
generations keep BLAKE3 (images.chunks: there a matching digest means
that bytes are reused, not only checked).  Images of earlier versions
carry BLAKE3 or sha256 digests, and are checked with those.

A restart loads this module before CRIU starts (cli/restarting.py):
concurrent.futures is loaded by the functions that use it.
"""
from __future__ import annotations

import ctypes
import os
import stat
import threading
from pathlib import Path

import xxhash

from dmtcp_py.errors import ImageError
from dmtcp_py.frozen import record
from dmtcp_py.images import chunks
from dmtcp_py.images.manifest import MANIFEST, Manifest

TYPE_CHECKING = False  # (not typing's: ~4 ms of import before a restart's CRIU)
if TYPE_CHECKING:
    from concurrent.futures import Executor

ALGORITHM = "xxh3"  # XXH3-128, of the images sealed now
ALGORITHMS = ("xxh3", "blake3", "sha256")  # manifest field names, newest first


def hasher(algorithm: str):
    """A new hash object of the algorithm (update, hexdigest)."""
    if algorithm == "xxh3":
        return xxhash.xxh3_128()
    if algorithm == "blake3":
        return chunks.blake3_hasher()
    if algorithm == "sha256":
        import hashlib  # (OpenSSL's load: 5 ms of a restart of a new image, which needs none)
        return hashlib.sha256()
    raise ValueError(f"unknown digest algorithm {algorithm!r}")


class ChunkedDigest(str):
    """The digest of a data file of chunks (images.chunks): the digest of
    its chunks' digests (of kind: chunks.ALGORITHM or chunks.QUICK), taken
    with the chunks' lengths."""
    lengths: list[int]
    kind: str

    def __new__(cls, digest: str, lengths: list[int], kind: str = chunks.ALGORITHM
                ) -> ChunkedDigest:
        self = super().__new__(cls, digest)
        self.lengths, self.kind = lengths, kind
        return self


def expected(m: Manifest) -> tuple[str, dict[str, str]]:
    """(algorithm, name -> digest) a manifest's files were sealed with; an
    image from before digests has none (its files are then not checked).
    The digests of chunked data files know their chunks' lengths, and are
    the quick ones where the manifest has them."""
    for algorithm in ALGORITHMS:
        digests = getattr(m, algorithm)
        if digests:
            if m.data:
                lengths = chunks.lengths_of(m.data)
                digests = {n: _chunked(n, d, lengths[n], m.data_xxh3) if n in lengths else d
                           for n, d in digests.items()}
            return algorithm, digests
    return ALGORITHM, {}


def _chunked(name: str, digest: str, lengths: list[int], quick: dict[str, str]) -> ChunkedDigest:
    if name in quick:
        return ChunkedDigest(quick[name], lengths, chunks.QUICK)
    return ChunkedDigest(digest, lengths)


def hasher_for(algorithm: str, digest: str):
    """The hash object that checks a file against digest."""
    lengths = getattr(digest, "lengths", None)
    if lengths is None:
        return hasher(algorithm)
    return chunks.ChunkHasher(lengths, digest.kind)


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


# A file this big is hashed over a memory map of it, BLAKE3 by its own
# threads: one GiB of pages in the page cache took 0.35 s that way against
# 0.65-0.7 s mapped or read into a buffer on one thread, and 0.46-0.63 s
# read into 4-16 MiB buffers for BLAKE3's threads (the copy is serial);
# XXH3 0.1 s mapped against 0.16 s read into a buffer, on one core.  The
# seal of a big image is the hash of its one big page file, and a restart
# waits for that file's check (it ran longer than CRIU's restore).
HASH_WIDE_FROM = 64 << 20
_WIDE_STEP = 64 << 20  # bytes per update: each is cut up among BLAKE3's threads

_buffers = threading.local()


def _wide(algorithm: str, expect: str = "") -> bool:
    """Whether a big file of this digest can be hashed by _hash_wide (a
    whole-file digest: not a data file's list of chunk digests)."""
    return algorithm in ("xxh3", "blake3") and getattr(expect, "lengths", None) is None


def _hash_wide(fd: int, size: int, algorithm: str, threads: bool = True) -> str:
    """The digest of fd's first size bytes, read through a memory map
    (chunks.mapped); on every core for BLAKE3 unless not threads."""
    h = chunks.blake3_hasher(threads=threads) if algorithm == "blake3" else hasher(algorithm)
    _feed_mapped(h, fd, 0, size)
    return h.hexdigest()


def _feed_mapped(h, fd: int, offset: int, length: int) -> None:
    """Feed h fd's bytes [offset, offset + length), through a memory map
    (chunks.mapped), _WIDE_STEP at a time."""
    with chunks.mapped(fd, offset, length) as view:
        for at in range(0, length, _WIDE_STEP):
            h.update(view[at:at + _WIDE_STEP])


def hash_more(fd: int, h) -> int:
    """Feed h from fd's position to its end (its position then); the
    bytes fed.  What is there when it begins is hashed through a memory
    map, what a writer appended meanwhile is read after it."""
    total = 0
    at = os.lseek(fd, 0, os.SEEK_CUR)
    end = os.fstat(fd).st_size
    if end - at >= chunks.MAP_FROM:
        _feed_mapped(h, fd, at, end - at)
        os.lseek(fd, end, os.SEEK_SET)
        total = end - at
    # One buffer per thread, read into again and again: a fresh 1 MiB
    # bytes object per read is a fresh mmap whose every page faults in,
    # and on these VMs a page the host took back faults in ~10x slower
    # (blake3's own update_mmap is slower here for that reason).
    buf = getattr(_buffers, "buf", None)
    if buf is None:
        buf = _buffers.buf = memoryview(bytearray(CHUNK))
    while n := os.readv(fd, [buf]):
        h.update(buf[:n])
        total += n
    return total


def _hash_rest(fd: int, h, size: int, algorithm: str | None,
               threads: bool = True) -> str:
    """h's digest once fed fd from its position to its end.  algorithm:
    h is a fresh whole-file hash of it, and a file of size bytes from
    HASH_WIDE_FROM on is hashed by _hash_wide instead (h left unused)."""
    if algorithm is not None and size >= HASH_WIDE_FROM:
        return _hash_wide(fd, size, algorithm, threads)
    hash_more(fd, h)
    return h.hexdigest()


def _digest(path: Path, algorithm: str, expect: str = "", wide: bool = True) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        lengths = getattr(expect, "lengths", None)
        size = os.fstat(fd).st_size
        if wide and lengths is not None and size >= chunks.PARALLEL_FROM:
            # a big data file of chunks, on every core (each a part of its
            # chunks): on one, its check outlasted CRIU's restore of it
            # (1 GiB: ~0.8 s against ~0.6 s here)
            if size != sum(lengths):
                return "incomplete"
            kind = expect.kind
            from concurrent.futures import ThreadPoolExecutor
            with ThreadPoolExecutor(max_workers=_workers()) as pool:
                return chunks.list_digest([d for d, in chunks.hash_chunks(
                    fd, lengths, pool, _workers(), (kind,))], kind)
        return _hash_rest(fd, hasher_for(algorithm, expect), size,
                          algorithm if _wide(algorithm, expect) else None, wide)
    finally:
        os.close(fd)


def _workers() -> int:
    return os.cpu_count() or 2


def _parallel(files: list[tuple[Path, str, str]], wide: bool = True) -> list[str]:
    """The digests of (path, algorithm, expected digest)s, on every core
    (wide: a big file too, else one core a file).  Small files all
    together (an image's but its memory pages, checked before the restore
    begins) are hashed here: a pool, and concurrent.futures loaded for it,
    cost more than it saved, before CRIU started."""
    if sum(os.stat(path).st_size for path, _, _ in files) < chunks.PARALLEL_FROM:
        return [_digest(*f, wide=wide) for f in files]
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=_workers()) as pool:
        return list(pool.map(lambda f: _digest(*f, wide=wide), files))


@record
class Sealed:
    """What a manifest records of an image's files: name -> size, name ->
    digest (ALGORITHM)."""
    sizes: dict[str, int]
    digests: dict[str, str]


def _seal_one(path: str, flusher: Executor | None, durable: bool = True,
              followed=None, algorithm: str = ALGORITHM) -> tuple[int, str]:
    """(size, digest) of one file, made private; a big one made durable
    too (by the flusher while it is hashed, if there is one).  A small
    one is left to seal()'s syncfs.  followed: the file's follow.Followed
    (its fd, read and hashed so far while CRIU wrote it), closed here."""
    if followed is not None:
        fd, h = followed.fd, followed.hash
    else:
        fd, h = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW), hasher(algorithm)
    try:
        st = os.fstat(fd)
        if stat.S_IMODE(st.st_mode) != 0o600:
            os.fchmod(fd, 0o600)  # whatever CRIU's or the umask's mode was
        big = st.st_size >= FLUSH_APART
        flushed = flusher.submit(os.fsync, fd) if flusher is not None and big else None
        whole = followed is None and _wide(algorithm)
        digest = _hash_rest(fd, h, st.st_size, algorithm if whole else None)
        if flushed is not None:
            flushed.result()
        elif big and durable:
            os.fsync(fd)
        return st.st_size, digest
    finally:
        os.close(fd)


_libc: ctypes.CDLL | None = None


def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _syncfs(directory: Path) -> None:
    """syncfs(2) of the file system holding directory: every file written
    there made durable with one flush of the device.  An image is ~40
    small files (CRIU writes one or more per process and kind); an fsync
    of each is a flush each, and with many trees checkpointing at once
    those flushes were a fifth of an agent's time here."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if _libc.syncfs(fd) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"syncfs {directory}: {os.strerror(code)}")
    finally:
        os.close(fd)


def seal(directory: Path, done_already: frozenset[str] = frozenset(),
         each: bool = False, durable: bool = True, followed: dict | None = None,
         algorithm: str = ALGORITHM) -> Sealed:
    """Make every file of an image but its manifest (and done_already:
    chunked data files, see images.chunks) private (0600) and durable, and
    take its size and digest: one open and one read of each, the biggest
    first.  Files are not expected to change meanwhile.  each: small files
    are fsynced one by one (several at once), not with a syncfs, which
    would write every dirty file of the file system (CRIU's page files
    that an incremental generation set aside, see images.chunks).
    durable=False: no fsync (an image that only carries a migration: its
    tree is still there if the host fails meanwhile).  followed: name ->
    follow.Followed, files hashed in part already while CRIU wrote them
    (their fds are closed here, whatever happens; hashed with ALGORITHM).
    algorithm: the digests' (chunks.ALGORITHM for an incremental one)."""
    followed = dict(followed or {})
    try:
        assert not followed or algorithm == ALGORITHM, "followed files are hashed with ALGORITHM"
        return _seal(directory, done_already, each, durable, followed, algorithm)
    finally:
        for f in followed.values():  # not reached: a failure before their turn
            os.close(f.fd)


def _seal(directory: Path, done_already: frozenset[str], each: bool, durable: bool,
          followed: dict, algorithm: str) -> Sealed:
    entries = [e for e in os.scandir(directory)
               if e.is_file(follow_symlinks=False) and e.name != MANIFEST
               and e.name not in done_already]
    sizes = {e.name: e.stat(follow_symlinks=False).st_size for e in entries}
    entries.sort(key=lambda e: (-sizes[e.name], e.name))
    # the work left: what the follower did not hash yet
    left = sum(sizes[e.name] - (followed[e.name].hashed if e.name in followed else 0)
               for e in entries)
    from concurrent.futures import ThreadPoolExecutor
    if left < SEAL_INLINE:
        done = [_seal_one(e.path, None, durable, followed.pop(e.name, None), algorithm)
                for e in entries]
    else:
        with ThreadPoolExecutor(max_workers=_workers()) as pool, \
                ThreadPoolExecutor(max_workers=1) as flusher:
            done = list(pool.map(
                lambda e: _seal_one(e.path, flusher if durable else None, durable,
                                    followed.pop(e.name, None), algorithm), entries))
    small = [e.path for e in entries if sizes[e.name] < FLUSH_APART] if durable else []
    if small and each:
        with ThreadPoolExecutor(max_workers=8) as pool:  # one journal commit for many
            list(pool.map(_fsync_file, small))
    elif small:
        _syncfs(directory)
    by_name = sorted(zip((e.name for e in entries), done))
    return Sealed(sizes={name: size for name, (size, _) in by_name},
                  digests={name: digest for name, (_, digest) in by_name})


def held_back(name: str) -> bool:
    """A file checked while CRIU restores, not before: the memory pages.
    CRIU puts them only into the restored processes, which stay stopped
    until the restart's round releases them, and the restart kills them
    instead if a digest did not match.  CRIU's descriptions of processes
    and files, and our copies of files the restart writes back, are
    checked before anything is written."""
    return name.startswith("pages-")  # the data files of chunks too


def split(expected: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(checked before the restart, checked while CRIU restores)."""
    before = {n: d for n, d in expected.items() if not held_back(n)}
    return before, {n: d for n, d in expected.items() if held_back(n)}


def verify(directory: Path, expected: dict[str, str], algorithm: str = ALGORITHM,
           consequence: str = "nothing was restarted", wide: bool = True) -> None:
    """ImageError naming the first file whose content is not what was
    published (an image without digests, from an older version, passes).
    wide=False: on one core, beside a program that runs meanwhile (a lazy
    restart's: on every core it delayed the program's first tick)."""
    verify_all([(directory, algorithm, expected)], consequence, wide)


def verify_all(images: list[tuple[Path, str, dict[str, str]]],
               consequence: str = "nothing was restarted", wide: bool = True) -> None:
    """verify() for several images (directory, algorithm, digests), their
    files hashed by one pool: a restart of many small trees is not one
    image after another."""
    files = [(directory, algorithm, name, digest) for directory, algorithm, expected in images
             for name, digest in sorted(expected.items())]
    try:
        actual = _parallel([(directory / name, algorithm, digest)
                            for directory, algorithm, name, digest in files], wide)
    except OSError as exc:
        where = next((d for d, _, n, _ in files if str(d / n) == exc.filename), exc.filename)
        raise ImageError(f"image {where}: cannot read {exc.filename}: {exc.strerror}") from None
    for (directory, algorithm, name, digest), got in zip(files, actual):
        if got != digest:
            raise ImageError(f"image {directory} is damaged: {name} does not match its "
                             f"checksum ({getattr(digest, 'kind', algorithm)}); {consequence}")
