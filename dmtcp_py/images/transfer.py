"""One image directory as a byte stream, and back (replicas, --replicas).

The stream is a header line (JSON: the image's name, its generation, the
manifest's length), the manifest itself, then every file the manifest
lists, whole, in the manifest's order (an incremental generation's data
files too, chunks it shares with older generations included: a copy
stands alone, and the receiver checks a data file chunk by chunk).  The receiver trusts nothing in it:
the name must be an image's name, each file must have the size and the
digest (blake3, or sha256 in older images) that the manifest recorded when the image was sealed, and only then
is the copy published, atomically, exactly as a local generation is
(store.publish: the previous generation kept beside it).  A damaged or cut
stream leaves nothing behind but the partial directory, which is removed.

The sender reads the published image through one directory descriptor: if
the next generation takes the name meanwhile (RENAME_EXCHANGE), the files
still come from the generation the header named.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import BinaryIO

from dmtcp_py.errors import ImageError
from dmtcp_py.images import chunks, integrity, store
from dmtcp_py.images.manifest import MANIFEST, load

MAGIC = "dmtcp-image"
VERSION = 1
CHUNK = 1 << 20
HEADER_MAX = 64 << 10
MANIFEST_MAX = 64 << 20
_NAME = re.compile(r"^ckpt_[A-Za-z0-9_.-]+\.dmtcp$")
_FILE = re.compile(r"^[A-Za-z0-9_.+-]+$")


def _read_exact(inp: BinaryIO, n: int, what: str) -> bytes:
    data = inp.read(n)
    if data is None or len(data) != n:
        raise ImageError(f"the stream ended inside {what}")
    return data


def send(directory: Path, out: BinaryIO, *, generation: int | None = None) -> int:
    """Write the image at directory to out; the bytes written.  With
    generation: that generation of the image (under its name, or kept
    beside it); an ImageError if there is none."""
    name = directory.name  # the image's name, wherever its generation is kept
    if generation is not None:
        directory = store.find_generation(directory, generation) or directory
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise ImageError(f"no checkpoint image at {directory}: {exc.strerror}") from None
    try:
        with open(os.open(MANIFEST, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd), "rb") as f:
            raw = f.read()
        manifest = json.loads(raw)
        gen = int(manifest["generation"])
        files = dict(manifest["files"])
        if generation is not None and gen != generation:
            raise ImageError(f"{directory} holds generation {gen}, not {generation}")
        header = {"magic": MAGIC, "version": VERSION, "name": name,
                  "generation": gen, "manifest": len(raw)}
        out.write(json.dumps(header).encode() + b"\n")
        out.write(raw)
        sent = len(raw)
        for fname, size in files.items():
            fd = os.open(fname, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW, dir_fd=dir_fd)
            with open(fd, "rb", buffering=0) as f:
                _pump(f.read, out.write, size,
                      f"{directory}/{fname} is shorter than its manifest says")
            sent += size
        out.flush()
        return sent
    except (OSError, ValueError, KeyError, TypeError) as exc:
        if isinstance(exc, OSError) and exc.filename is None and exc.errno is not None \
                and exc.errno in (32, 104):  # EPIPE, ECONNRESET: the receiver went away
            raise ImageError(f"the receiver of {directory.name} went away") from None
        raise ImageError(f"cannot send {directory}: {exc}") from None
    finally:
        os.close(dir_fd)


def receive(inp: BinaryIO, ckptdir: Path) -> Path:
    """Read one image from inp into ckptdir, check it, publish it; its path.
    ImageError if anything is wrong (nothing is published then)."""
    line = inp.readline(HEADER_MAX)
    if not line.endswith(b"\n"):
        raise ImageError("not an image stream (no header)")
    try:
        header = json.loads(line)
        name, gen, mlen = header["name"], int(header["generation"]), int(header["manifest"])
        if header.get("magic") != MAGIC or header.get("version") != VERSION:
            raise ValueError("unknown format")
    except (ValueError, KeyError, TypeError) as exc:
        raise ImageError(f"not an image stream: {exc}") from None
    if not isinstance(name, str) or not _NAME.match(name) or not 0 < mlen <= MANIFEST_MAX:
        raise ImageError(f"not an image stream: bad name {name!r} or manifest length")
    final = Path(ckptdir) / name
    have = _generation_at(final)
    if have is not None and have > gen:
        raise ImageError(f"{final} already holds generation {have}, newer than {gen}")
    partial = store.make_partial(Path(ckptdir), name, gen)
    try:
        raw = _read_exact(inp, mlen, "the manifest")
        try:
            manifest = json.loads(raw)
            files = {str(k): int(v) for k, v in manifest["files"].items()}
            algorithm = next((a for a in integrity.ALGORITHMS if manifest.get(a)),
                             integrity.ALGORITHM)
            digests = dict(manifest.get(algorithm) or {})
            # a data file of chunks (images.chunks) is checked chunk by chunk
            for fname, lengths in chunks.lengths_of(dict(manifest.get("data") or {})).items():
                if fname in digests:
                    digests[fname] = integrity.ChunkedDigest(str(digests[fname]), lengths)
            ok = int(manifest["generation"]) == gen
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ImageError(f"the manifest of {name} is corrupt: {exc}") from None
        if not ok:
            raise ImageError(f"the manifest of {name} is not generation {gen}")
        for fname, size in files.items():
            if not _FILE.match(fname) or fname == MANIFEST or size < 0:
                raise ImageError(f"the manifest of {name} names a bad file {fname!r}")
            if fname not in digests:
                raise ImageError(f"the manifest of {name} has no checksum for {fname}")
            _receive_file(inp, partial / fname, size, algorithm, digests[fname], name)
        _write_private(partial / MANIFEST, raw)
        for expired in store.publish(partial, final):
            store.discard(expired)
        return final
    except BaseException:
        store.discard(partial)
        raise


def _receive_file(inp: BinaryIO, path: Path, size: int, algorithm: str, digest: str,
                  image: str) -> None:
    h = integrity.hasher_for(algorithm, digest)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    def write(chunk: bytes) -> None:
        h.update(chunk)
        view = memoryview(chunk)
        while view:
            view = view[os.write(fd, view):]

    try:
        _pump(inp.read, write, size, f"the stream of {image} ended inside {path.name}")
        if h.hexdigest() != digest:
            raise ImageError(f"the copy of {image}/{path.name} does not match its checksum "
                             f"({algorithm})")
        os.fsync(fd)
    finally:
        os.close(fd)


def _pump(read, write, size: int, short: str) -> None:
    """size bytes from read(n) to write(chunk), a chunk at a time;
    ImageError(short) if read runs dry first."""
    left = size
    while left:
        chunk = read(min(CHUNK, left))
        if not chunk:
            raise ImageError(short)
        write(chunk)
        left -= len(chunk)


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _generation_at(final: Path) -> int | None:
    if not final.exists():
        return None
    try:
        return load(final).generation
    except ImageError:
        return None  # a damaged copy there: the new one replaces it
