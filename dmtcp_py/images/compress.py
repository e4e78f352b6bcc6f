"""Compressed images (--gzip, DMTCP_GZIP): CRIU's memory pages in zstd.

Why zstd, through python-zstandard: libzstd compresses with worker threads
of its own (threads=-1: one per core) at hundreds of MB/s per core at level
1 and decompresses at GB/s; the binding is maintained and ships wheels.
DMTCP's gzip runs on one core at a few tens of MB/s.

Only the pages-*.img files hold bulk data; CRIU's other image files are
small protobuf records and stay as they are, readable by dmtcp-inspect.
Compression runs after the program is running again, before the images
are fsynced and published, so it costs no stop time.  At restart the pages
are decompressed, several files at once, into a hidden directory with the
image's other files: in /dev/shm when memory has room for it twice over
(the restored program needs as much), else beside the image; CRIU restores
from it, and it is removed.  Written to the disk instead, the decompressed
copy made a restart about three times slower here.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


from dmtcp_py.errors import ImageError

NAME = "zstd"
SUFFIX = ".zst"
LEVEL = 1           # the fastest level: the images are the bulk of a checkpoint's I/O
CHUNK = 1 << 20


def compress(directory: Path) -> bool:
    """Compress every pages-*.img of directory in place; True if any."""
    import zstandard  # here: ~10 ms that a launch without --gzip need not pay

    # a frame checksum, so that a flipped byte is an error, never wrong memory
    compressor = zstandard.ZstdCompressor(level=LEVEL, threads=-1, write_checksum=True)
    done = False
    for pages in sorted(directory.glob("pages-*.img")):
        target = pages.with_name(pages.name + SUFFIX)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with open(pages, "rb") as src, os.fdopen(fd, "wb") as dst:
            compressor.copy_stream(src, dst, read_size=CHUNK, write_size=CHUNK)
        pages.unlink()
        done = True
    return done


def room_in_memory(size: int) -> bool:
    """/dev/shm has room for size bytes twice over (the restored program
    needs as much again)."""
    try:
        import psutil  # (8 ms: only for a compressed image)
        return psutil.virtual_memory().available > 2 * size and os.path.isdir("/dev/shm")
    except OSError:
        return False


def _view_parent(directory: Path, packed: list[Path]) -> Path:
    """/dev/shm if memory has room for the decompressed pages twice over."""
    guess = 4 * sum(p.stat().st_size for p in packed)  # what zstd level 1 typically saves
    return Path("/dev/shm") if room_in_memory(guess) else directory.parent


def _decompress(src: Path, target: Path) -> None:
    import zstandard

    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with open(src, "rb") as f, os.fdopen(fd, "wb") as dst:
            zstandard.ZstdDecompressor().copy_stream(f, dst, read_size=CHUNK, write_size=CHUNK)
    except zstandard.ZstdError as exc:
        raise ImageError(f"{src} is corrupt: {exc}") from None


def is_packed(directory: Path) -> bool:
    """The image's memory pages are compressed."""
    return any(directory.glob(f"pages-*.img{SUFFIX}"))


@contextmanager
def readable(directory: Path) -> Iterator[Path]:
    """A directory CRIU can restore from: the image itself, or a view of it
    with the pages decompressed, removed on leaving."""
    packed = sorted(directory.glob(f"pages-*.img{SUFFIX}"))
    if not packed:
        yield directory
        return
    # (loaded here, not before every restart's CRIU: cli/restarting.py)
    import shutil
    from concurrent.futures import ThreadPoolExecutor
    view = _view_parent(directory, packed) / f".{directory.name}.restore-{os.getpid()}"
    shutil.rmtree(view, ignore_errors=True)
    view.mkdir(mode=0o700)
    try:
        for entry in directory.iterdir():
            if entry.is_file() and entry not in packed:
                try:
                    os.link(entry, view / entry.name)
                except OSError:  # another file system
                    shutil.copy2(entry, view / entry.name)
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            # zstd lets go of the GIL: one file per core at once
            jobs = [pool.submit(_decompress, p, view / p.name[:-len(SUFFIX)]) for p in packed]
            for job in jobs:
                job.result()
        yield view
    finally:
        shutil.rmtree(view, ignore_errors=True)
