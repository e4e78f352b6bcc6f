"""Files the tree maps MAP_SHARED (a data file, a segment in /dev/shm).

CRIU saves a shared file mapping as a reference to the file, not its
contents: after a kill the file holds newer data than the restored
processes, or is gone (tmpfs after a reboot, another host).  So the agent
copies each such file the tree could write into the image while the program
is stopped, and writes it back before CRIU restores.

A file the tree maps only for reading (glibc's gconv-modules.cache, a
database or model weights opened read-only) is not the tree's to write:
writing it back would put old bytes into a system file after an upgrade,
fails for a user who may not write it, and races with every other restart
that maps it.  Such a file is not copied; its entry records what the restart
checks instead (size, mtime, a digest of a small file), and dmtcp-restart
refuses when it changed (changed_files).  A read-only mapping of a scratch
file (tmpfs, /tmp...) is copied but only written back when missing, as
images.temp_files does for the scratch files the tree holds open.

Manifest entries (Manifest.shared_files), told apart by their keys:
  written back:       {"path", "data", "mode", "uid", "gid"}   (also older images)
  made if missing:    the same and "only_if_missing": true
  checked at restart: {"path", "size", "mtime_ns"[, "sha256"]}  (no "data")
"""
from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from collections.abc import Iterable
from pathlib import Path

from dmtcp_py import deferred_log
from dmtcp_py.images import scratch
from dmtcp_py.paths import run_dir

TYPE_CHECKING = False  # (not typing's: ~4 ms of import before a restart's CRIU)
if TYPE_CHECKING:
    from dmtcp_py.images.tree_view import MappedFile

log = deferred_log.logger("images.shared")

# A read-only file up to this size gets a sha256 at checkpoint, so that a
# restart on a host whose copy has the same bytes but another mtime (the
# same package installed there at another time) is not refused.
DIGEST_MAX = 16 << 20
CHUNK = 1 << 20


def relink(remaps: list[dict]) -> None:
    """Before CRIU restores: the links CRIU reopens removed-name mappings
    through (link_remap.N, made at dump time and gone since), made again to
    the file's living name (written back by restore() first)."""
    for entry in remaps:
        if not os.path.lexists(entry["remap"]) and os.path.exists(entry["live"]):
            os.link(entry["live"], entry["remap"])


def keep(path: str, image_dir: Path, name: str) -> dict | None:
    """Copy path into image_dir/name; its manifest entry, or None if it is
    gone meanwhile."""
    try:
        st = os.stat(path)
        import shutil  # (a checkpoint's: not loaded before a restart's CRIU)
        shutil.copyfile(path, image_dir / name)
    except OSError:
        return None
    return {"path": path, "data": name, "mode": st.st_mode & 0o7777,
            "uid": st.st_uid, "gid": st.st_gid}


LOCK_BUCKETS = 64


class _WriteLock:
    """Held while a file is written back, so that trees restarting at once
    (each agent its own process) write one file one at a time.  The lock
    files are in the run directory, not the file itself or its directory:
    the application's own flock or fcntl locks on its files are never in
    the way, and a file that is missing can be locked too.  Paths share
    LOCK_BUCKETS lock files; two paths in one bucket only wait for each
    other."""

    def __init__(self, path: str) -> None:
        import hashlib  # (not at import: OpenSSL's load is 5 ms of a restart's start)
        bucket = int.from_bytes(hashlib.sha256(path.encode()).digest()[:4], "little")
        self.name = run_dir() / f"writeback-{bucket % LOCK_BUCKETS:02d}.lock"

    def __enter__(self) -> None:
        self.fd = os.open(self.name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc) -> None:
        os.close(self.fd)  # releases the lock


def _copy_into(fd: int, src) -> None:
    """src's bytes into fd, copied by the kernel (sendfile: half the time
    of reading and writing them here, 10 against 16-20 ms for an Open MPI
    job's 24 MiB of shared memory put back before CRIU restores it);
    through this process where the file systems do not allow that."""
    size, offset = os.fstat(src.fileno()).st_size, 0
    try:
        while offset < size:
            sent = os.sendfile(fd, src.fileno(), offset, size - offset)
            if sent == 0:
                break  # (src shrank meanwhile: what is left is copied below)
            offset += sent
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise
    src.seek(offset)
    while chunk := src.read(CHUNK):
        view = memoryview(chunk)
        while view:
            view = view[os.write(fd, view):]


def _create(path: str, src, entry: dict) -> bool:
    """Make a missing file whole before it has a name (O_TMPFILE, then a
    link), so that nobody, another tree's CRIU included, sees it half
    written.  False if the path exists."""
    if os.path.lexists(path):
        return False
    try:
        fd = os.open(os.path.dirname(path) or ".", os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC,
                     entry["mode"])
        unnamed = True
    except OSError:  # a file system without O_TMPFILE (NFS): made in place
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, entry["mode"])
        except FileExistsError:
            return False
        unnamed = False
    try:
        _copy_into(fd, src)
        os.fchown(fd, entry["uid"], entry["gid"])  # before fchmod: chown clears set-id bits
        os.fchmod(fd, entry["mode"])
        if unnamed:
            # linkat(AT_SYMLINK_FOLLOW) names the unnamed file; os.link only
            # passes that flag when given a directory fd (else plain link(),
            # which would link /proc's symlink itself and fail with EXDEV)
            parent = os.open(os.path.dirname(path) or ".",
                             os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.link(f"/proc/self/fd/{fd}", os.path.basename(path), dst_dir_fd=parent,
                        follow_symlinks=True)
            except FileExistsError:
                return False
            finally:
                os.close(parent)
    finally:
        os.close(fd)
    return True


def _rewrite(path: str, src) -> bool:
    """Make an existing file hold src's bytes, as the same inode (others
    may map it).  Only the chunks that differ are written, and the size goes
    from the old one straight to the final one, never through 0: another
    tree's CRIU may be checking the size right then (truncating first made
    it fail with "has bad size 0").  True if anything changed."""
    final = os.fstat(src.fileno()).st_size
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        changed = size != final
        if size < final:
            os.ftruncate(fd, final)  # grow at once, then fill in
        src.seek(0)
        offset = 0
        while want := src.read(CHUNK):
            if os.pread(fd, len(want), offset) != want:
                view = memoryview(want)
                at = offset
                while view:
                    done = os.pwrite(fd, view, at)
                    view, at = view[done:], at + done
                changed = True
            offset += len(want)
        if size > final:
            os.ftruncate(fd, final)
    finally:
        os.close(fd)
    return changed


def _set_owner(path: str, entry: dict) -> None:
    """Mode and owner as at the checkpoint, touched only if they differ."""
    st = os.stat(path)
    try:
        if (st.st_uid, st.st_gid) != (entry["uid"], entry["gid"]):
            os.chown(path, entry["uid"], entry["gid"])
        if stat.S_IMODE(os.stat(path).st_mode) != entry["mode"]:
            os.chmod(path, entry["mode"])
    except PermissionError as exc:
        log.warning("%s: cannot give it back its checkpoint-time owner and mode: %s",
                    path, exc.strerror)


def put_back(entry: dict, image_dir: Path, *, only_if_missing: bool = False) -> bool:
    """Write a kept file back to its path, with its mode and owner: made
    whole if missing; else left alone with only_if_missing, or brought back
    in place (see _rewrite).  Under the file's write lock.  True if
    written."""
    path = entry["path"]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with _WriteLock(path), open(image_dir / entry["data"], "rb") as src:
        if _create(path, src, entry):
            return True
        if only_if_missing:
            return False
        written = _rewrite(path, src)
        _set_owner(path, entry)
        return written


_digests: dict[tuple, str] = {}  # (path, dev, ino, size, mtime, ctime) -> sha256, per agent


def _digest(path: str, st: os.stat_result) -> str | None:
    key = (path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if key not in _digests:
        try:
            with open(path, "rb") as f:
                import hashlib
                _digests[key] = hashlib.file_digest(f, "sha256").hexdigest()
        except OSError:
            return None
    return _digests[key]


def describe(path: str) -> dict | None:
    """What the restart checks of a file the tree only reads, or None if it
    is gone meanwhile.  Size and mtime: every writer changes them, and they
    travel with the file (cp -p, rsync -t, tar, a package's files).  Inode
    and device numbers do not: the same bytes on another host, or restored
    from a backup, have other ones, so checking them would refuse good
    restarts; a file replaced by another (a rename) shows in its mtime."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    entry = {"path": path, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    if st.st_size <= DIGEST_MAX:
        digest = _digest(path, st)
        if digest is not None:
            entry["sha256"] = digest
    return entry


def _when(ns: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ns // 1_000_000_000))


def describe_change(entry: dict, size: int, mtime_ns: int) -> str | None:
    """One line on how a read-only file differs from what the checkpoint
    saw (entry), or None if it does not."""
    parts = []
    if size != entry["size"]:
        parts.append(f"size {entry['size']} -> {size} bytes")
    if mtime_ns != entry["mtime_ns"]:
        new, old = _when(mtime_ns), _when(entry["mtime_ns"])
        if new == old:  # within one second: show what differs
            new += f".{mtime_ns % 1_000_000_000:09d}"
            old += f".{entry['mtime_ns'] % 1_000_000_000:09d}"
        parts.append(f"modified {new}, was {old}")
    if not parts:
        return None
    return f"{entry['path']} changed since the checkpoint ({', '.join(parts)})"


def changed(entry: dict) -> str | None:
    """One line if a file the tree only reads is not as the checkpoint saw
    it: gone, another size, another mtime (unless its bytes are the same)."""
    path = entry["path"]
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return f"{path} is gone since the checkpoint"
    except OSError as exc:
        return f"{path} cannot be checked: {exc.strerror or exc}"
    if not stat.S_ISREG(st.st_mode):
        return f"{path} is no longer a regular file"
    if st.st_size == entry["size"] and st.st_mtime_ns != entry["mtime_ns"] \
            and entry.get("sha256") and _digest(path, st) == entry["sha256"]:
        return None  # same bytes, written at another time (another host's copy)
    return describe_change(entry, st.st_size, st.st_mtime_ns)


def changed_files(entries: Iterable[dict]) -> list[str]:
    """For dmtcp-restart, before anything starts: one line per file that the
    images only read and that is not as their checkpoint saw it.  A path
    that one of the entries writes back (another tree wrote it) is left
    out: it will be as it was at the checkpoint."""
    entries = list(entries)
    written = {e["path"] for e in entries if "data" in e}
    problems = []
    for entry in entries:
        if "data" not in entry and entry["path"] not in written:
            problem = changed(entry)
            if problem and problem not in problems:
                problems.append(problem)
    return problems


def save(files: Iterable[MappedFile | str], image_dir: Path) -> list[dict]:
    """The manifest's entries for mapped_files(): a file the tree could
    write is copied into image_dir as shared-<n>.data, a scratch file only
    read too (made again only if missing), any other file only read is
    described for the check at restart.  A plain path counts as writable.
    A file unmapped and removed meanwhile has no entry."""
    entries = []
    for n, item in enumerate(files):
        path, writable = (item, True) if isinstance(item, str) else item
        if writable:
            entry = keep(path, image_dir, f"shared-{n}.data")
        elif scratch.is_scratch(path):
            entry = keep(path, image_dir, f"shared-{n}.data")
            if entry is not None:
                entry["only_if_missing"] = True
        else:
            entry = describe(path)
        if entry is not None:
            entries.append(entry)
    return entries


def restore(entries: list[dict], image_dir: Path) -> None:
    """Before CRIU restores: put back the files the tree could write (and
    missing scratch files); files it only read are never written.
    dmtcp-restart refused to start if one of those changed, unless
    --allow-changed-files: then the log says which."""
    for entry in entries:
        if "data" in entry:
            put_back(entry, image_dir, only_if_missing=entry.get("only_if_missing", False))
        elif problem := changed(entry):
            log.warning("%s; restoring anyway (--allow-changed-files)", problem)
