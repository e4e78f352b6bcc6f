"""Which coordinator a launch or a restart uses: the one that answers on
the port, or one started here when that is allowed.

Light (no click, no messages.py): dmtcp-launch asks before it starts the
program.  The coordinator command itself loads only in the process that
becomes the coordinator."""
from __future__ import annotations

import _socket
import errno
import gc
import importlib
import os

from dmtcp_py.errors import CoordinatorUnreachable, UserError
from dmtcp_py.paths import hostname, run_dir_name
from dmtcp_py.protocol.handshake import Coordinator
from dmtcp_py.tokens import remove_token_file, resolve_token, write_token_file

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
MAX_FD = 2**31 - 1  # (closerange's end: close_range(2) takes any)
LISTEN_FD = 3       # where the child finds the listening socket
LISTEN_BACKLOG = 100  # asyncio's create_server's


def is_local(host: str) -> bool:
    return host in LOCAL_HOSTS or host == hostname()


class Starting:
    """A background coordinator to start here (exits with its last client),
    with token if given: begin() forks it, wait() says when it listens."""

    def __init__(self, port: int, *, interval: float | str | None = None,
                 token: str | None = None, keep: int | None = None,
                 launching: str = "") -> None:
        self.port = port  # as asked (0: any; wait() says which)
        self.interval, self.token, self.keep = interval, token, keep
        self.launching = launching  # the tree a launch starts it for (launching.py)
        self._pid: int | None = None
        self._port: int | None = None  # once wait() saw it listen
        self._failed: str | None = None  # once wait() saw it fail: why
        self._errors = -1
        self._port_file = ""
        self._listener: _socket.socket | None = None
        self._token_written = False

    def bind(self) -> int:
        """Listen on the port now (the coordinator serves on this socket
        once it has loaded: a client that connects meanwhile waits in its
        queue rather than finding the port closed, so that a program
        started next never runs while its coordinator's port is closed),
        and write the token file clients read.  The port; UserError if it
        cannot be had."""
        if self._listener is None:
            sock = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
            try:
                sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)  # (asyncio's too)
                sock.bind(("127.0.0.1", self.port))
                sock.listen(LISTEN_BACKLOG)
            except OSError as exc:
                sock.close()
                if exc.errno == errno.EADDRINUSE:
                    raise UserError(f"cannot start a coordinator: port {self.port} is already "
                                    "in use (another coordinator?)") from None
                raise UserError(f"cannot start a coordinator on 127.0.0.1:{self.port}: "
                                f"{exc.strerror or exc}") from None
            self._listener = sock
            self.port = sock.getsockname()[1]
            if self.token:
                write_token_file(self.port, self.token)
                self._token_written = True
        return self.port

    def begin(self, *, sigmask: set[int] | None = None) -> None:
        """Fork this process rather than start a new interpreter: what is
        already imported is shared, and the rest loads in the child while
        this process goes on (a launch forks it as soon as the program
        runs, so that it loads beside the agent, on another core).  No
        other thread may be running.  The child takes sigmask as its signal
        mask, and keeps none of this process's fds but its standard ones and
        the listening socket (bind()): a coordinator holding the program's
        pipes, CRIU's or the images would keep them open as long as the
        computation lives."""
        self.bind()
        self._port_file = os.path.join(run_dir_name(),
                                       f"port-{os.getpid()}-{os.urandom(4).hex()}")
        args = ["--daemon", "--exit-on-last", "-q", "--coord-port", str(self.port),
                "--port-file", self._port_file]
        if self.interval:  # seconds, or "auto"
            args += ["--interval", str(self.interval)]
        if self.keep is not None:
            args += ["--keep", str(self.keep)]
        errors_r, errors_w = os.pipe2(os.O_CLOEXEC)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                _name_process(b"dmtcp-coord")  # not launch's name in ps/top
                os.dup2(errors_w, 2)
                os.dup2(self._listener.fileno(), LISTEN_FD)
                # (the objects that held them are never used here)
                os.closerange(LISTEN_FD + 1, MAX_FD)
                if sigmask is not None:
                    import _signal
                    _signal.pthread_sigmask(_signal.SIG_SETMASK, sigmask)
                if self.token:
                    os.environ["DMTCP_COORD_TOKEN"] = self.token
                if self.launching:
                    from dmtcp_py.coordinator.launching import LAUNCHING_ENV
                    os.environ[LAUNCHING_ENV] = self.launching
                # here: a launch that joins a coordinator never loads its
                # modules; the collector's passes over what they make, which
                # lives as long as the process, would only slow them down
                gc.disable()
                from dmtcp_py.cli.coordinator import run_coordinator
                coordinating = importlib.import_module("dmtcp_py.cli.coordinating")
                os.environ[coordinating.LISTEN_FD_ENV] = str(LISTEN_FD)
                gc.freeze()
                gc.enable()
                code = run_coordinator(args)
            finally:
                os._exit(code)
        os.close(errors_w)
        self._listener.close()  # the coordinator's now: it ends with it
        self._pid, self._errors = pid, errors_r

    def wait(self) -> int:
        """Once it listens (its daemon's parent exits then): its port, or
        UserError saying why it could not start."""
        assert self._pid is not None, "begin() first"
        if self._port is not None:
            return self._port
        if self._failed is not None:
            raise UserError(self._failed)
        with os.fdopen(self._errors) as r:
            errors = r.read().strip().splitlines()
        _, status = os.waitpid(self._pid, 0)
        try:
            with open(self._port_file) as f:
                port = int(f.read())
            os.unlink(self._port_file)
        except (OSError, ValueError):
            port = None
        if os.waitstatus_to_exitcode(status) != 0 or port is None:
            self._failed = (errors[-1].split("error: ", 1)[-1] if errors
                            else "could not start a coordinator")
            self._forget_token()
            raise UserError(self._failed)
        self._port = port
        return port

    def _forget_token(self) -> None:
        """The token file bind() wrote, for a coordinator that never ran."""
        if self._token_written:
            remove_token_file(self.port, self.token)

    def release(self) -> None:
        """Never begun after all (the launch or restart failed first): the
        port and the token file bind() took go."""
        if self._pid is None and self._listener is not None:
            self._listener.close()
            self._listener = None
            self._forget_token()

    def stop(self) -> None:
        """End a coordinator begun for a restart that failed before any
        agent joined it: it would wait for one for ever."""
        if self._pid is None:
            self.release()
            return
        try:
            port = self.wait()
        except UserError:
            return  # it did not start
        try:
            with Coordinator("127.0.0.1", port) as coordinator:
                coordinator.hello(resolve_token(port))
                coordinator.command("quit", 5.0)
        except (UserError, OSError):
            return  # gone already
        # gone when this returns: the port is free for the next command
        import socket
        import time
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            except OSError:
                return
            time.sleep(0.01)


def _name_process(name: bytes) -> None:
    import ctypes
    ctypes.CDLL(None).prctl(15, ctypes.c_char_p(name), 0, 0, 0)  # PR_SET_NAME


def find_or_start(host: str, port: int, *, join: bool, new: bool,
                  interval: float | str | None = None, token: str | None = None,
                  keep: int | None = None, launching: str = "") -> Coordinator | Starting:
    """A connection to the coordinator that answers on the port, or one to
    start here (with token, if given: Starting.begin()) when that is
    allowed; one started here for a launch knows the tree it is launching."""
    if new:
        if not is_local(host):
            raise UserError(f"--new-coordinator starts one on this host, not on {host}")
        return Starting(port, interval=interval, token=token, keep=keep, launching=launching)
    if port:
        try:
            return Coordinator(host, port)
        except CoordinatorUnreachable:
            pass
    if join:
        raise UserError(f"no coordinator at {host}:{port} (--join given)")
    if not is_local(host):
        raise UserError(f"no coordinator at {host}:{port}, and it is not this host: start one there")
    return Starting(port, interval=interval, token=token, keep=keep, launching=launching)


def exit_code(status: int) -> int:
    """A child's status as a shell would report it."""
    return 128 - status if status < 0 else status
