"""Compressed images (--gzip, DMTCP_GZIP): CRIU's memory pages in zstd.

Why zstd, through python-zstandard: libzstd compresses with worker threads
of its own (threads=-1: one per core) at hundreds of MB/s per core at level
1 and decompresses at GB/s; the binding is maintained and ships wheels.
DMTCP's gzip runs on one core at a few tens of MB/s.

Only the pages-*.img files hold bulk data; CRIU's other image files are
small protobuf records and stay as they are, readable by dmtcp-inspect.
Compression runs after the program is running again, before the images
are fsynced and published, so it costs no stop time.  At restart the pages
are decompressed into a hidden directory beside the image (the other files
hard-linked there), CRIU restores from it, and it is removed.
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import zstandard

from dmtcp_py.errors import ImageError

NAME = "zstd"
SUFFIX = ".zst"
LEVEL = 1           # the fastest level: the images are the bulk of a checkpoint's I/O
CHUNK = 1 << 20


def compress(directory: Path) -> bool:
    """Compress every pages-*.img of directory in place; True if any."""
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


@contextmanager
def readable(directory: Path) -> Iterator[Path]:
    """A directory CRIU can restore from: the image itself, or a view of it
    with the pages decompressed, removed on leaving."""
    packed = sorted(directory.glob(f"pages-*.img{SUFFIX}"))
    if not packed:
        yield directory
        return
    view = directory.parent / f".{directory.name}.restore-{os.getpid()}"
    shutil.rmtree(view, ignore_errors=True)
    view.mkdir(mode=0o700)
    try:
        decompressor = zstandard.ZstdDecompressor()
        for entry in directory.iterdir():
            if not entry.is_file():
                continue
            if entry.name.endswith(SUFFIX) and entry.name.startswith("pages-"):
                target = view / entry.name[:-len(SUFFIX)]
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                try:
                    with open(entry, "rb") as src, os.fdopen(fd, "wb") as dst:
                        decompressor.copy_stream(src, dst, read_size=CHUNK, write_size=CHUNK)
                except zstandard.ZstdError as exc:
                    raise ImageError(f"{entry} is corrupt: {exc}") from None
            else:
                try:
                    os.link(entry, view / entry.name)
                except OSError:
                    shutil.copy2(entry, view / entry.name)
        yield view
    finally:
        shutil.rmtree(view, ignore_errors=True)
