"""Incremental generations: CRIU's memory pages kept as chunks that
generations share.

This kernel has no soft-dirty bits.  Where write tracking cannot stand
in for them (agent/tracking.py; see below where it does), CRIU dumps all
the pages, into the partial directory's page cache; then each
pages-N.img is cut into chunks (at most CHUNK bytes, cut where the
dumped *address* is a multiple of CHUNK, so that a mapping that moved
within the file still meets its old chunks), each chunk is hashed
(BLAKE3, on every core), and

- a chunk whose digest the previous generation holds is not written: the
  previous generation's data file that holds it is hard-linked into the new
  generation;
- the other chunks are copied (copy_file_range, in the kernel) into one new
  data file, pages-<N>-g<generation>.img, which is fsynced;
- CRIU's own pages-N.img is set aside and removed after the checkpoint's
  reply (removing 1 GiB took 0.06-0.2 s here), before the kernel ever
  writes it back: dirty pages of a removed file are dropped, writeback
  starts after 30 s or past dirty_background_ratio (here 10% of 24 GiB),
  and the generation's small files are fsynced one by one, not with a
  syncfs that would write it too.

With write tracking CRIU dumps only the pages written since the previous
generation, in address order, and leaves the others to it
(images.tracked_pages).  Its pages file is then mostly whole chunks one
after the other, and it becomes the generation's data file as it lies
(_in_place): copying 52 MiB of it took ~50 ms here, most of a 1 GiB
program's second checkpoint after 5% changed.  Its bytes that are no
chunk as they lie (pages of a chunk that also has pages in the parent)
are listed as chunks nothing uses; such chunks are put together from it
and the parent's data files and appended to it.  Where more than
IN_PLACE_WASTE of it would be such bytes (writes scattered over many
chunks), its chunks are copied into a new data file as above instead.

Why not have CRIU write into /dev/shm instead (never written back): it
dumped 1 GiB there in 0.57-0.65 s against 0.39-0.42 s into ext4's page
cache here, and the program waits for the dump.  The price of ext4: a
syncfs of another tree checkpointing at the same time on the same file
system can write a set-aside file before it is removed.

The first generation keeps CRIU's pages-N.img as its data file, under its
name (a full generation is a plain CRIU image), and a later one that shares
nothing renames it: a full checkpoint writes and hashes what it did before,
nothing more.  Data files' names all start with pages- (integrity.held_back
checks them while CRIU restores).

Hard links, not a shared chunk store: every generation is a directory that
holds every byte it needs, so the file system counts the references.
Deleting or pruning a generation can never break another, a crash midway
leaves only a partial directory, and replicas, `dmtcp-image send` and the
restart script copy a generation's files as before (the copies are whole).
A data file stays alive while a kept generation uses one of its chunks; a
generation that would keep less than half of an old data file alive copies
those chunks again instead (compaction), so a generation never holds more
than about twice its memory.

The manifest says, per data file, its chunks ([length, digest], one after
the other: `data`) and, per pages-N.img CRIU restores from, which chunks
make it, in order ([data file, index]: `pages`).  A data file's digest in
the manifest's blake3 map is the digest of its chunk digests
(list_digest), so its chunks' hashes are its checksum and a full
checkpoint hashes each byte once.  Each chunk is hashed with XXH3 too,
while it is in memory: a restart checks the data files with the list
digest of those (data_xxh3), which costs a seventh of BLAKE3's CPU.  At
restore CRIU reads a hidden view
directory beside the image (readable): hard links when a data file is the
whole pages file, else the data files as they are, through CRIU's parent
images (images.page_chain).  Only a pagemap that does not fit its chunks
has its pages file put together again (a copy of the chunks, in the
kernel, in /dev/shm when memory has room twice over).  The view is removed
by a thread of its own once CRIU restored.

A restart loads this module before CRIU starts (cli/restarting.py): shutil
and concurrent.futures are loaded by the functions that use them.
"""
from __future__ import annotations

import copy
import errno
import mmap
import os
import threading
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from dmtcp_py import deferred_log
from dmtcp_py.errors import ImageError
from dmtcp_py.frozen import field, mutable_record
from dmtcp_py.images import compress
from dmtcp_py.images.manifest import Manifest

TYPE_CHECKING = False  # (not typing's: ~4 ms of import before a restart's CRIU)
if TYPE_CHECKING:
    from concurrent.futures import Executor

    from dmtcp_py.images import tracked_pages as tp

log = deferred_log.logger("images.chunks")

CHUNK = 1 << 20
PAGE = 4096


# The digest of chunks and of the generations that hold them: a chunk whose
# digest matches is not written again but shared, so two contents with one
# digest must be out of reach (a cryptographic hash), unlike the damage
# check of whole generations (integrity.ALGORITHM).
ALGORITHM = "blake3"
# What a restart checks a data file with: the same list of its chunks'
# digests, by a fast hash (damage, not identity; images.integrity.ALGORITHM
# of whole generations).  BLAKE3 of a GiB took ~1.1 s of CPU here, as much
# as CRIU's restore of it, beside which it runs; XXH3 ~0.15 s.
QUICK = "xxh3"


def blake3_hasher(data=b"", *, threads: bool = False):
    """A BLAKE3 hash object (threads: BLAKE3's own, on every core).  The
    module loads at the first use: a restart of a plain image, which needs
    none, saves its ~2 ms before CRIU starts."""
    import blake3
    return blake3.blake3(data, max_threads=blake3.blake3.AUTO if threads else 1)


def chunk_hasher(kind: str = ALGORITHM, data=b""):
    """A hash object of one chunk: ALGORITHM or QUICK."""
    if kind == QUICK:
        import xxhash
        return xxhash.xxh3_128(data)
    return blake3_hasher(data)


def list_digest(digests: list[str], kind: str = ALGORITHM) -> str:
    """The checksum of a data file: the digest of its chunks' digests."""
    h = chunk_hasher(kind, b"dmtcp-chunks\0")
    for d in digests:
        h.update(bytes.fromhex(d))
    return h.hexdigest()


class ChunkHasher:
    """hashlib-like (update, hexdigest): the list digest of a stream cut
    into chunks of the given lengths; anything else than exactly their sum
    gives a digest that matches nothing."""

    def __init__(self, lengths: list[int], kind: str = ALGORITHM) -> None:
        self.lengths, self.kind, self.index, self.digests = lengths, kind, 0, []
        self.left = lengths[0] if lengths else 0
        self.current = chunk_hasher(kind)
        self.overflow = False

    def update(self, data) -> None:
        view = memoryview(data)
        while view:
            if self.index >= len(self.lengths):
                self.overflow = True
                return
            n = min(self.left, len(view))
            self.current.update(view[:n])
            view, self.left = view[n:], self.left - n
            if self.left == 0:
                self.digests.append(self.current.hexdigest())
                self.index += 1
                self.current = chunk_hasher(self.kind)
                if self.index < len(self.lengths):
                    self.left = self.lengths[self.index]

    def hexdigest(self) -> str:
        if self.overflow or self.index != len(self.lengths):
            return "incomplete"
        return list_digest(self.digests, self.kind)


def lengths_of(data: dict) -> dict[str, list[int]]:
    """data file -> its chunk lengths, from a manifest's `data`."""
    return {name: [int(c[0]) for c in chunks] for name, chunks in data.items()}


# ---- cutting CRIU's pages files --------------------------------------------------------

def _pagemaps(directory: Path) -> dict[str, tuple[Path, object]]:
    """pages-N.img -> (its pagemap's path, the pagemap read), for every
    pagemap of the dump that could be read."""
    from dmtcp_py.images import page_chain
    out = {}
    for path in directory.glob("pagemap*.img"):
        pm = page_chain.read_pagemap(path)
        if pm is not None:
            out[f"pages-{pm.pages_id}.img"] = (path, pm)
    return out


def _runs(pm) -> list[tuple[int, int]]:
    """[(address, bytes)] of the pages a pagemap's pages file holds, in file order."""
    from dmtcp_py.images import page_chain
    return [(e.vaddr, e.length) for e in pm.entries if page_chain.present(e)]


def _leaves_to_parent(pm) -> bool:
    """The pagemap of a dump with write tracking: entries in the parent."""
    from dmtcp_py.images import page_chain
    return any(e.flags & page_chain.PE_PARENT for e in pm.entries)


def cut(size: int, runs: list[tuple[int, int]] | None) -> list[int]:
    """Chunk lengths of a pages file of size bytes: cut where the address
    is a multiple of CHUNK.  Without runs that add up to size (an unread
    pagemap), at file offsets."""
    if not runs or sum(n for _, n in runs) != size:
        runs = [(0, size)]
    lengths = []
    for addr, n in runs:
        while n > 0:
            step = min(n, CHUNK - addr % CHUNK)
            lengths.append(step)
            addr, n = addr + step, n - step
    return lengths


# A pages file this big is hashed by every core, each a part of its chunks
# (blake3 lets go of the GIL): 1 GiB took 0.17-0.27 s on two threads here
# against 0.32-0.38 s on one.
PARALLEL_FROM = 8 << 20
# a tracked dump's changed chunks hashed ahead of the one being stored
HASH_AHEAD = 8
_buffers = threading.local()


# From this many bytes on, a file is hashed through a memory map of it,
# not read into a buffer: the copy out of the page cache cost more than
# XXH3 itself (a 7 MiB page file: 4.7-6.1 ms of CPU read, 1.1-1.3 ms
# mapped).  Below, the map's own system calls cost about what the copy does.
MAP_FROM = 256 << 10


@contextmanager
def mapped(fd: int, offset: int, length: int) -> Iterator[memoryview]:
    """fd's bytes [offset, offset + length), mapped read-only.  They must be
    there, and stay: a file cut shorter while mapped ends the process with
    SIGBUS (CRIU only appends to a page file, and images are not written
    once sealed).  The caller keeps no slice of the view past the block."""
    base = offset - offset % mmap.ALLOCATIONGRANULARITY  # (a map begins on a page)
    with mmap.mmap(fd, offset + length - base, prot=mmap.PROT_READ, offset=base) as whole:
        with memoryview(whole) as view:
            part = view[offset - base:]
            try:
                yield part
            finally:
                part.release()


def _hash_range(fd: int, offset: int, lengths: list[int],
                kinds: tuple[str, ...]) -> list[tuple[str, ...]]:
    total = sum(lengths)
    if total >= MAP_FROM:
        size = os.fstat(fd).st_size
        if size < offset + total:
            raise OSError(f"a pages file is shorter than its chunks at {size}")
        digests = []
        with mapped(fd, offset, total) as view:
            at = 0
            for n in lengths:
                with view[at:at + n] as chunk:
                    digests.append(tuple(chunk_hasher(kind, chunk).hexdigest()
                                         for kind in kinds))
                at += n
        return digests
    buf = getattr(_buffers, "buf", None)
    if buf is None:  # one per thread, read into again and again (see integrity.hash_more)
        buf = _buffers.buf = memoryview(bytearray(CHUNK))
    digests = []
    for n in lengths:
        got = 0
        while got < n:
            m = os.preadv(fd, [buf[got:n]], offset + got)
            if m <= 0:
                raise OSError(f"a pages file is shorter than its chunks at {offset + got}")
            got += m
        digests.append(tuple(chunk_hasher(kind, buf[:n]).hexdigest() for kind in kinds))
        offset += n
    return digests


def hash_chunks(fd: int, lengths: list[int], pool: Executor | None = None,
                workers: int = 1, kinds: tuple[str, ...] = (ALGORITHM, QUICK)
                ) -> list[tuple[str, ...]]:
    """The digests (one of each kind) of each chunk of a file; a big one
    on `workers` threads of pool, each a contiguous part."""
    total = sum(lengths)
    if os.fstat(fd).st_size != total:
        raise OSError(f"a pages file has {os.fstat(fd).st_size} bytes, its chunks {total}")
    if pool is None or workers < 2 or total < PARALLEL_FROM:
        return _hash_range(fd, 0, lengths, kinds)
    parts, start, offset, done = [], 0, 0, 0
    for i, n in enumerate(lengths):
        done += n
        if done * workers >= total * (len(parts) + 1) or i == len(lengths) - 1:
            parts.append(pool.submit(_hash_range, fd, offset, lengths[start:i + 1], kinds))
            offset, start = done, i + 1
    return [d for part in parts for d in part.result()]


# ---- storing a generation -------------------------------------------------------------

@mutable_record
class Stored:
    """What store() made of a partial directory's pages files."""
    data: dict[str, list[list]] = field(default_factory=dict)   # manifest `data`
    pages: dict[str, list[list]] = field(default_factory=dict)  # manifest `pages`
    # data file -> the QUICK list digest of its chunks (manifest `data_xxh3`)
    quick: dict[str, str] = field(default_factory=dict)
    written: int = 0   # bytes written (and fsynced) into new data files
    shared: int = 0    # bytes of chunks linked from the previous generation

    # (read like a manifest's where a later store() shares from these:
    # a pre-copy's, images.precopy)
    compression = ""

    @property
    def data_xxh3(self) -> dict[str, str]:
        return self.quick

    @property
    def digests(self) -> dict[str, str]:
        return {name: list_digest([c[1] for c in chunks]) for name, chunks in self.data.items()}

    @property
    def sizes(self) -> dict[str, int]:
        return {name: sum(int(c[0]) for c in chunks) for name, chunks in self.data.items()}


class DamagedParent(ImageError):
    """A chunk of the previous generation that the new one would take
    bytes of is not what its digest says."""


class ChunkIndex:
    """The chunks of the previous generation, by digest."""

    def __init__(self, directory: Path | None, m: Manifest | Stored | None) -> None:
        self.directory = directory
        self.where: dict[str, tuple[str, int, int]] = {}  # digest -> (file, offset, length)
        self.sizes: dict[str, int] = {}
        self.chunk_lists: dict[str, list[tuple[int, str]]] = {}
        self.starts: dict[str, list[int]] = {}  # data file -> where each of its chunks starts
        self.quick: dict[str, str] = {}  # data file -> its QUICK digest, if it has one
        self._lock = threading.Lock()
        self._linked: set[str] = set()
        self._sound: set[tuple[str, int]] = set()  # (data file, chunk) read and found whole
        if directory is None or m is None or not m.data or m.compression:
            return
        self.quick = dict(m.data_xxh3)
        for name, chunks in m.data.items():
            offset = 0
            self.chunk_lists[name] = [(int(n), str(d)) for n, d in chunks]
            self.starts[name] = []
            for length, digest in chunks:
                self.where.setdefault(digest, (name, offset, int(length)))
                self.starts[name].append(offset)
                offset += int(length)
            self.sizes[name] = offset

    def __bool__(self) -> bool:
        return bool(self.where)

    def fresh(self) -> ChunkIndex:
        """The same chunks for another store(): none linked or checked yet
        (an index made while the program ran, used by the next checkpoint)."""
        other = copy.copy(self)
        other._lock, other._linked, other._sound = threading.Lock(), set(), set()
        return other

    def check(self, name: str, offset: int, fd: int) -> None:
        """Before bytes at offset of its data file name go into a chunk of
        the new generation: the previous generation's chunk that holds them
        is read whole, once, and must have its digest; else they would be
        taken, damaged, under a new chunk's digest, which nothing would
        ever find wrong.  DamagedParent if it has not."""
        k = bisect_right(self.starts[name], offset) - 1
        if (name, k) in self._sound:
            return
        length, digest = self.chunk_lists[name][k]
        got, = _hash_range(fd, self.starts[name][k], [length], (ALGORITHM,))
        if got[0] != digest:
            raise DamagedParent(f"{name} of the previous generation is damaged (its chunk "
                                f"at byte {self.starts[name][k]} does not match its digest)")
        with self._lock:
            self._sound.add((name, k))

    def link(self, name: str, partial: Path) -> None:
        """Hard-link a data file of the previous generation into partial,
        once (several pages files may share it)."""
        assert self.directory is not None
        with self._lock:
            if name not in self._linked:
                os.link(self.directory / name, partial / name)
                self._linked.add(name)


def store(partial: Path, generation: int, previous: Path | None,
          previous_manifest: Manifest | Stored | None, set_aside: Path | None = None,
          tag: str | None = None, *, index: ChunkIndex | None = None,
          parents: Callable[[str], tp.ParentPages | None] | None = None) -> Stored:
    """Replace every pages-N.img of partial by data files in partial (new
    ones fsynced, old ones linked from previous), as the module says.
    previous_manifest: the previous generation's, or what store() made of
    a pre-copy (images.precopy) in previous.  New data files are named
    pages-N-<tag>.img (default g<generation>).
    With a previous generation to share with, CRIU's files are moved out of
    the way first: into set_aside (a new directory on the same file system,
    for the caller to remove once it replied), else to hidden names in
    partial, removed here.  index, parents: previous and previous_manifest
    as ChunkIndex and parent_pages (by pagemap name) make them, made
    before (images.previous), else made here."""
    index = index.fresh() if index is not None else ChunkIndex(previous, previous_manifest)
    if parents is None:
        def parents(name: str) -> tp.ParentPages | None:
            assert index is not None and index.directory is not None
            return parent_pages(index.directory / name, previous_manifest)
    pagemaps = _pagemaps(partial)
    runs = {name: _runs(pm) for name, (_, pm) in pagemaps.items()}
    # pagemaps that leave pages in the parent (a dump with write tracking)
    tracked = {name: got for name, got in pagemaps.items() if _leaves_to_parent(got[1])}
    if tracked and not index:
        raise ImageError("CRIU left pages to a previous generation that cannot share them")
    pages_files = sorted(partial.glob("pages-*.img"), key=lambda p: -p.stat().st_size)
    if index:  # out of the way of the previous generation's files, linked in
        if set_aside is not None:
            set_aside.mkdir(mode=0o700)
        moved = []
        for p in pages_files:
            moved.append(set_aside / p.name if set_aside is not None
                         else p.with_name(f".dumped-{p.name}"))
            os.rename(p, moved[-1])
        pages_files = moved
    from concurrent.futures import ThreadPoolExecutor
    out = Stored()
    tag = tag or f"g{generation}"
    workers = os.cpu_count() or 2
    with ThreadPoolExecutor(max_workers=workers) as pool, \
            ThreadPoolExecutor(max_workers=1) as flusher:
        # one file after the other, the biggest first, each on every core
        results = [
            _store_one_tracked(partial, tag, p, *tracked[name], index, previous_manifest,
                               parents(tracked[name][0].name), flusher, pool)
            if name in tracked else
            _store_one(partial, tag, p, runs.get(name), index, flusher, pool, workers)
            for p in pages_files
            for name in [p.name.removeprefix(".dumped-")]]
    for pages_name, chunks_of, quick, order, written, shared in results:
        out.data.update(chunks_of)
        out.quick.update(quick)
        out.pages[pages_name] = order
        out.written += written
        out.shared += shared
    return out


def _whole_file(partial: Path, pages: Path, own: str, lengths: list[int], flusher: Executor,
                pool: Executor, workers: int, known: list[tuple[str, ...]] | None = None
                ) -> list[tuple[str, ...]]:
    """CRIU's file becomes the data file own, durable; its chunks' digests
    (hash_chunks'; known: taken already): renamed, flushed while it is
    hashed (copied, in the kernel, if it is on another file system)."""
    if pages.parent != partial:
        try:
            os.rename(pages, partial / own)
            pages = partial / own
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
    if pages.parent == partial:
        if pages.name != own:
            os.rename(pages, partial / own)
        fd = os.open(partial / own, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fchmod(fd, 0o600)
            flushed = flusher.submit(os.fsync, fd)
            digests = known or hash_chunks(fd, lengths, pool, workers)
            flushed.result()
        finally:
            os.close(fd)
        return digests
    src = os.open(pages, os.O_RDONLY | os.O_CLOEXEC)
    out = os.open(partial / own, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        digests = known or hash_chunks(src, lengths, pool, workers)
        _copy(src, 0, out, sum(lengths))
        os.fsync(out)
    finally:
        os.close(src)
        os.close(out)
    return digests


def _store_one(partial: Path, tag: str, pages: Path, runs, index: ChunkIndex,
               flusher: Executor, pool: Executor, workers: int):
    """(pages name, {data file: chunks}, {data file: QUICK digest}, its
    order, bytes written, bytes shared) for one of CRIU's pages files (in
    a scratch directory, or in partial, renamed .dumped-pages-N.img when
    there is a previous generation)."""
    size = pages.stat().st_size
    lengths = cut(size, runs)
    pages_name = pages.name.removeprefix(".dumped-")
    own = f"{pages_name[:-len('.img')]}-{tag}.img"
    if not index:  # the first generation: CRIU's file is the data file
        both = _whole_file(partial, pages, pages_name, lengths, flusher, pool, workers)
        return (pages_name, {pages_name: [[n, d] for n, (d, _) in zip(lengths, both)]},
                {pages_name: list_digest([q for _, q in both], QUICK)},
                [[pages_name, i] for i in range(len(lengths))], size, 0)
    fd = os.open(pages, os.O_RDONLY | os.O_CLOEXEC)
    try:
        both = hash_chunks(fd, lengths, pool, workers)
        digests = [d for d, _ in both]
        positions: dict[str, tuple[str, int]] = {}  # digest -> (file, index) in this generation
        keep, chunks = _keep_shared(index, set(digests), partial, positions)
        if not keep:  # nothing shared: all of CRIU's file is new
            os.close(fd)
            fd = -1
            _whole_file(partial, pages, own, lengths, flusher, pool, workers, both)
            return (pages_name, {own: [[n, d] for n, d in zip(lengths, digests)]},
                    {own: list_digest([q for _, q in both], QUICK)},
                    [[own, i] for i in range(len(lengths))], size, 0)
        new: list[list] = []
        new_quick: list[str] = []
        order, written, shared = [], 0, 0
        out = os.open(partial / own, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            offset = 0
            for n, (d, q) in zip(lengths, both):
                if d in positions:
                    where = positions[d]
                    shared += n if where[0] != own else 0
                else:
                    _copy(fd, offset, out, n)
                    where = positions[d] = (own, len(new))
                    new.append([n, d])
                    new_quick.append(q)
                    written += n
                order.append([where[0], where[1]])
                offset += n
            os.fsync(out)
        finally:
            os.close(out)
        quick = _own_file(partial, own, new, new_quick, index, keep, chunks)
        return pages_name, chunks, quick, order, written, shared
    finally:
        if fd >= 0:
            os.close(fd)
        if pages.parent == partial and pages.exists():
            pages.unlink()  # before the kernel writes it back: never on the disk


def _keep_shared(index: ChunkIndex, digests: set[str], partial: Path,
                 positions: dict[str, tuple[str, int]]) -> tuple[set[str], dict[str, list[list]]]:
    """The previous generation's data files worth keeping alive for the
    chunks of these digests (at least half of a file's bytes live), hard-
    linked into partial, their chunks put into positions (digest -> (file,
    index)) where not there yet: (their names, their chunk lists)."""
    live: dict[str, int] = {}
    for d in digests:
        if d in index.where:
            name, _, n = index.where[d]
            live[name] = live.get(name, 0) + n
    keep = {name for name, n in live.items() if 2 * n >= index.sizes[name]}
    chunks: dict[str, list[list]] = {}
    for name in sorted(keep):
        chunks[name] = []
        for i, (n, d) in enumerate(index.chunk_lists[name]):
            positions.setdefault(d, (name, i))
            chunks[name].append([n, d])
        index.link(name, partial)
    return keep, chunks


def _own_file(partial: Path, own: str, new: list[list], new_quick: list[str], index: ChunkIndex,
              keep: set[str], chunks: dict[str, list[list]]) -> dict[str, str]:
    """The generation's new data file listed in chunks (or removed, if it
    got no chunk): the QUICK digests of the data files it holds."""
    quick = {name: index.quick[name] for name in keep if name in index.quick}
    if new:
        chunks[own] = new
        quick[own] = list_digest(new_quick, QUICK)
    else:
        os.unlink(partial / own)
    return quick


# CRIU's new pages file of a tracked dump is kept as the generation's data
# file when at most this part of it is bytes of no chunk (an extra copy on
# the disk), else its chunks are copied into a new one
IN_PLACE_WASTE = 1 / 4


def parent_pages(path: Path, previous: Manifest | Stored) -> tp.ParentPages | None:
    """The pagemap at path of the previous generation (previous: its
    manifest) with its chunks placed; None if it cannot be read or its
    pages file is not the manifest's."""
    from dmtcp_py.images import page_chain as pc, tracked_pages as tp
    pm = pc.read_pagemap(path)
    if pm is None or f"pages-{pm.pages_id}.img" not in previous.pages:
        return None
    entries = [e for e in pm.entries if pc.present(e)]
    lengths_by_file = lengths_of(previous.data)
    order = previous.pages[f"pages-{pm.pages_id}.img"]
    placed = tp.placed_chunks(
        tp.chunk_spans([(a, n) for a, n, _ in entries],
                       [lengths_by_file[f][i] for f, i in order]),
        order, lengths_by_file)
    cuts = sorted({a for a, _, _ in entries} | {a + n for a, n, _ in entries})
    return tp.ParentPages(pm.pages_id, entries, [a for a, _, _ in entries], cuts,
                          tp.parent_of(placed))


def _tracked_chunks(pagemap: Path, pm, parent: tp.ParentPages | None):
    """The plan of a tracked dump's pages file (images.tracked_pages): its
    pagemap's entries made whole, and per chunk of the generation, in
    address order, (length, pieces, the parent's chunk it is or None).
    parent: the previous generation's pagemap of that name."""
    from dmtcp_py.images import tracked_pages as tp
    if parent is None:
        raise ImageError(f"{pagemap.name}: CRIU left pages to a previous generation that "
                         "does not hold them")

    def parent_flags(addr: int) -> int:
        k = bisect_right(parent.addrs, addr) - 1
        return parent.entries[k][2] if k >= 0 else 0

    whole, parts = tp.whole_entries(
        pm.entries, parent_flags,
        parent.cuts)
    runs = [(a, n) for a, n, _ in whole]
    spans = tp.chunk_spans(runs, cut(sum(n for _, n in runs), runs)) if runs else []
    try:
        return whole, tp.chunks_of(spans, parts, parent.chunks)
    except KeyError as exc:
        raise ImageError(f"{pagemap.name}: {exc.args[0]}") from None


def _in_place(partial: Path, pages: Path, own: str, planned: list):
    """CRIU's file as the data file own, if little of it is no chunk's
    (IN_PLACE_WASTE): its segments (tracked_pages.in_place) and an fd to
    append to; None: its chunks are to be copied."""
    from dmtcp_py.images import tracked_pages as tp
    size = pages.stat().st_size
    try:
        segments = tp.in_place([pieces_ for _, pieces_, _ in planned], size, CHUNK)
    except ValueError as exc:
        log.debug("%s: copied, not kept in place: %s", pages.name, exc)
        return None
    waste = sum(s.length for s in segments if s.chunk is None)
    if not size or waste > size * IN_PLACE_WASTE:
        log.debug("%s: chunks copied: %d of its %d bytes are no chunk's", pages.name, waste, size)
        return None
    try:
        os.rename(pages, partial / own)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        return None
    fd = os.open(partial / own, os.O_RDWR | os.O_CLOEXEC)
    os.fchmod(fd, 0o600)
    os.lseek(fd, 0, os.SEEK_END)  # chunks put together go after CRIU's pages
    return segments, fd


def _store_one_tracked(partial: Path, tag: str, pages: Path, pagemap: Path, pm,
                       index: ChunkIndex, previous: Manifest | Stored,
                       parent: tp.ParentPages | None, flusher: Executor, pool: Executor):
    """_store_one for a pages file CRIU wrote with write tracking: only the
    written pages, the rest in the parent (images.tracked_pages).  Its
    pagemap is made whole in partial; a chunk the parent had unchanged is
    taken as it is (not read, not hashed).  CRIU's file, which holds the
    written pages in address order, mostly as whole chunks, becomes the
    data file as it lies (_in_place; or its chunks are copied into a new
    one); any other chunk is put together from CRIU's pages and the
    parent's data files, hashed, and shared or appended to the data file."""
    from dmtcp_py.images import page_chain as pc, tracked_pages as tp
    from dmtcp_py.images.writeback import start_writeback
    whole, planned = _tracked_chunks(pagemap, pm, parent)
    pages_name = f"pages-{pm.pages_id}.img"
    own = f"{pages_name[:-len('.img')]}-{tag}.img"
    kept = _in_place(partial, pages, own, planned)
    segments = kept[0] if kept is not None else []
    source = partial / own if kept is not None else pages   # where CRIU's pages are now

    sources: dict[str | None, int] = {}
    opening = threading.Lock()

    def fd_of(name: str | None) -> int:
        with opening:
            if name not in sources:
                sources[name] = os.open(source if name is None else index.directory / name,
                                        os.O_RDONLY | os.O_CLOEXEC)
            return sources[name]

    def read(pieces_: list) -> bytearray:
        buf = bytearray(sum(p.length for p in pieces_))
        at = 0
        for p in pieces_:
            if p.source is not None:
                index.check(p.source, p.offset, fd_of(p.source))
            view = memoryview(buf)[at:at + p.length]
            got = 0
            while got < p.length:
                n = os.preadv(fd_of(p.source), [view[got:]], p.offset + got)
                if n <= 0:
                    raise ImageError(f"{pagemap.name}: a pages file is shorter than its pagemap")
                got += n
            at += p.length
        return buf

    def hashed(pieces_: list) -> tuple[str, str, bytearray | None]:
        """A chunk's two digests; its bytes too if they must be written
        from memory (a chunk all in CRIU's file is kept or copied in the kernel)."""
        if len(pieces_) == 1 and pieces_[0].source is None:
            (d, q), = _hash_range(fd_of(None), pieces_[0].offset, [pieces_[0].length],
                                  (ALGORITHM, QUICK))
            return d, q, None
        buf = read(pieces_)
        return (chunk_hasher(ALGORITHM, buf).hexdigest(), chunk_hasher(QUICK, buf).hexdigest(),
                buf)

    # the data file's chunks: with CRIU's file kept, its segments first
    new: list[list] = [[s.length, ""] for s in segments]
    new_quick: list[str] = ["" for _ in segments]
    segment_of = {s.chunk: k for k, s in enumerate(segments) if s.chunk is not None}
    positions: dict[str, tuple[str, int]] = {}  # digest -> (file, index) in this generation
    # per chunk: its length, digest and pieces (where its bytes are)
    chunk_digests: list[tuple[int, str, list]] = []
    written = shared = 0
    if kept is not None:
        out = kept[1]
        written = sum(s.length for s in segments)
        flushing = flusher.submit(start_writeback, out, 0, written)  # (while it is hashed)
        no_chunk = [(k, pool.submit(_hash_range, out, s.offset, [s.length], (ALGORITHM, QUICK)))
                    for k, s in enumerate(segments) if s.chunk is None]
    else:
        out = os.open(partial / own, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        flushing, no_chunk = None, []
    try:
        ahead: deque = deque()  # chunks whose hashing was begun, in order

        def take_one() -> None:
            nonlocal written
            i, n, pieces_, known = ahead.popleft()
            if isinstance(known, str):
                digest = known
            else:
                digest, quick_digest, buf = known.result()
                if i in segment_of:  # in place already
                    k = segment_of[i]
                    new[k], new_quick[k] = [n, digest], quick_digest
                    positions.setdefault(digest, (own, k))
                elif digest not in index.where and digest not in positions:
                    if buf is None:
                        _copy(fd_of(None), pieces_[0].offset, out, n)
                    else:
                        _write_all(out, buf)
                    # on its way to the disk while the next are hashed
                    start_writeback(out, written, n)
                    positions[digest] = (own, len(new))
                    new.append([n, digest])
                    new_quick.append(quick_digest)
                    written += n
            chunk_digests.append((n, digest, pieces_))

        try:
            for i, (n, pieces_, same) in enumerate(planned):
                if same is not None and not ahead:  # (most of them: the parent's, as it was)
                    chunk_digests.append((n, previous.data[same.file][same.index][1], pieces_))
                    continue
                # the chunks that changed are hashed on every core (blake3
                # lets go of the GIL), a few ahead: their bytes wait in memory
                ahead.append((i, n, pieces_, previous.data[same.file][same.index][1]
                              if same is not None else pool.submit(hashed, pieces_)))
                if len(ahead) > HASH_AHEAD:
                    take_one()
            while ahead:
                take_one()
            for k, job in no_chunk:
                (d, q), = job.result()
                new[k], new_quick[k] = [segments[k].length, d], q
        finally:
            for *_, known in ahead:  # (a failure: none may read a closed fd)
                if not isinstance(known, str) and not known.cancel():
                    known.exception()
            for _, job in no_chunk:
                if not job.cancel():
                    job.exception()
            if flushing is not None:
                flushing.exception()
        keep, chunks = _keep_shared(index, {d for _, d, _ in chunk_digests if d not in positions},
                                    partial, positions)
        order_out = []
        for n, d, pieces_ in chunk_digests:
            if d not in positions:  # in an old data file not kept: copied again
                name, offset, _ = index.where[d]
                buf = read([tp.Piece(n, name, offset)])
                _write_all(out, buf)
                positions[d] = (own, len(new))
                new.append([n, d])
                new_quick.append(chunk_hasher(QUICK, buf).hexdigest())
                written += n
            elif positions[d][0] != own:
                shared += n
            order_out.append(list(positions[d]))
        os.fsync(out)
    finally:
        os.close(out)
        for fd in sources.values():
            os.close(fd)
    quick = _own_file(partial, own, new, new_quick, index, keep, chunks)
    whole_map = pagemap.with_name(f".whole-{pagemap.name}")
    pc.write_pagemap(whole_map, pm.prefix, pm.pages_id, whole)
    os.replace(whole_map, pagemap)
    if pages.parent == partial and pages.exists():
        pages.unlink()
    return pages_name, chunks, quick, order_out, written, shared


def _write_all(fd: int, data) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _copy(src: int, offset: int, dst: int, n: int) -> None:
    """n bytes of src from offset, appended to dst, in the kernel."""
    while n:
        try:
            done = os.copy_file_range(src, dst, n, offset)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                raise
            done = os.sendfile(dst, src, offset, n)   # another file system
        if done <= 0:
            raise OSError(f"a pages file ended {n} bytes early")
        offset, n = offset + done, n - done


# ---- restore ------------------------------------------------------------------------

def _whole(m: Manifest, pages_name: str) -> str | None:
    """The data file that is exactly pages_name (every chunk, in order), if one is."""
    order = m.pages[pages_name]
    if not order:
        return None
    name = order[0][0]
    if len(order) == len(m.data.get(name, ())) and \
            all(o[0] == name and int(o[1]) == i for i, o in enumerate(order)):
        return name
    return None


def _place(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system
        import shutil
        shutil.copyfile(src, dst)


def _pieces(m: Manifest) -> dict[str, list[tuple[str, int, int]]]:
    """Per pages-N.img: its chunks in order, each (data file, offset there,
    length)."""
    offsets = {}
    for name, chunks in m.data.items():
        at, offs = 0, []
        for n, _ in chunks:
            offs.append(at)
            at += int(n)
        offsets[name] = offs
    return {pages_name: [(name, offsets[name][int(i)], int(m.data[name][int(i)][0]))
                         for name, i in order]
            for pages_name, order in m.pages.items()}


@contextmanager
def readable(directory: Path, m: Manifest, lazy: bool = False) -> Iterator[Path]:
    """A directory CRIU can restore from: for an image of chunks, a hidden
    view beside it that reads the data files through parent images
    (images.page_chain), or, where a pagemap does not fit that or the
    restore is lazy, with its pages-N.img files put together; removed on
    leaving.  Else compress.readable's.

    (CRIU's lazy-pages daemon cannot read through parent images: it reads
    a parent's pages in the background and is never told they arrived, so
    the faulting process waits for ever; pagemap.c, process_async_reads:
    "FIXME -- implement once needed".  Seen here.)"""
    if not m.pages:
        with compress.readable(directory) as view:
            yield view
        return
    whole = {p: _whole(m, p) for p in m.pages}
    if all(w == p for p, w in whole.items()) and set(m.data) == set(m.pages):
        yield directory  # a full generation: a plain CRIU image
        return
    # (page_chain ~1 ms: not before a plain image's restore; shutil and
    # concurrent.futures, with logging ~15 ms, only where pages are put
    # together, not before CRIU reads a view)
    from dmtcp_py.images import page_chain
    pieces = {p: chunks for p, chunks in _pieces(m).items() if whole[p] is None}
    view = directory.parent / f".{directory.name}.restore-{os.getpid()}"
    try:
        chain = None if lazy else page_chain.plan(directory, pieces)
        if chain is not None:
            try:
                _fill(directory, m, whole, view, skip=set(chain.processes))
                page_chain.build(directory, chain, view)
            except OSError as exc:  # (hard links refused, say)
                log.info("image %s: pages put together: %s", directory, exc)
                _remove_view(view)
                chain = None
        if chain is None:
            from concurrent.futures import ThreadPoolExecutor
            assembled = sum(n for chunks in pieces.values() for _, _, n in chunks)
            if compress.room_in_memory(assembled):
                view = Path("/dev/shm") / view.name
            _fill(directory, m, whole, view, skip=set())
            workers = os.cpu_count() or 2
            with ThreadPoolExecutor(max_workers=workers) as pool:
                for pages_name, chunks in sorted(pieces.items()):
                    _assemble(directory, pages_name, chunks, view / pages_name, pool, workers)
        yield view
    finally:
        # removing a GiB takes ~0.2 s: not while the restart waits (a
        # thread the interpreter waits for at exit)
        threading.Thread(target=_remove_view, args=(view,), name="view-removal").start()


def _remove_view(view: Path) -> None:
    import shutil
    shutil.rmtree(view, ignore_errors=True)


def _fill(directory: Path, m: Manifest, whole: dict[str, str | None], view: Path,
          skip: set[str]) -> None:
    """A new view with the generation's files but its data files and skip,
    and the pages files that are a data file as it is."""
    if os.path.lexists(view):  # (a view of an earlier restart with our pid)
        _remove_view(view)
    view.mkdir(mode=0o700)
    for entry in directory.iterdir():
        if entry.is_file() and entry.name not in m.data and entry.name not in skip:
            _place(entry, view / entry.name)
    for pages_name, name in sorted(whole.items()):
        if name is not None:
            _place(directory / name, view / pages_name)


def _assemble(directory: Path, pages_name: str, chunks: list[tuple[str, int, int]],
              target: Path, pool: Executor, workers: int) -> None:
    """Put pages_name together from its chunks: runs of chunks that follow
    each other in one data file are one sendfile each; a big file is
    written by every core, each a part."""
    runs: list[list] = []   # [data file, offset there, bytes]
    for name, start, n in chunks:
        if runs and runs[-1][0] == name and runs[-1][1] + runs[-1][2] == start:
            runs[-1][2] += n
        else:
            runs.append([name, start, n])
    total = sum(r[2] for r in runs)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    os.close(fd)
    parts, at = [], 0
    per = total // workers + 1 if total >= PARALLEL_FROM else total + 1
    for name, start, n in runs:   # cut the runs into parts of about `per` bytes
        while n:
            step = min(n, per - at % per)
            if not parts or at % per == 0:
                parts.append((at, []))
            parts[-1][1].append((name, start, step))
            at, start, n = at + step, start + step, n - step
    try:
        for job in [pool.submit(_copy_part, directory, target, at, part)
                    for at, part in parts]:
            job.result()
    except OSError as exc:
        raise ImageError(f"image {directory}: cannot put {pages_name} together: "
                         f"{exc.strerror or exc}") from None


def _copy_part(directory: Path, target: Path, at: int, part: list) -> None:
    out = os.open(target, os.O_WRONLY | os.O_CLOEXEC)
    fds: dict[str, int] = {}
    try:
        os.lseek(out, at, os.SEEK_SET)
        for name, start, n in part:
            if name not in fds:
                fds[name] = os.open(directory / name, os.O_RDONLY | os.O_CLOEXEC)
            _copy(fds[name], start, out, n)
    finally:
        os.close(out)
        for fd in fds.values():
            os.close(fd)
