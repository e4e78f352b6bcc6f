"""Which coordinator a launch or a restart uses: the one that answers on
the port, or one started here when that is allowed.

Light (no click, no messages.py): dmtcp-launch asks before it starts the
program.  The coordinator command itself loads only in the process that
becomes the coordinator."""
from __future__ import annotations

import os

from dmtcp_py.errors import CoordinatorUnreachable, UserError
from dmtcp_py.paths import hostname
from dmtcp_py.protocol.handshake import Coordinator

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


def is_local(host: str) -> bool:
    return host in LOCAL_HOSTS or host == hostname()


def start_coordinator(port: int, *, interval: float | str | None = None) -> int:
    """Start a background coordinator (exits with its last client) and
    return its port.  Fails if the port is taken.

    Forks this process rather than starting a new interpreter: what is
    already imported is shared, and the rest loads in the child.  Called
    before any thread exists."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="dmtcp-port-") as tmp:
        port_file = os.path.join(tmp, "port")
        args = ["--daemon", "--exit-on-last", "-q", "--coord-port", str(port),
                "--port-file", port_file]
        if interval:  # seconds, or "auto"
            args += ["--interval", str(interval)]
        errors_r, errors_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                _name_process(b"dmtcp-coord")  # not launch's name in ps/top
                os.close(errors_r)
                os.dup2(errors_w, 2)
                os.close(errors_w)
                # here: a launch that joins a coordinator never loads its modules
                from dmtcp_py.cli import coordinator
                from dmtcp_py.cli.base import run
                code = run("dmtcp-coordinator", coordinator.cli, args)
            finally:
                os._exit(code)
        os.close(errors_w)
        with os.fdopen(errors_r) as r:
            errors = r.read().strip().splitlines()
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0 or not os.path.exists(port_file):
            raise UserError(errors[-1].split("error: ", 1)[-1] if errors
                            else "could not start a coordinator")
        with open(port_file) as f:
            return int(f.read())


def _name_process(name: bytes) -> None:
    import ctypes
    ctypes.CDLL(None).prctl(15, ctypes.c_char_p(name), 0, 0, 0)  # PR_SET_NAME


def find_or_start(host: str, port: int, *, join: bool, new: bool,
                  interval: float | str | None = None) -> tuple[int, Coordinator | None]:
    """The port of a coordinator to use, and a connection to it if it was
    found there (None: started here)."""
    if new:
        if not is_local(host):
            raise UserError(f"--new-coordinator starts one on this host, not on {host}")
        return start_coordinator(port, interval=interval), None
    if port:
        try:
            return port, Coordinator(host, port)
        except CoordinatorUnreachable:
            pass
    if join:
        raise UserError(f"no coordinator at {host}:{port} (--join given)")
    if not is_local(host):
        raise UserError(f"no coordinator at {host}:{port}, and it is not this host: start one there")
    return start_coordinator(port, interval=interval), None


def ensure_coordinator(host: str, port: int, *, join: bool, new: bool,
                       interval: float | str | None = None) -> int:
    """The port of a coordinator to use, started here when allowed."""
    port, found = find_or_start(host, port, join=join, new=new, interval=interval)
    if found is not None:
        found.close()
    return port


def exit_code(status: int) -> int:
    """A child's status as a shell would report it."""
    return 128 - status if status < 0 else status
