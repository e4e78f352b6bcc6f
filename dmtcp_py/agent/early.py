"""A launched program starts before its agent loads (issue 17).

dmtcp-launch starts the tree at once, from modules that cost almost nothing
to import: the shim preloaded, the agent's socket named in the environment,
the tree's init as its root (in a PID namespace of its own where it gets
one), the socket the shims connect to already listening.  The agent's own
modules (asyncio, the protocol's messages, CRIU's bindings: about 85 ms)
load in a thread beside the program; then the agent joins the coordinator
and takes the tree over (runner.py).  Until it does, the shims' first
records and a program's dmtcp_checkpoint() wait in the listening socket's
queue, and the signals the agent forwards to the tree are held (blocked)
in this process, to be delivered once its handlers are in place.

A program that ends before the agent has loaded was never seen by the
coordinator: it is not registered at all, and dmtcp-launch exits with its
status at once, unless it started that coordinator (which then waits for
its first tree, to exit with its last) or processes of the tree outlived
its root (the agent sees to those).
"""
from __future__ import annotations

import _signal
import _socket
import _thread
import gc
import os
import select
import sys

from dmtcp_py import procfs
from dmtcp_py.agent import init_dir, spawn
from dmtcp_py.paths import shim_library, tool, tree_init

# what the agent handles (runner.py): held from before the program starts
# until the agent's handlers are in place
HELD_SIGNALS = frozenset({_signal.SIGTERM, _signal.SIGHUP, _signal.SIGUSR1, _signal.SIGUSR2,
                          _signal.SIGINT, _signal.SIGQUIT, _signal.SIGCHLD})
_WALL = 0x40000000  # waitid: children of any kind


class Plan:
    """What dmtcp-launch settled before the program starts."""

    def __init__(self, *, coord_host: str, coord_port: int, token: str, ckptdir: str,
                 tree_id: str, program: str, argv: list[str], path: str, compress: bool,
                 own_coordinator: bool, keep: int | None = None,
                 incremental: bool = False, precopy: bool = False) -> None:
        self.coord_host, self.coord_port, self.token = coord_host, coord_port, token
        self.ckptdir = ckptdir        # absolute
        self.tree_id = tree_id
        self.program = program        # as given (its base name names the tree)
        self.argv, self.path = argv, path
        self.compress, self.keep, self.incremental = compress, keep, incremental
        self.precopy = precopy
        self.own_coordinator = own_coordinator  # started by this launch


class Started:
    """The tree as the agent takes it over."""

    def __init__(self, pid: int, own_namespace: bool, init_dir: str | None,
                 listener: _socket.socket, sigmask: set[int]) -> None:
        self.pid = pid
        self.own_namespace = own_namespace
        self.init_dir = init_dir  # the init's working directory (init_dir.py), or None
        self.listener = listener  # for the shims, listening (shimlink.py takes it)
        self.sigmask = sigmask    # this process's signal mask before HELD_SIGNALS
        # the connection whose hello announced the tree to the coordinator,
        # open until the agent has joined (coordinator/launching.py)
        self.announcement: _socket.socket | None = None

    def announced(self) -> None:
        """The agent joined (or never will): the announcement ends."""
        if self.announcement is not None:
            self.announcement.close()
            self.announcement = None

    def release_signals(self) -> None:
        """The agent's handlers are in place: what was held is delivered."""
        _signal.pthread_sigmask(_signal.SIG_SETMASK, self.sigmask)


def agent_socket_name(tree_id: str) -> str:
    """The tree's name for its agent's socket (shimlink.py adds the PID
    namespace's inode)."""
    return f"dmtcp-agent-{tree_id}"


def wants_pid_namespace() -> bool:
    """Whether the tree gets a PID namespace of its own (as root: a user
    who is not root may not make one, and the tree runs without).  Its
    pids are then its own: a restart never meets them taken, and two
    copies of one checkpoint run side by side.  Not for a program on a
    terminal: the namespace's init must lead a session of its own, and
    the program would lose the terminal as its controlling one (job
    control, /dev/tty).  DMTCP_PID_NAMESPACE=0 turns it off."""
    if os.environ.get("DMTCP_PID_NAMESPACE", "1").strip().lower() in ("0", "no", "off", "false"):
        return False
    return not any(os.isatty(fd) for fd in (0, 1, 2))


def program_env(plan: Plan) -> dict[str, str]:
    """The program's environment: ours, with the shim preloaded and what it
    and the tools it may run (ssh, srun, `import dmtcp`) need to know."""
    env = dict(os.environ)
    lib = shim_library()
    env["LD_PRELOAD"] = lib + (":" + env["LD_PRELOAD"] if env.get("LD_PRELOAD") else "")
    env["DMTCP_AGENT_SOCK"] = "@" + agent_socket_name(plan.tree_id)
    env["DMTCP_COORD_HOST"] = plan.coord_host
    env["DMTCP_COORD_PORT"] = str(plan.coord_port)
    env["DMTCP_CHECKPOINT_DIR"] = plan.ckptdir
    # `ssh HOST CMD` from the tree: the shim runs this instead (dmtcp_py.ssh),
    # which starts CMD on HOST under this computation with the token
    env["DMTCP_SSH_WRAPPER"] = tool("dmtcp-ssh")
    # and `srun ... CMD` runs as dmtcp-srun (dmtcp_py.slurm), likewise
    env["DMTCP_SRUN_WRAPPER"] = tool("dmtcp-srun")
    # `import dmtcp` for Python programs (hijack/python/dmtcp.py), after theirs
    api_dir = os.path.join(os.path.dirname(os.path.dirname(lib)), "python")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), api_dir) if p)
    env["DMTCP_COORD_TOKEN"] = plan.token
    return env


class CannotListen(OSError):
    """The agent's socket name is taken (the tree runs already?)."""


def _listen(name: str) -> _socket.socket:
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    try:
        sock.bind("\0" + name)
        sock.listen(1024)
    except OSError as exc:
        sock.close()
        raise CannotListen(exc.errno, f"cannot listen for the tree's processes on @{name}: "
                           f"{exc.strerror} (is this tree already running on this host?)")
    return sock


def _socket_name(plan: Plan, namespace: str | None) -> str:
    base = agent_socket_name(plan.tree_id)
    return f"{base}-{namespace}" if namespace else base


def start(plan: Plan) -> Started:
    """Start the program under the tree's init, with the shim preloaded.
    OSError: the init could not be run (CannotListen: the socket's name is
    taken); nothing is left running then."""
    sigmask = _signal.pthread_sigmask(_signal.SIG_BLOCK, HELD_SIGNALS)
    try:
        # before an orphan of the tree can come back to us; not while a
        # coordinator started here daemonizes, or it would come back to us
        # (the agent becomes one once it is up; the init, subreaper of the
        # whole tree, keeps what it orphans meanwhile)
        if not plan.own_coordinator:
            spawn.become_subreaper()
        env = program_env(plan)
        namespace = wants_pid_namespace()
        workdir = init_dir.make(init_dir.for_tree(plan.tree_id)) if namespace else None
        if workdir is not None:
            env[init_dir.ENV] = workdir
        # without a namespace of its own, the tree runs in ours: its name is known
        listener = None if namespace else _listen(_socket_name(plan, procfs.pid_namespace(
            os.getpid())))
        init = tree_init()
        try:
            pid, own = spawn.spawn_root(init, [init, plan.path, *plan.argv], env,
                                        pid_namespace=namespace, sigmask=sigmask)
        except OSError:
            if workdir is not None:
                init_dir.release(workdir)
            if listener is not None:
                listener.close()
            raise
        if not own and workdir is not None:
            init_dir.release(workdir)
            workdir = None
        if listener is None:
            try:
                listener = _listen(_socket_name(plan, procfs.pid_namespace(pid)))
            except OSError:
                _end(pid)
                if workdir is not None:
                    init_dir.release(workdir)
                raise
    except BaseException:
        _signal.pthread_sigmask(_signal.SIG_SETMASK, sigmask)
        raise
    return Started(pid, own, workdir, listener, sigmask)


def _end(pid: int) -> None:
    """A tree that will not be watched: every process of it killed (pid 1
    of a namespace takes the others along; without one, they are found
    below the root), and the root reaped."""
    below, seen = [pid], set()
    while below:
        one = below.pop()
        if one in seen:
            continue
        seen.add(one)
        try:
            os.kill(one, _signal.SIGSTOP)  # (no more children meanwhile)
        except OSError:
            continue
        below.extend(_children(one))
    for one in seen:
        try:
            os.kill(one, _signal.SIGKILL)
        except OSError:
            pass
    try:
        os.waitpid(pid, 0)
    except OSError:
        pass


def abandon(started: Started) -> None:
    """The tree goes, unseen by any coordinator (one started for it could
    not start)."""
    _end(started.pid)
    _leave(started)


def load_beside(started: Started, module: str, *, may_leave: bool) -> int | None:
    """Import module in a thread while the program runs.  None once it is
    loaded; the program's exit code if it ended alone first (no process of
    its tree left) and may_leave: then nothing was registered anywhere, and
    nothing remains to be done but to leave.

    The cyclic collector is off from here on (~10 ms of the import went to
    its passes over objects that all live as long as the process): the
    caller freezes what was loaded and turns it on again (gc.freeze(),
    gc.enable())."""
    loaded_r, loaded_w = os.pipe2(os.O_CLOEXEC)
    gc.disable()

    def load() -> None:
        try:
            __import__(module)
        except BaseException:
            pass  # the main thread imports it again, and meets the error there
        finally:
            os.write(loaded_w, b"x")

    # the main thread, woken by the program's end, gets its turn within a
    # millisecond rather than the default five
    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.001)
    _thread.start_new_thread(load, ())
    pidfd = os.pidfd_open(started.pid)
    try:
        while True:
            watched = [loaded_r, pidfd] if may_leave else [loaded_r]
            ready, _, _ = select.select(watched, [], [])
            if loaded_r in ready:
                return None
            status = _ended_alone(started.pid)
            if status is not None:
                _leave(started)
                return status
            may_leave = False  # orphans: the agent sees to them
    finally:
        os.close(pidfd)
        sys.setswitchinterval(interval)
        # (the write end stays open: the thread may still write to it)
        os.close(loaded_r)


def _ended_alone(root: int) -> int | None:
    """The root's exit code (as a shell says it) if it has ended and no
    other child of ours is left (without reaping it)."""
    try:
        ended = os.waitid(os.P_PID, root, os.WEXITED | os.WNOHANG | os.WNOWAIT | _WALL)
    except ChildProcessError:
        return None
    if ended is None:
        return None
    if any(child != root for child in _children()):
        return None
    if ended.si_code == os.CLD_EXITED:
        return ended.si_status
    return 128 + ended.si_status  # killed by a signal


def _children(pid: int | None = None) -> list[int]:
    """The children of pid (ours by default), from /proc (every thread's)."""
    pid = os.getpid() if pid is None else pid
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        text = procfs.read(f"/proc/{pid}/task/{tid}/children")
        if text:
            out.extend(int(c) for c in text.split())
    return out


def _leave(started: Started) -> None:
    try:
        os.waitpid(started.pid, 0)
    except ChildProcessError:
        pass  # (reaped already)
    started.listener.close()
    if started.init_dir is not None:
        # no process works in it now (init_dir.release() looks at every
        # process of the host to know): the tree was its only user
        try:
            os.rmdir(started.init_dir)
        except OSError:
            pass
