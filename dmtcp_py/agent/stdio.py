"""The tree's stdio that leads outside it, and how to hand it back.

The launched tree inherits the agent's fds 0-2; a restored tree should read
and write where the restarting command does.
- Pipes and sockets: CRIU dumps one end whose peer is outside, and a plain
  restore would give a pipe with no reader.  We record CRIU's id for it and
  pass the restarting agent's own fd with inherit_fd.
- Regular files (a log): declared external at dump (file[mnt_id:inode]) and
  handed over the same way; CRIU would otherwise reopen the old file, and
  refuse it if it grew.
- Terminals: CRIU's shell-job path restores them from criu's stdin, which
  the agent makes its own terminal (criu_driver).
- Anything else (/dev/null) is reopened by path.
"""
from __future__ import annotations

from collections.abc import Sequence

import ctypes
import os
import stat

from dmtcp_py.errors import UserError


def describe(relays: Sequence[FileRelay] = ()) -> dict[str, dict]:
    """The tree's stdio, as its agent's own fds 0-2 are, except where a
    restore gave the tree a relay file in their place (prepare): then that
    file, which is what the tree holds and CRIU must be told of (else the
    next image keeps it as a deleted file, and a restart from it writes
    where nobody reads)."""
    instead = {r.target: r.read_fd for r in relays}
    out = {}
    for number in (0, 1, 2):
        fd = instead.get(number, number)
        kind = _kind_of(fd)
        if kind is None:
            continue
        target = os.readlink(f"/proc/self/fd/{fd}")
        st = os.fstat(fd)
        if kind == "tty":
            key = f"tty[{st.st_rdev:x}:{st.st_dev:x}]"
        elif kind == "file":
            key = f"file[{_mnt_id(fd):x}:{st.st_ino:x}]"
        else:
            key = target
        out[str(number)] = {"kind": kind, "key": key, "path": target,
                        "mode": stat.S_IMODE(st.st_mode)}  # CRIU checks it at restore
    return out


def _mnt_id(fd: int) -> int:
    with open(f"/proc/self/fdinfo/{fd}") as f:
        for line in f:
            if line.startswith("mnt_id:"):
                return int(line.split()[1])
    raise OSError(f"no mnt_id for fd {fd}")


def external_ids(stdio: dict[str, dict]) -> list[str]:
    """Ids to declare external at dump: CRIU records them by id only.
    Not terminals: CRIU's shell-job path restores those from its stdin."""
    return sorted({d["key"] for d in stdio.values() if d["kind"] == "file"})


def check_restartable(stdio: dict[str, dict]) -> None:
    """Refuse, before anything starts, what prepare() could not hand over."""
    if any(d["kind"] == "tty" for d in stdio.values()):
        _our_terminal()


def _our_terminal() -> int:
    """The terminal CRIU gives to a tree that ran on one: ours."""
    for fd in (0, 1, 2):
        if _kind_of(fd) == "tty":
            return fd
    # CRIU puts a restored shell job into the restarting process's session
    # and makes it the foreground group of that session's terminal
    raise UserError("this tree ran on a terminal: restart it from a terminal "
                    "(under `script -qc` for a batch job)")


def _mode(fd: int) -> int:
    return stat.S_IMODE(os.fstat(fd).st_mode)


def _kind_of(fd: int) -> str | None:
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    if stat.S_ISFIFO(st.st_mode):
        return "pipe"
    if stat.S_ISSOCK(st.st_mode):
        return "socket"
    if stat.S_ISCHR(st.st_mode) and os.isatty(fd):
        return "tty"
    if stat.S_ISREG(st.st_mode):
        return "file"
    return "other"


class Handover:
    """What one restore hands to CRIU: (fd, key) pairs for inherit_fd, and
    the relays for streams CRIU cannot take as they are."""

    def __init__(self) -> None:
        self.pairs: list[tuple[int, str]] = []
        self.opened: list[int] = []     # closed once CRIU has them
        self.relays: list[FileRelay] = []
        self.terminal: int | None = None  # criu's stdin, for a shell job's tty

    def close_after_restore(self) -> None:
        for fd in self.opened:
            os.close(fd)
        self.opened.clear()


def prepare(stdio: dict[str, dict], relay_dir, tree_id: str) -> Handover:
    """Match the image's stdio with ours.  Each fd passed is a duplicate
    above 2 (pycriu closes 0-2 in the criu child).  Pipes and sockets take
    any fd; a terminal goes to criu's stdin (see criu_driver); a regular file must be reopened by
    CRIU through /proc, so for an output that is anything else here the
    tree gets a file that the agent relays to it.  A stream with no
    counterpart here goes to /dev/null.  (A relay's file is named after
    the tree too: the agents of several trees may share this process.)"""
    h = Handover()
    seen: set[str] = set()
    for fd_text, desc in sorted(stdio.items()):
        if desc["kind"] == "other" or desc["key"] in seen:
            continue
        seen.add(desc["key"])
        ours = int(fd_text)
        kind = _kind_of(ours)
        if desc["kind"] == "tty":
            if h.terminal is None:
                h.terminal = _our_terminal()
            continue
        if kind is None:
            fd = os.open("/dev/null", os.O_RDWR)
        elif desc["kind"] == "file" and (kind != "file" or _mode(ours) != desc.get("mode", 0o644)):
            # CRIU takes a regular file only as a regular file, and only
            # with the mode it had: anything else here (a pipe, a socket, a
            # terminal, /dev/null, a file of another mode) is relayed
            relay = FileRelay(relay_dir / f"stdio-{os.getpid()}-{tree_id}-{ours}.out", ours,
                              desc.get("mode", 0o644))
            h.relays.append(relay)
            fd = relay.writer_fd()
        else:
            fd = os.dup(ours)
        os.set_inheritable(fd, True)
        h.opened.append(fd)
        h.pairs.append((fd, desc["key"]))
    return h


_libc = ctypes.CDLL(None, use_errno=True)
_KEEP_SIZE, _PUNCH_HOLE = 0x01, 0x02  # fallocate(2) modes


class FileRelay:
    """A private temporary file the tree writes to and the agent tails into
    one of its own fds.  A regular file, because CRIU reopens and seeks
    regular-file entries (a FIFO cannot seek)."""

    POLL = 0.05

    def __init__(self, path, target_fd: int, mode: int = 0o644) -> None:
        self.target = target_fd
        self.read_fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0o600)
        self._write_fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        os.unlink(path)  # the tree and we hold it open; nothing else should
        os.fchmod(self._write_fd, mode)  # the file's mode at checkpoint (CRIU checks)
        self._handle = None

    def writer_fd(self) -> int:
        return self._write_fd

    def start(self, loop) -> None:
        self._handle = loop.call_later(self.POLL, self._pump, loop)

    def _pump(self, loop) -> None:
        self.drain()
        self._handle = loop.call_later(self.POLL, self._pump, loop)

    def drain(self) -> None:
        forwarded = False
        while True:
            data = os.read(self.read_fd, 1 << 16)
            if not data:
                break
            forwarded = True
            try:
                os.write(self.target, data)
            except OSError:
                pass  # our own output is gone; keep reading the tree's
        if forwarded:  # what is forwarded takes no more room on the disk
            done = os.lseek(self.read_fd, 0, os.SEEK_CUR)
            _libc.fallocate(self._write_fd, _PUNCH_HOLE | _KEEP_SIZE, ctypes.c_long(0),
                            ctypes.c_long(done))

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self.drain()
        os.close(self.read_fd)
