"""What dmtcp-coordinator does, however its command line was read
(fastargs.py's coordinator_args or coordinator_click.py)."""
from __future__ import annotations

import asyncio
import errno
import os
import socket
import sys
import threading
import time
from pathlib import Path

from dmtcp_py import logs
from dmtcp_py.cli.fastargs import AUTO, CoordinatorArgs
from dmtcp_py.coordinator import console, rebalance as rebalancing, recovery
from dmtcp_py.coordinator.launching import LAUNCHING_ENV, OWN_COORDINATOR
from dmtcp_py.coordinator.machine import CoordinatorMachine
from dmtcp_py.coordinator.server import CoordinatorServer
from dmtcp_py.errors import UserError, say
from dmtcp_py.paths import token_file
from dmtcp_py.tokens import remove_token_file, write_token_file

# the fd of a socket listening already, which the coordinator serves on
# (cli/coordinators.py Starting: a launch binds the port before its program
# starts, so that the program never runs while its coordinator's port is closed)
LISTEN_FD_ENV = "DMTCP_COORD_LISTEN_FD"


def defaults() -> dict:
    """What an option that fastargs left None is (click's defaults)."""
    return {"max_restarts": recovery.MAX_RESTARTS, "heartbeat": recovery.HEARTBEAT,
            "heartbeat_timeout": recovery.HEARTBEAT_TIMEOUT,
            "rebalance_after": rebalancing.AFTER}


def serve(a: CoordinatorArgs) -> int:
    """Coordinate a computation until it ends (or a quit); the exit code."""
    for name, value in defaults().items():
        if getattr(a, name) is None:
            setattr(a, name, value)
    heartbeat, heartbeat_timeout = a.heartbeat, a.heartbeat_timeout
    coord_port, listen_host, port_file, ckptdir = a.port, a.listen_host, a.port_file, a.ckptdir
    interval, daemon, quiet = a.interval, a.daemon, a.quiet
    if heartbeat and heartbeat_timeout and heartbeat_timeout <= heartbeat:
        raise UserError(f"--heartbeat-timeout ({heartbeat_timeout:g} s) must be longer than "
                        f"--heartbeat ({heartbeat:g} s)")
    if a.rebalance and not a.hosts:
        raise UserError("--rebalance needs --hosts (the hosts the trees may move to)")
    policy = recovery.RecoveryPolicy(auto_restart=a.auto_restart, max_restarts=a.max_restarts,
                                     heartbeat=heartbeat, heartbeat_timeout=heartbeat_timeout,
                                     hosts=_hosts(a.hosts), replicas=a.replicas)
    ready_fd = _daemonize() if daemon else None
    # os.urandom is what secrets and uuid4 read; their modules (hmac,
    # OpenSSL's hashes, platform) were ~10 ms of the coordinator's start
    token = os.environ.get("DMTCP_COORD_TOKEN") or _left_token(coord_port) \
        or os.urandom(16).hex()
    ckpt = Path(ckptdir).resolve() if ckptdir else None
    machine = CoordinatorMachine(os.urandom(6).hex(), exit_on_last=a.exit_on_last,
                                 exit_after_ckpt=a.exit_after_ckpt,
                                 interval=0.0 if interval == AUTO else interval,
                                 interval_auto=interval == AUTO,
                                 now=time.monotonic(), ckptdir=str(ckpt) if ckpt else None,
                                 keep=a.keep,
                                 policy=policy,
                                 rebalance_after=a.rebalance_after if a.rebalance else 0.0)
    launching = os.environ.pop(LAUNCHING_ENV, "")  # a launch started us for its tree
    if launching:
        machine.launch_announced(OWN_COORDINATOR, launching, time.monotonic())
    listen_fd = os.environ.pop(LISTEN_FD_ENV, "")
    listener = socket.socket(fileno=int(listen_fd)) if listen_fd else None
    server = CoordinatorServer(machine, token, host=listen_host, port=coord_port,
                               ckptdir=ckpt, quiet=quiet or daemon, listener=listener)
    return asyncio.run(_main(server, port_file, ready_fd, console_on=not daemon))


def _hosts(spec: str | None) -> tuple[str, ...]:
    """--hosts: h1,h2,... or @FILE (one host per line, # comments)."""
    if not spec:
        return ()
    if spec.startswith("@"):
        try:
            text = Path(spec[1:]).read_text()
        except OSError as exc:
            raise UserError(f"--hosts: cannot read {spec[1:]}: {exc.strerror}") from None
        words = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    else:
        words = [w.strip() for w in spec.split(",")]
    hosts = tuple(dict.fromkeys(w for w in words if w))
    if not hosts:
        raise UserError(f"--hosts {spec}: no host named")
    return hosts


def _left_token(port: int) -> str | None:
    """The token of a coordinator that died on this port without removing
    its file (a clean exit removes it): reused, so that the agents it left
    running rejoin us.  If that coordinator still lived, we could not bind
    its port and would exit."""
    if port == 0:
        return None
    try:
        return token_file(port).read_text().strip() or None
    except OSError:
        return None


async def _main(server: CoordinatorServer, port_file, ready_fd, console_on: bool) -> int:
    try:
        port = await server.start()
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            msg = f"port {server.port} is already in use (another coordinator?)"
        else:
            msg = f"cannot listen on {server.host}:{server.port}: {exc.strerror or exc}"
        _report_ready(ready_fd, "error " + msg)
        raise UserError(msg) from None
    logs.setup(f"coordinator-{port}")
    write_token_file(port, server.token)
    if port_file:
        tmp = Path(str(port_file) + ".tmp")
        tmp.write_text(f"{port}\n")
        os.replace(tmp, port_file)
    server.notice(f"listening on {server.host}:{port}, computation {server.machine.comp_id}")
    _report_ready(ready_fd, f"ok {port}")
    if console_on:
        _start_console(server, asyncio.get_running_loop())
    try:
        await server.run_until_shutdown()
    finally:
        remove_token_file(port, server.token)
    return 0


def _start_console(server: CoordinatorServer, loop: asyncio.AbstractEventLoop) -> None:
    """Read console lines in a thread (stdin may be a tty, a pipe or a file)."""
    def reader():
        for line in sys.stdin:
            loop.call_soon_threadsafe(_console_line, server, line)

    def _console_line(srv, line):
        text = console.handle(line, srv)
        if text:
            print(text, flush=True)

    threading.Thread(target=reader, daemon=True, name="console").start()


def _daemonize() -> int:
    """Fork into the background, in a session of its own; the foreground
    parent exits once the daemon listens (or reports its error), so
    callers can rely on it.  One fork, not the classic two: the second
    only keeps a daemon from acquiring a terminal by opening one, which
    the coordinator never does, and each fork of a process that loaded
    the coordinator was a few ms of every launch or restart that starts
    one (on its way to listening)."""
    rfd, wfd = os.pipe()
    if os.fork() > 0:
        os.close(wfd)
        with os.fdopen(rfd) as r:
            status = r.read().strip()
        if status.startswith("ok"):
            os._exit(0)
        say(f"dmtcp-coordinator: error: {status[6:] or 'failed to start'}")
        os._exit(1)
    os.close(rfd)
    os.setsid()
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    return wfd


def _report_ready(fd, status: str) -> None:
    if fd is not None:
        os.write(fd, status.encode())
        os.close(fd)
