"""Atomic publication of generations in the checkpoint directory.

A generation is written into a hidden partial directory, its files are
made durable (integrity.seal does it while hashing them), and only then
does it take the image's name, by an atomic exchange with the previous
generation (renameat2 RENAME_EXCHANGE).  At every instant
`ckpt_<program>_<id>.dmtcp` is a complete generation; the previous one is
kept beside it as `ckpt_<program>_<id>.dmtcp.gen-<N>`, and older ones up
to the number asked for (--keep; KEEP_PREVIOUS by default).  Generations
share unchanged memory chunks through hard links (images.chunks): removing
one never touches the files of another.
"""
from __future__ import annotations

import ctypes
import errno
import json
import os
from pathlib import Path

from dmtcp_py.errors import ImageError
from dmtcp_py.images.manifest import MANIFEST, Manifest, load

KEEP_PREVIOUS = 1
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_libc = ctypes.CDLL(None, use_errno=True)


def image_name(program: str, tree_id: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in program) or "prog"
    return f"ckpt_{safe}_{tree_id}.dmtcp"


def make_partial(ckptdir: Path, name: str, generation: int) -> Path:
    ckptdir.mkdir(mode=0o700, parents=True, exist_ok=True)
    partial = ckptdir / f".{name}.partial-{generation}-{os.getpid()}"
    if partial.exists():
        _remove_tree(partial)
    partial.mkdir(mode=0o700)
    return partial


def _remove_tree(path: Path) -> None:
    import shutil  # (~3 ms, with bz2 and lzma: not before a restarted tree runs again)
    shutil.rmtree(path)


def _fsync_path(path: Path, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _exchange(a: Path, b: Path) -> None:
    if _libc.renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b),
                       _RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(a))


def _generation_of(directory: Path) -> int | None:
    try:
        return int(json.loads((directory / MANIFEST).read_text())["generation"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _places(final: Path, generation: int) -> tuple[Path, Path]:
    """Where generation `generation` of an image can be: under its name, or
    kept beside it (.gen-N) once a newer one took the name."""
    return final, final.with_name(f"{final.name}.gen-{generation}")


def find_generation(final: Path, generation: int) -> Path | None:
    """Where generation `generation` of an image is (_places); None if
    neither holds it."""
    for candidate in _places(final, generation):
        if _generation_of(candidate) == generation:
            return candidate
    return None


def load_generation(final: Path, generation: int) -> tuple[Path, Manifest]:
    """Where generation `generation` of an image is (_places), with its
    manifest, each candidate's read once (a 1 GiB incremental generation's
    is ~3 ms of JSON; the restart script asks for its generation by
    number).  ImageError: the damage of a candidate that is there, or that
    neither holds it."""
    damaged = None
    for candidate in _places(final, generation):
        try:
            m = load(candidate)
        except ImageError as exc:
            damaged = damaged or (exc if candidate.exists() else None)
            continue
        if m.generation == generation:
            return candidate, m
    if damaged is not None:
        raise damaged
    raise ImageError(f"no generation {generation} of {final} (neither it nor "
                     f"{_places(final, generation)[1].name} holds it)")


def file_sizes(partial: Path) -> dict[str, int]:
    """name -> size of every file but the manifest (integrity.seal takes
    them again, with the hashes, when the image is published)."""
    sizes = {}
    for entry in os.scandir(partial):
        if entry.is_file(follow_symlinks=False) and entry.name != MANIFEST:
            sizes[entry.name] = entry.stat(follow_symlinks=False).st_size
    return dict(sorted(sizes.items()))


def directory_bytes(directory: Path) -> int:
    """Bytes in the files of a directory that is being written (files may
    come and go meanwhile)."""
    total = 0
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return 0
    for entry in entries:
        try:
            if entry.is_file(follow_symlinks=False):
                total += entry.stat(follow_symlinks=False).st_size
        except OSError:
            pass
    return total


def publish(partial: Path, final: Path, keep: int | None = None,
            durable: bool = True, replaced: int | None = None) -> list[Path]:
    """Give partial (complete, its files sealed, its manifest written and
    fsynced) the name final, atomically; keep `keep` previous generations
    beside it (0: none; None: KEEP_PREVIOUS).  replaced: the generation
    published under final, if the caller knows it (else its manifest is
    read: ~3 ms for 1 GiB of chunks).

    Returns the generations that fell out of the kept window, already moved
    out of the way under hidden names: deleting a GiB-sized image takes
    about half a second here, so the caller does it after replying."""
    keep = KEEP_PREVIOUS if keep is None else keep
    os.chmod(partial, 0o700)
    if durable:
        _fsync_path(partial, directory=True)
    parent = final.parent
    if final.exists():
        old_gen = replaced if replaced is not None else _generation_of(final)
        _exchange(partial, final)          # final is now the new generation
        kept = parent / f"{final.name}.gen-{old_gen if old_gen is not None else 'old'}"
        expired = [_retire(kept)] if kept.exists() else []
        os.rename(partial, kept)           # partial now holds the previous one
        expired += [_retire(e) for e in _beyond_window(final, keep)]
    else:
        os.rename(partial, final)
        expired = []
    if durable:
        _fsync_path(parent, directory=True)
    return expired


def _beyond_window(final: Path, keep: int) -> list[Path]:
    kept = []
    for entry in final.parent.glob(f"{final.name}.gen-*"):
        suffix = entry.name.rsplit("-", 1)[-1]
        kept.append((int(suffix) if suffix.isdigit() else -1, entry))
    kept.sort()
    return [entry for _, entry in (kept[:-keep] if keep > 0 else kept)]


_EXPIRED = ".expired-"  # .<generation's name>.expired-<pid of the agent that retired it>


def _retire(entry: Path) -> Path:
    """Rename an expired generation to a hidden name, pending deletion."""
    hidden = entry.with_name(f".{entry.name}{_EXPIRED}{os.getpid()}")
    if hidden.exists():
        _remove_tree(hidden)
    os.rename(entry, hidden)
    return hidden


def retired_name(name: str) -> str | None:
    """The name an expired generation had (ckpt_x.dmtcp.gen-3), from its
    hidden one (.ckpt_x.dmtcp.gen-3.expired-PID); None for another name."""
    if not name.startswith(".") or _EXPIRED not in name:
        return None
    return name[1:].rsplit(_EXPIRED, 1)[0]


def unretire(hidden: Path) -> None:
    """An expired generation gets its name back (its round failed, or its
    agent ended before it was over): it may be the newest complete one.
    Where that name is taken again, it stays hidden, and is not deleted."""
    name = retired_name(hidden.name)
    if name is None or hidden.with_name(name).exists():
        return
    try:
        os.rename(hidden, hidden.with_name(name))
    except FileNotFoundError:
        pass


def discard(directory: Path) -> None:
    """Delete a partial or expired generation."""
    try:
        _remove_tree(directory)
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            raise
