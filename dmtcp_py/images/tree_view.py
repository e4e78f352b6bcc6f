"""What a checkpoint reads of the tree's processes in /proc, once, while
the program is stopped: each process's shared file mappings and its open
fds (TreeView), and from them the files the tree maps shared and whether
it could write each (mapped_files), for images.shared_files,
images.temp_files and images.written_files to save.  Reads only.
"""
from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from typing import NamedTuple

from dmtcp_py import procfs
from dmtcp_py.images import procmap_query

DELETED = " (deleted)"  # what /proc adds to the name of a removed file


class Mapping(NamedTuple):
    """One shared file mapping of a process."""
    path: str           # as /proc names it, " (deleted)" included
    dev: int
    ino: int
    may_write: bool     # VM_MAYWRITE: the file was opened for writing
    where: str = ""     # its addresses, as maps shows them ("7f00-7f10")


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
        out.append(Mapping(fields[5].strip(), os.makedev(major, minor), ino, "w" in fields[1],
                           fields[0]))
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
    """The shared file mappings of one process.  One that maps shows
    read-only is settled by map_files (_opened_for_writing); where that
    cannot tell, by smaps, which has VmFlags but costs a walk of the page
    tables (~5 ms per 500 MiB resident here, ~0.7 ms for an idle Python)
    while the program is stopped, and glibc maps gconv-modules.cache
    read-only and shared into every process that converts a character set
    (every Python).  The mappings come from PROCMAP_QUERY where the kernel
    has it (procmap_query), else from the text of maps."""
    queried = procmap_query.shared_file_mappings(pid)
    if queried is not None:
        found = [Mapping(q.path, q.dev, q.ino, q.writable, f"{q.start:x}-{q.end:x}")
                 for q in queried]
    else:
        text = procfs.read(f"/proc/{pid}/maps")
        if text is None:
            return []
        found = parse_maps(text)
    for i, m in enumerate(found):
        if not m.may_write:
            told = _opened_for_writing(pid, m.where)
            if told is None:
                break
            found[i] = m._replace(may_write=told)
    else:
        return found
    detailed = procfs.read(f"/proc/{pid}/smaps")
    return parse_maps(_smaps_headers(detailed)) if detailed is not None else found


def _opened_for_writing(pid: int, where: str) -> bool | None:
    """Whether the file a shared mapping maps was opened for writing, which
    is what VM_MAYWRITE says of it: the mode of its link in
    /proc/PID/map_files is that open file's (S_IWUSR: FMODE_WRITE).  None
    where map_files cannot tell (it asks for CAP_CHECKPOINT_RESTORE or
    CAP_SYS_ADMIN; a mapping gone meanwhile)."""
    start, _, end = where.partition("-")
    try:  # (maps pads the addresses with zeros, map_files does not)
        st = os.lstat(f"/proc/{pid}/map_files/{int(start, 16):x}-{int(end, 16):x}")
    except (OSError, ValueError):
        return None
    return bool(st.st_mode & stat.S_IWUSR)


class OpenFd(NamedTuple):
    """One fd of a process, as /proc shows it; None where it could not be
    read."""
    pid: int
    fd: str                       # as /proc names it
    target: str | None            # readlink /proc/PID/fd/N ("socket:[5]", a path...)
    st: os.stat_result | None     # stat through it (the file, not the link); only
                                  # for a path: a socket's inode is in its target
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


def _open_fd(pid: int, fd: str, target: str | None = None) -> OpenFd:
    """target: what the fd links to, if read already (while the process
    was stopped, as now)."""
    path = f"/proc/{pid}/fd/{fd}"
    if target is None:
        try:
            target = os.readlink(path)
        except OSError:
            return OpenFd(pid, fd, None, None, None)
    # only a path needs its stat: a pipe's, a socket's or an anon inode's
    # is never asked for.  Only a regular file can be a written file or
    # the writer of a mapped one: sockets, pipes, devices and anon inodes
    # need no fdinfo
    if not target.startswith("/"):
        return OpenFd(pid, fd, target, None, None)
    try:
        st = os.stat(path)
    except OSError:
        st = None
    flags = _fdinfo_flags(pid, fd) if st is not None and stat.S_ISREG(st.st_mode) else None
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
    def read(cls, pids: Iterable[int],
             links: dict[int, list[tuple[int, str]]] | None = None) -> TreeView:
        """links: pid -> (fd, target) of every open fd, for the processes
        whose fds were read already while the tree was stopped and have
        not changed since (nothing parked): not listed and read again."""
        pids = list(pids)
        links = links or {}
        mappings = [m for pid in pids for m in _pid_mappings(pid)]
        fds = [_open_fd(pid, str(fd), target) for pid in pids if pid in links
               for fd, target in links[pid]]
        fds += [_open_fd(pid, fd) for pid, fd in procfs.fds([p for p in pids if p not in links])]
        return cls(mappings, fds)

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
