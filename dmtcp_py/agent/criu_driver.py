"""CRIU: dumps through pycriu's RPC (criu swrk), restores through criu's
command line (Restoring says why), and nothing else.

Blocking calls: the agent runs them in a worker thread.  Errors come back as
CriuError with CRIU's own last error line and the log file to read.
"""
from __future__ import annotations

import os
import struct
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from dmtcp_py.paths import criu_binary, unprivileged


class CriuError(Exception):
    pass


def _pycriu() -> ModuleType:
    """pycriu (its `criu` class for a dump's RPC, `images` for the image
    files), imported at the first use: with the protobuf modules it
    loads it takes ~40 ms, which every dmtcp-launch would pay at start-up
    otherwise."""
    import pycriu
    return pycriu


def _log_level() -> int:
    # CRIU: 1 errors, 2 warnings, 3 info, 4 debug
    return 4 if os.environ.get("DMTCP_LOG_LEVEL", "").upper() == "DEBUG" else 2


def _criu_env(log_path: Path, track: bool = False) -> dict | None:
    extra = {}
    if unprivileged() and not os.environ.get("XDG_RUNTIME_DIR"):
        # an unprivileged criu keeps its cache of the kernel's features
        # there, and without it detects them again at every run (~20 ms)
        extra["XDG_RUNTIME_DIR"] = str(log_path.parent)
    if track:  # written pages by write protection (agent/tracking.py)
        from dmtcp_py.agent.tracking import CRIU_ENV
        extra[CRIU_ENV] = "1"
    return {**os.environ, **extra} if extra else None


# the running `criu swrk` of each DumpSession: pid -> its log's file name,
# which names the tree (a swrk's command line does not: tree._kill_criu)
_sessions: dict[int, str] = {}


def dump_pids(mark: str) -> list[int]:
    """The pids of the dumps under way whose log's name holds mark."""
    return [pid for pid, name in list(_sessions.items()) if mark in name]


class DumpSession:
    """One criu swrk process and its RPC options, for a dump.

    We start `criu swrk` ourselves and give pycriu the socket (use_fd):
    knowing criu's pid lets the agent reap exactly its own children.  The
    agent starts it as a round begins (begin_dump), so that CRIU has
    started (~4 ms here) by the time the tree, stopped meanwhile, is to be
    dumped."""

    def __init__(self, log_path: Path, track: bool = False) -> None:
        import socket  # (dumps only: a restore runs CRIU's command line)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [criu_binary(), "swrk", str(theirs.fileno())],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),), close_fds=True, env=_criu_env(log_path, track))
        except OSError as exc:
            ours.close()
            raise CriuError(f"cannot run {criu_binary()}: {exc.strerror or exc}") from None
        finally:
            theirs.close()
        self.sock = ours
        _sessions[self.proc.pid] = log_path.name
        self.rpc = _pycriu().criu()
        self.rpc.use_fd(ours.fileno())
        self.log_path, self.track = log_path, track
        # criu opens these through /proc/<our pid>/fd, so they stay ours
        self.fds = [os.open(log_path.parent, os.O_DIRECTORY)]
        opts = self.rpc.opts
        opts.work_dir_fd = self.fds[0]
        opts.log_file = log_path.name
        opts.log_level = _log_level()
        opts.shell_job = True
        opts.file_locks = True
        # a file mapped through a name it no longer has, but alive under
        # another (sem_open's temporary name): CRIU reopens it through a
        # link it makes at dump time (see link_remaps)
        opts.link_remap = True
        # a removed file the tree still maps or holds (MPICH's and UCX's
        # shared-memory segments are removed once every rank mapped them)
        # goes into the image whole; CRIU's default refuses above 1 MiB
        opts.ghost_limit = 0xFFFFFFFF
        # not root: CRIU does what CAP_CHECKPOINT_RESTORE allows and says
        # what it cannot do instead of trying
        opts.unprivileged = unprivileged()

    def usable(self, log_path: Path, track: bool = False) -> bool:
        """Still waiting for its request, for this log (and tracking)."""
        return self.proc.poll() is None and self.log_path == log_path and self.track == track

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []
        self.sock.close()  # pycriu closed its socket object; this is the original
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        _sessions.pop(self.proc.pid, None)


def _failure(what: str, exc: Exception, log_path: Path,
             session: "DumpSession | None" = None) -> CriuError:
    if session is not None:
        try:  # a killed criu is gone at once; one that refused waits for more requests
            status = session.proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            status = None
        if status is not None and status < 0:  # killed: its log stops mid-way
            return CriuError(f"criu {what} failed: criu was killed by signal {-status} "
                             f"(log: {log_path})")
    last = ""
    try:
        # the first real error is the cause; "rlimit" is harmless here and
        # "Restoring FAILED" is only the conclusion
        lines = [ln for ln in log_path.read_text(errors="replace").splitlines()
                 if "Error" in ln and "RLIMIT_NOFILE" not in ln and "FAILED" not in ln]
        if lines:
            last = lines[0].split("): ", 1)[-1].strip()
    except OSError:
        pass
    detail = last or str(exc)
    return CriuError(f"criu {what} failed: {detail} (log: {log_path})")


def begin_dump(log_path: Path, track: bool = False) -> DumpSession:
    """CRIU started for a dump to come (CriuError if it cannot run);
    track: with write tracking (agent/tracking.py)."""
    return DumpSession(log_path, track)


def dump(root_pid: int, images_dir: Path, log_path: Path, *, leave_running: bool,
         external: list[str], session: DumpSession | None = None,
         track: bool = False, parent: Path | None = None,
         on_dumped: Callable[[], None] | None = None,
         before_seizing: Callable[[], None] | None = None,
         on_seized: Callable[[], None] | None = None) -> None:
    """session: begin_dump's for this log_path, used and closed here
    (one that ended meanwhile is replaced).  track: CRIU reads which pages
    were written since the last tracked dump, and protects them again
    (agent/tracking.py); parent: that dump's images (a directory with its
    pagemaps), where CRIU leaves the pages not written since.  Called in
    this thread, and waited for by CRIU: before_seizing, as CRIU is about
    to seize the tree (its pre-dump notification); on_seized, once it has,
    before it reads anything of the processes or puts its parasite into
    them (query-ext-files); on_dumped, once every image is written, the
    tree still frozen (post-dump).  What one of them raises ends the dump
    (CRIU lets the tree go) and is raised again here."""
    pycriu = _pycriu()
    if session is not None and not session.usable(log_path, track):
        session.close()
        session = None
    if session is None:
        session = DumpSession(log_path, track)
    try:
        session.fds.append(os.open(images_dir, os.O_DIRECTORY))
        session.rpc.opts.images_dir_fd = session.fds[-1]
        if track:
            session.rpc.opts.track_mem = True
            if parent is not None:
                session.rpc.opts.parent_img = str(parent)
        session.rpc.opts.pid = root_pid
        session.rpc.opts.leave_running = leave_running
        session.rpc.opts.external.extend(external)
        hooks = {name: hook for name, hook in (("pre-dump", before_seizing),
                                                ("query-ext-files", on_seized),
                                                ("post-dump", on_dumped)) if hook is not None}
        if hooks:
            _dump_notified(session, hooks)
        else:
            session.rpc.dump()
    except (pycriu.CRIUException, _RpcBroken) as exc:
        raise _failure("dump", exc, log_path, session) from None
    finally:
        session.close()


class _RpcBroken(Exception):
    """CRIU's RPC socket broke or spoke nonsense (pycriu's own
    CRIUExceptionInternal is not importable: its module's name is its
    class's)."""


def _dump_notified(session: DumpSession, hooks: dict[str, Callable[[], None]]) -> None:
    """pycriu's dump, asking CRIU to stop at its action scripts' points
    (notify_scripts): each one it announces is answered once its hook
    (by the point's name) has returned, at once where there is none.  A
    hook's exception is answered as a failure, and raised once CRIU has
    given up."""
    pycriu = _pycriu()
    from google.protobuf.message import DecodeError  # (pycriu's protobuf, loaded with it)
    rpc = pycriu.rpc
    req = rpc.criu_req(type=rpc.DUMP)
    req.opts.MergeFrom(session.rpc.opts)
    req.opts.notify_scripts = True
    failed: BaseException | None = None
    try:
        session.sock.send(req.SerializeToString())
        while True:
            resp = rpc.criu_resp()
            resp.ParseFromString(_recv_packet(session.sock))
            if resp.type != rpc.NOTIFY:
                break
            hook = hooks.get(resp.notify.script) if failed is None else None
            try:
                if hook is not None:
                    hook()
            except BaseException as exc:  # (CRIU must hear of it, or it waits for ever)
                failed = exc
            session.sock.send(rpc.criu_req(type=rpc.NOTIFY, notify_success=failed is None)
                              .SerializeToString())
    except (OSError, DecodeError) as exc:
        raise _RpcBroken(f"DUMP failed: {exc}") from None
    if failed is not None:
        raise failed
    if not resp.success:
        raise pycriu.CRIUExceptionExternal(rpc.DUMP, resp.type, resp.cr_errno)


def _recv_packet(sock) -> bytes:
    """One message of CRIU's SOCK_SEQPACKET, whatever its size (its length
    peeked first, as pycriu does); EOF (criu ended) is an error."""
    import socket  # (dumps only, as in DumpSession)
    size = len(sock.recv(1, socket.MSG_TRUNC | socket.MSG_PEEK))
    data = sock.recv(size) if size else b""
    if not data:
        raise ConnectionError("criu closed its RPC socket")
    return data


def pre_dump(root_pid: int, images_dir: Path, log_path: Path, *,
             parent: Path | None = None) -> None:
    """`criu pre-dump` of the running tree, with write tracking: the
    memory only (no files, so the shims' links to the agent may stay),
    CRIU's VM_READ mode (the tree is frozen while CRIU reads its page
    tables and protects its written pages, then runs again while CRIU reads
    the pages with process_vm_readv: a page written meanwhile is written
    again, so it is dumped again by the next dump, whatever was read).
    parent: the last tracked dump's pagemaps (tracking_parent's), whose
    pages CRIU leaves there."""
    pycriu = _pycriu()
    session = DumpSession(log_path, track=True)
    try:
        session.fds.append(os.open(images_dir, os.O_DIRECTORY))
        opts = session.rpc.opts
        opts.images_dir_fd = session.fds[-1]
        opts.track_mem = True
        if parent is not None:
            opts.parent_img = str(parent)
        opts.pid = root_pid
        opts.pre_dump_mode = pycriu.rpc.VM_READ
        session.rpc.pre_dump()
    except pycriu.CRIUException as exc:
        raise _failure("pre-dump", exc, log_path, session) from None
    finally:
        session.close()


_OPEN_TIME_ONLY = (os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_TRUNC | os.O_NOCTTY
                   | getattr(os, "O_TMPFILE", 0))


def _unpin_external_file(entry) -> bool:
    """A file declared external at dump is the tree's stdio, handed over at
    restore from the restarting command (inherit_fd): a different file by
    design.  CRIU's check that it still has its dump-time size could only
    refuse a good restore, and its dump-time offset would leave a hole in
    the new output file: output continues in append mode at the end, input
    keeps its offset."""
    if not (entry.HasField("reg") and entry.reg.ext):
        return False
    reg = entry.reg
    reg.ClearField("size")
    # CRIU reopens the handed-over fd through /proc/self/fd with these
    # flags: open-time-only ones (say Python's tempfile's O_NOFOLLOW and
    # O_EXCL) would fail on the magic link or truncate the new file
    flags = reg.flags & ~_OPEN_TIME_ONLY
    if flags & os.O_ACCMODE != os.O_RDONLY:
        flags |= os.O_APPEND
        reg.pos = 0
    reg.flags = flags
    return True


def _rearm_fired_timerfd(entry) -> bool:
    """A periodic timerfd that fired while the program was stopped (nobody
    read it) reports 0 time left; CRIU 4.2.1 restores it with
    timerfd_settime(0, interval), which disarms it for good (seen here:
    the restored program never got another expiry).  1 ns left re-arms it;
    the unread expiry count is restored separately (ticks)."""
    if not entry.HasField("tfd"):
        return False
    tfd = entry.tfd
    if not (tfd.isec or tfd.insec) or tfd.vsec or tfd.vnsec:
        return False
    tfd.vnsec = 1
    return True


# each takes a file_entry message, changes it in place, says if it applied
_FIXES = (_unpin_external_file, _rearm_fired_timerfd)
_INT = struct.Struct("i")  # magic numbers, each entry's length (native, as pycriu reads them)


def _read_image(path: Path, magic_name: str, message) -> tuple[bytes, list]:
    """(its head: the magic numbers, the entries as protobuf messages) of a
    CRIU image whose entries carry no extra data.  Not pycriu.images.load:
    it makes a dict of every field of every entry, most of the ~2 ms a
    small tree's files.img took at each dump, while the program waits."""
    magic = _pycriu().images.magic
    data = path.read_bytes()
    if len(data) < 4:
        raise CriuError(f"{path} is not a CRIU {magic_name} image")
    (value,), at = _INT.unpack_from(data), 4
    if value in (magic.by_name["IMG_COMMON"], magic.by_name["IMG_SERVICE"]) and len(data) >= 8:
        (value,), at = _INT.unpack_from(data, 4), 8
    if value != magic.by_name[magic_name]:
        raise CriuError(f"{path} is not a CRIU {magic_name} image")
    head, entries = data[:at], []
    while at < len(data):
        (size,) = _INT.unpack_from(data, at)
        at += _INT.size
        if size < 0 or at + size > len(data):
            raise CriuError(f"{path} is cut short")
        entry = message()
        entry.ParseFromString(data[at:at + size])
        entries.append(entry)
        at += size
    return head, entries


class FilesImage:
    """CRIU's files.img of one dump, read once for both things done with it
    after the dump: its fixes (fix) and the names of the files CRIU reopens
    through link remaps (link_remaps)."""

    def __init__(self, images_dir: Path) -> None:
        self.images_dir = images_dir
        self.path = images_dir / "files.img"
        self.head, self.entries = _read_image(self.path, "FILES",
                                              _pycriu().images.pb.file_entry)

    def fix(self) -> int:
        """Correct the image after a dump, each fix for one problem (above).
        It is written again only if an entry changed.  Returns the number of
        entries changed."""
        changed = 0
        for entry in self.entries:
            before = entry.SerializeToString()
            if any([fix(entry) for fix in _FIXES]) and entry.SerializeToString() != before:
                changed += 1
        if changed:
            tmp = self.path.with_name(self.path.name + ".tmp")
            with open(tmp, "wb") as f:
                f.write(self.head)
                for entry in self.entries:
                    payload = entry.SerializeToString()
                    f.write(_INT.pack(len(payload)))
                    f.write(payload)
            os.replace(tmp, self.path)
        return changed

    def link_remaps(self) -> list[tuple[str, str]]:
        """(link CRIU reopens through, the removed name it stands for) of
        each file the dump saw mapped through a removed name.  A dump that
        leaves the tree running removes those links again; a restart needs
        them."""
        images = _pycriu().images
        try:
            _, remaps = _read_image(self.images_dir / "remap-fpath.img", "REMAP_FPATH",
                                    images.pb.remap_file_path_entry)
        except FileNotFoundError:
            return []
        linked = images.pb.remap_file_path_entry.DESCRIPTOR.fields_by_name[
            "remap_type"].enum_type.values_by_name["LINKED"].number
        names = {e.id: e.reg.name for e in self.entries if e.HasField("reg")}
        return [(names[r.remap_id], names[r.orig_id]) for r in remaps
                if (not r.HasField("remap_type") or r.remap_type == linked)
                and r.remap_id in names and r.orig_id in names]


def fix_files_image(images_dir: Path) -> int:
    """FilesImage(images_dir).fix(), for one who needs nothing else of it."""
    return FilesImage(images_dir).fix()


class LazyPages:
    """`criu lazy-pages`: the memory of a tree restored lazily comes from
    its page files through userfaultfd, a page when the program first
    touches it, the rest pushed in the background; the daemon ends once
    every page is in.  It listens in work_dir, which the restore must use
    as its own (one directory per lazy restore: the socket's name is fixed)."""

    SOCKET = "lazy-pages.socket"

    def __init__(self, images_dir: Path, work_dir: Path) -> None:
        try:
            self.proc = subprocess.Popen(
                [criu_binary(), "lazy-pages", "--images-dir", str(images_dir),
                 "--work-dir", str(work_dir), "-o", "lazy-pages.log", "-v" + str(_log_level())],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                close_fds=True)
        except OSError as exc:
            raise CriuError(f"cannot run {criu_binary()}: {exc.strerror or exc}") from None
        socket_path = work_dir / self.SOCKET
        deadline = time.monotonic() + 10.0
        while not socket_path.exists():  # restore must find it listening
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise _failure("lazy-pages", CriuError("it did not start"),
                               work_dir / "lazy-pages.log")
            time.sleep(0.002)

    def stop(self) -> None:
        """End it (the tree is gone, or the restore failed)."""
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=10)
        except (subprocess.TimeoutExpired, ChildProcessError):
            pass


class Restoring:
    """`criu restore` under way, the tree made a child of this process
    (--restore-sibling).  CRIU's command line rather than its RPC: the
    restore then needs no protobuf bindings, whose import (~40 ms, more on
    a busy host) stood before every restart, and it starts at once, while
    the agent's own modules still load (dmtcp-restart's early restore).

    terminal: the fd a shell job's terminal is inherited from (criu's
    stdin); inherit: (fd, key) pairs for --inherit-fd; lazy: memory from a
    LazyPages listening in log_path's directory.  wait() says how it went."""

    def __init__(self, images_dir: Path, log_path: Path, *, inherit: list[tuple[int, str]],
                 terminal: int | None = None, lazy: bool = False) -> None:
        self.log_path = log_path
        self.pidfile = log_path.with_suffix(".pid")
        argv = [criu_binary(), "restore", "--images-dir", str(images_dir),
                "--work-dir", str(log_path.parent), "--log-file", log_path.name,
                f"-v{_log_level()}", "--restore-detached", "--restore-sibling",
                "--shell-job", "--file-locks", "--link-remap", "--pidfile", str(self.pidfile)]
        if lazy:
            argv.append("--lazy-pages")
        if unprivileged():
            argv.append("--unprivileged")
        for fd, key in inherit:
            argv += ["--inherit-fd", f"fd[{fd}]:{key}"]
        try:
            self.proc = subprocess.Popen(
                argv, stdin=terminal if terminal is not None else subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                pass_fds=tuple(fd for fd, _ in inherit), close_fds=True,
                env=_criu_env(log_path))
        except OSError as exc:
            raise CriuError(f"cannot run {criu_binary()}: {exc.strerror or exc}") from None

    def wait(self) -> int:
        """Blocks until CRIU is done: the restored root's pid, or CriuError."""
        status = self.proc.wait()
        try:
            with open(self.pidfile) as f:
                pid = int(f.read().strip() or 0)
            os.unlink(self.pidfile)
        except (OSError, ValueError):
            pid = 0
        if status < 0:  # killed: its log stops mid-way
            raise CriuError(f"criu restore failed: criu was killed by signal {-status} "
                            f"(log: {self.log_path})")
        if status != 0 or pid <= 0:
            raise _failure("restore", CriuError(f"criu exited with {status}"), self.log_path)
        return pid


_versions: dict[tuple, str] = {}
# one asks at a time: the agents of many restored trees in one process
# (together.py) warm up at once, and each asked CRIU itself
_asking = threading.Lock()


def version() -> str:
    """CRIU's version, for the manifest.  Asked of the binary once per
    installed build of it (path, device, inode, mtime), not at every
    checkpoint: `criu --version` is a fork and exec, 6-9 ms here.  A failure
    to tell is not remembered."""
    path = criu_binary()
    try:
        st = os.stat(path)
    except OSError:
        return "unknown"
    key = (path, st.st_dev, st.st_ino, st.st_mtime_ns)
    with _asking:
        if key not in _versions:
            found = _ask_version(path)
            if found == "unknown":
                return found
            _versions[key] = found
        return _versions[key]


def _ask_version(path: str) -> str:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True,
                             timeout=10, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    for line in out.splitlines():
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def link_remaps(images_dir: Path) -> list[tuple[str, str]]:
    """FilesImage(images_dir).link_remaps(), for one who needs nothing else
    of files.img."""
    return FilesImage(images_dir).link_remaps()
