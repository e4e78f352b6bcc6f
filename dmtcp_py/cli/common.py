"""What the commands that run programs share: the coordinator choice and
--gzip options, starting a coordinator when none answers.  (The options and
one-line errors of every command are in base.py.)"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import click

from dmtcp_py.cli.base import run
from dmtcp_py.client import coordinator_alive
from dmtcp_py.errors import UserError
from dmtcp_py.paths import hostname

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


def coordinator_choice_options(f):
    """-j/--join and --new-coordinator, for the commands that may start one."""
    f = click.option("--new-coordinator", is_flag=True,
                     help="Start a new coordinator on the port; fail if one is there.")(f)
    return click.option("-j", "--join", is_flag=True,
                        help="Join an existing coordinator; never start one.")(f)


def gzip_option(f):
    return click.option("--gzip/--no-gzip", envvar="DMTCP_GZIP", default=False,
                        help="Compress the memory pages of this tree's images (zstd, on every "
                        "core, after the program runs again) [env DMTCP_GZIP=1; default: no].")(f)


def incremental_option(f):
    return click.option("--incremental/--no-incremental", envvar="DMTCP_INCREMENTAL",
                        default=False,
                        help="Write only the memory that changed since the previous generation "
                        "(1 MiB chunks, the rest shared with it by hard links); a restart from "
                        "such a generation first puts its page files together [env "
                        "DMTCP_INCREMENTAL=1; default: no].")(f)


def is_local(host: str) -> bool:
    return host in LOCAL_HOSTS or host == hostname()


def start_coordinator(port: int, *, interval: float | str | None = None,
                      keep: int | None = None) -> int:
    """Start a background coordinator (exits with its last client) and
    return its port.  Fails if the port is taken.

    Forks this process rather than starting a new interpreter: everything is
    already imported, which saves a fifth of a second on every launch and
    restart that needs a coordinator.  Called before any thread exists."""
    # here: a launch that joins a coordinator never loads the coordinator's modules
    from dmtcp_py.cli import coordinator

    with tempfile.TemporaryDirectory(prefix="dmtcp-port-") as tmp:
        port_file = Path(tmp) / "port"
        args = ["--daemon", "--exit-on-last", "-q", "--coord-port", str(port),
                "--port-file", str(port_file)]
        if interval:  # seconds, or "auto"
            args += ["--interval", str(interval)]
        if keep is not None:
            args += ["--keep", str(keep)]
        errors_r, errors_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                _name_process(b"dmtcp-coord")  # not launch's name in ps/top
                os.close(errors_r)
                os.dup2(errors_w, 2)
                os.close(errors_w)
                code = run("dmtcp-coordinator", coordinator.cli, args)
            finally:
                os._exit(code)
        os.close(errors_w)
        with os.fdopen(errors_r) as r:
            errors = r.read().strip().splitlines()
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0 or not port_file.exists():
            raise UserError(errors[-1].split("error: ", 1)[-1] if errors
                            else "could not start a coordinator")
        return int(port_file.read_text())


def _name_process(name: bytes) -> None:
    import ctypes
    ctypes.CDLL(None).prctl(15, ctypes.c_char_p(name), 0, 0, 0)  # PR_SET_NAME


def ensure_coordinator(host: str, port: int, *, join: bool, new: bool,
                       interval: float | str | None = None, keep: int | None = None) -> int:
    """The port of a coordinator to use, started here when allowed."""
    if new:
        if not is_local(host):
            raise UserError(f"--new-coordinator starts one on this host, not on {host}")
        return start_coordinator(port, interval=interval, keep=keep)
    if port and coordinator_alive(host, port):
        return port
    if join:
        raise UserError(f"no coordinator at {host}:{port} (--join given)")
    if not is_local(host):
        raise UserError(f"no coordinator at {host}:{port}, and it is not this host: start one there")
    return start_coordinator(port, interval=interval, keep=keep)


def exit_code(status: int) -> int:
    """A child's status as a shell would report it."""
    return 128 - status if status < 0 else status

