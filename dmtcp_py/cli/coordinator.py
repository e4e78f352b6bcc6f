"""dmtcp-coordinator: one per computation."""
from __future__ import annotations

import asyncio
import errno
import os
import secrets
import sys
import threading
import time
import uuid
from pathlib import Path

import click

from dmtcp_py import __version__, logs
from dmtcp_py.cli.base import AUTO, CONTEXT, INTERVAL, coord_port_option, keep_option, run
from dmtcp_py.coordinator import console, rebalance as rebalancing, recovery
from dmtcp_py.coordinator.machine import CoordinatorMachine
from dmtcp_py.coordinator.server import CoordinatorServer
from dmtcp_py.errors import UserError
from dmtcp_py.paths import token_file


@click.command(context_settings=CONTEXT)
@coord_port_option
@click.option("--listen", "listen_host", default="127.0.0.1", show_default=True, metavar="ADDR",
              help="Address to listen on; give 0.0.0.0 for trees on other hosts.")
@click.option("--port-file", type=click.Path(dir_okay=False), metavar="FILE",
              help="Write the port actually used here (useful with --coord-port 0).")
@click.option("--ckptdir", type=click.Path(file_okay=False), envvar="DMTCP_CHECKPOINT_DIR",
              metavar="DIR", help="Directory for the restart script (and images, for trees "
                                  "that do not choose their own) [env DMTCP_CHECKPOINT_DIR].")
@click.option("-i", "--interval", type=INTERVAL, default=0,
              envvar="DMTCP_CHECKPOINT_INTERVAL", metavar="SECONDS|auto",
              help="Checkpoint every SECONDS (0: only on request); auto: choose the interval "
                   "from the checkpoints' cost and the failures seen "
                   "[env DMTCP_CHECKPOINT_INTERVAL].")
@click.option("--exit-on-last", is_flag=True, help="Exit when the last process exits.")
@click.option("--exit-after-ckpt", is_flag=True,
              help="Stop the computation after its next checkpoint, then exit.")
@click.option("--auto-restart", is_flag=True, envvar="DMTCP_AUTO_RESTART",
              help="When a tree is lost (its program killed by a signal, its agent or host "
                   "gone), stop the others and restart all from the newest complete "
                   "checkpoint [env DMTCP_AUTO_RESTART=1].")
@click.option("--max-restarts", type=click.IntRange(min=0), default=recovery.MAX_RESTARTS,
              show_default=True, envvar="DMTCP_MAX_RESTARTS", metavar="N",
              help="Give up after N restart attempts [env DMTCP_MAX_RESTARTS].")
@click.option("--hosts", metavar="H1,H2,...|@FILE", envvar="DMTCP_HOSTS",
              help="Hosts the computation may use; those without trees are spares for "
                   "the trees of a lost host (a file: one host per line) [env DMTCP_HOSTS].")
@click.option("--heartbeat", type=click.FloatRange(min=0), default=recovery.HEARTBEAT,
              show_default=True, envvar="DMTCP_HEARTBEAT", metavar="SECONDS",
              help="Seconds between heartbeats with the agents; 0: none "
                   "[env DMTCP_HEARTBEAT].")
@click.option("--heartbeat-timeout", type=click.FloatRange(min=0),
              default=recovery.HEARTBEAT_TIMEOUT, show_default=True,
              envvar="DMTCP_HEARTBEAT_TIMEOUT", metavar="SECONDS",
              help="An agent (or coordinator) silent this long is lost "
                   "[env DMTCP_HEARTBEAT_TIMEOUT].")
@click.option("--replicas", type=click.IntRange(min=0), default=0, show_default=True,
              envvar="DMTCP_REPLICAS", metavar="N",
              help="Copy each tree's published images to N other hosts of the computation, "
                   "so that a lost host's trees restart from a copy [env DMTCP_REPLICAS].")
@keep_option
@click.option("--rebalance", is_flag=True, envvar="DMTCP_REBALANCE",
              help="Move the trees a host slows down (its CPUs taken by processes not under "
                   "control) to the least loaded host of --hosts [env DMTCP_REBALANCE=1].")
@click.option("--rebalance-after", type=click.FloatRange(min=0, min_open=True),
              default=rebalancing.AFTER, show_default=True, envvar="DMTCP_REBALANCE_AFTER",
              metavar="SECONDS",
              help="With --rebalance: how long a host stays overloaded before its slowed "
                   "trees move [env DMTCP_REBALANCE_AFTER].")
@click.option("--daemon", is_flag=True, help="Run in the background (no console).")
@click.option("-q", "--quiet", is_flag=True, help="Print no progress messages.")
@click.version_option(__version__, "--version")
def cli(coord_port, listen_host, port_file, ckptdir, interval, exit_on_last, exit_after_ckpt,
        auto_restart, max_restarts, hosts, heartbeat, heartbeat_timeout, replicas, keep,
        rebalance, rebalance_after, daemon, quiet):
    """Coordinate checkpoints of every process tree launched against it.

    Console commands on standard input: c checkpoint, l list, s status,
    i N (or i auto) interval, k kill, q quit, h help.
    """
    if heartbeat and heartbeat_timeout and heartbeat_timeout <= heartbeat:
        raise UserError(f"--heartbeat-timeout ({heartbeat_timeout:g} s) must be longer than "
                        f"--heartbeat ({heartbeat:g} s)")
    if rebalance and not hosts:
        raise UserError("--rebalance needs --hosts (the hosts the trees may move to)")
    policy = recovery.RecoveryPolicy(auto_restart=auto_restart, max_restarts=max_restarts,
                                     heartbeat=heartbeat, heartbeat_timeout=heartbeat_timeout,
                                     hosts=_hosts(hosts), replicas=replicas)
    ready_fd = _daemonize() if daemon else None
    token = os.environ.get("DMTCP_COORD_TOKEN") or _left_token(coord_port) \
        or secrets.token_hex(16)
    ckpt = Path(ckptdir).resolve() if ckptdir else None
    machine = CoordinatorMachine(uuid.uuid4().hex[:12], exit_on_last=exit_on_last,
                                 exit_after_ckpt=exit_after_ckpt,
                                 interval=0.0 if interval == AUTO else interval,
                                 interval_auto=interval == AUTO,
                                 now=time.monotonic(), ckptdir=str(ckpt) if ckpt else None,
                                 keep=keep,
                                 policy=policy,
                                 rebalance_after=rebalance_after if rebalance else 0.0)
    server = CoordinatorServer(machine, token, host=listen_host, port=coord_port,
                               ckptdir=ckpt, quiet=quiet or daemon)
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
    tf = token_file(port)
    fd = os.open(tf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(server.token + "\n")
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
        try:
            if tf.read_text().strip() == server.token:
                tf.unlink()
        except OSError:
            pass
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
    """Fork into the background; the foreground parent exits once the
    daemon listens (or reports its error), so callers can rely on it."""
    rfd, wfd = os.pipe()
    middle = os.fork()
    if middle > 0:
        os.close(wfd)
        with os.fdopen(rfd) as r:
            status = r.read().strip()
        os.waitpid(middle, 0)
        if status.startswith("ok"):
            os._exit(0)
        print(f"dmtcp-coordinator: error: {status[6:] or 'failed to start'}", file=sys.stderr)
        os._exit(1)
    os.close(rfd)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    return wfd


def _report_ready(fd, status: str) -> None:
    if fd is not None:
        os.write(fd, status.encode())
        os.close(fd)


def main() -> None:
    sys.exit(run("dmtcp-coordinator", cli))


if __name__ == "__main__":
    main()
