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

import fcntl
import logging
import os
import shutil
import stat
import time
from pathlib import Path
from typing import Iterable, NamedTuple

from dmtcp_py import procfs
from dmtcp_py.images import scratch
from dmtcp_py.paths import run_dir

log = logging.getLogger("images.shared")

# Where scratch files live, as images.temp_files sees it (that module imports
# this one, so the rule cannot be imported from there without a circle).
# A read-only file up to this size gets a sha256 at checkpoint, so that a
# restart on a host whose copy has the same bytes but another mtime (the
# same package installed there at another time) is not refused.
DIGEST_MAX = 16 << 20
CHUNK = 1 << 20
DELETED = " (deleted)"  # what /proc adds to the name of a removed file


class Mapping(NamedTuple):
    """One shared file mapping of a process."""
    path: str           # as /proc names it, " (deleted)" included
    dev: int
    ino: int
    may_write: bool     # VM_MAYWRITE: the file was opened for writing


class MappedFile(NamedTuple):
    path: str
    writable: bool      # the tree could write it at checkpoint time


def parse_maps(text: str) -> list[Mapping]:
    """The shared file mappings in the text of /proc/PID/maps or smaps.

    Whether a mapping may be written is VM_MAYWRITE, smaps' "mw" VmFlag: the
    kernel clears it for MAP_SHARED of a file not opened for writing, and
    sets it for one that was, even if mapped PROT_READ (mprotect may make
    it writable later; seen on this kernel).  maps has no VmFlags: there
    only the permissions' "w" (VM_WRITE, which implies VM_MAYWRITE) count."""
    out: list[Mapping] = []
    current = -1  # index in out of the mapping whose fields follow, or -1
    for line in text.splitlines():
        fields = line.split(maxsplit=5)
        if not fields:
            continue
        if fields[0].endswith(":"):  # an smaps field line ("Size:", "VmFlags:")
            if fields[0] == "VmFlags:" and current >= 0:
                out[current] = out[current]._replace(may_write="mw" in line.split()[1:])
            continue
        current = -1
        if len(fields) < 6 or len(fields[1]) < 4 or fields[1][3] != "s" or fields[4] == "0":
            continue
        try:
            major, minor = (int(x, 16) for x in fields[3].split(":"))
            ino = int(fields[4])
        except ValueError:
            continue
        out.append(Mapping(fields[5].strip(), os.makedev(major, minor), ino, "w" in fields[1]))
        current = len(out) - 1
    return out


def _smaps_headers(text: str) -> str:
    """Of the text of /proc/PID/smaps, each mapping's first line and its
    VmFlags line: all that parse_maps reads of it.  A mapping has some 25
    lines there and smaps ends each with VmFlags, so the text is cut at
    those (in C) instead of gone through line by line, which cost as much
    as reading smaps."""
    chunks = text.split("\nVmFlags:")
    if len(chunks) == 1:  # no VmFlags (not this kernel): all of it
        return text
    out = [_first_header(chunks[0])]
    for chunk in chunks[1:]:
        flags, _, rest = chunk.partition("\n")
        out.append("VmFlags:" + flags)
        out.append(_first_header(rest))
    return "\n".join(out)


def _first_header(text: str) -> str:
    """The first line of text that is not a "Field: value" line."""
    while text:
        line, _, text = text.partition("\n")
        fields = line.split(maxsplit=1)
        if fields and not fields[0].endswith(":"):
            return line
    return ""


def _pid_mappings(pid: int) -> list[Mapping]:
    """The shared file mappings of one process.  smaps, which has VmFlags,
    costs a walk of the page tables (~5 ms per 500 MiB resident here), so
    it is read only for a process with a shared mapping that maps cannot
    settle."""
    text = procfs.read(f"/proc/{pid}/maps")
    if text is None:
        return []
    found = parse_maps(text)
    if any(not m.may_write for m in found):
        detailed = procfs.read(f"/proc/{pid}/smaps")
        if detailed is not None:
            found = parse_maps(_smaps_headers(detailed))
    return found


class OpenFd(NamedTuple):
    """One fd of a process, as /proc shows it; None where it could not be
    read."""
    pid: int
    fd: str                       # as /proc names it
    target: str | None            # readlink /proc/PID/fd/N ("socket:[5]", a path...)
    st: os.stat_result | None     # stat through it (the file, not the link)
    flags: int | None             # fdinfo's flags; read only for a regular file


def _fdinfo_flags(pid: int, fd: str) -> int | None:
    text = procfs.read(f"/proc/{pid}/fdinfo/{fd}")  # ("pos:\t0\nflags:\t02100002\n...")
    start = text.find("\nflags:") + 1 if text is not None else 0
    if start <= 0:
        return None
    try:
        return int(text[start + 6:text.find("\n", start)], 8)
    except ValueError:
        return None


def _open_fd(pid: int, fd: str) -> OpenFd:
    path = f"/proc/{pid}/fd/{fd}"
    try:
        target = os.readlink(path)
    except OSError:
        target = None
    try:
        st = os.stat(path)
    except OSError:
        st = None
    # only a regular file can be a written file or the writer of a mapped
    # one: sockets, pipes, devices and anon inodes need no fdinfo
    flags = _fdinfo_flags(pid, fd) if target is not None and target.startswith("/") \
        and st is not None and stat.S_ISREG(st.st_mode) else None
    return OpenFd(pid, fd, target, st, flags)


class TreeView:
    """What save_files asks of the tree's processes, read from /proc once
    per checkpoint while the program is stopped: each process's shared
    file mappings (one pass over maps, smaps only where needed) and its
    fds (readlink, stat, fdinfo once each).  mapped_files, deleted_aliases,
    images.temp_files and images.written_files all take it, instead of
    walking /proc again each.  Made of plain lists, so a test can build one."""

    def __init__(self, mappings: list[Mapping], fds: list[OpenFd]) -> None:
        self.mappings = mappings
        self.fds = fds
        self._live: dict[tuple, str | None] = {}

    @classmethod
    def read(cls, pids: Iterable[int]) -> TreeView:
        pids = list(pids)
        mappings = [m for pid in pids for m in _pid_mappings(pid)]
        return cls(mappings, [_open_fd(pid, fd) for pid, fd in procfs.fds(pids)])

    def live_name(self, m: Mapping) -> str | None:
        """_live_name of a mapping through a removed name, asked once per
        file (mapped_files and deleted_aliases both want it)."""
        key = (m.path, m.dev, m.ino)
        if key not in self._live:
            self._live[key] = _live_name(m.path[:-len(DELETED)], m.dev, m.ino)
        return self._live[key]


def _open_for_writing(view: TreeView) -> set[str]:
    """Paths the tree holds open for writing: a file mapped read-only but
    written through an fd is the tree's to write too."""
    return {f.target for f in view.fds
            if f.flags is not None and f.target is not None
            and f.flags & os.O_ACCMODE != os.O_RDONLY}


def _live_name(deleted: str, dev: int, ino: int) -> str | None:
    """Another name of a mapped file whose own name was removed, in the
    same directory: glibc's sem_open maps a temporary name, links the file
    to the semaphore's name and removes the temporary one."""
    directory = os.path.dirname(deleted)
    try:
        names = os.listdir(directory)
    except OSError:
        return None
    for name in names:
        path = os.path.join(directory, name)
        try:
            st = os.stat(path, follow_symlinks=False)
        except OSError:
            continue
        if st.st_ino == ino and st.st_dev == dev:
            return path
    return None


def deleted_aliases(view: TreeView) -> dict[str, str]:
    """Removed name of a shared mapping -> a name the file still has."""
    out = {}
    for m in view.mappings:
        if m.path.endswith(DELETED):
            live = view.live_name(m)
            if live is not None:
                out[m.path[:-len(DELETED)]] = live
    return out


def mapped_files(view: TreeView) -> list[MappedFile]:
    """Regular files mapped shared by the tree's processes (by a name they
    still have, for one mapped through a removed name), and whether the
    tree could write each: through a mapping that may be written, or an
    fd."""
    writers = _open_for_writing(view)
    found: dict[str, bool] = {}
    for m in view.mappings:
        path = m.path
        if path.endswith(DELETED):
            path = view.live_name(m)
            if path is None:
                continue
        elif not path.startswith("/") or not os.path.isfile(path):
            continue
        writable = m.may_write or m.path in writers or path in writers
        found[path] = found.get(path, False) or writable
    return [MappedFile(path, writable) for path, writable in sorted(found.items())]


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
    src.seek(0)
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
