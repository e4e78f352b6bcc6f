"""dmtcp-ssh SSH [ARGS...]: what the shim runs instead of `SSH ARGS...`.

Started by a process of a controlled tree.  With a remote command: wait
for the relay on a port of our own, let the real ssh start it on the other
host (dmtcp_py.ssh.command), then be the remote command here: our stdin
goes there, its stdout, stderr and exit status come back.  Anything else
(a login, a tunnel) runs the real ssh unchanged.
"""
from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import threading

from dmtcp_py import paths
from dmtcp_py.ssh import command, frames

ACCEPT_TIMEOUT = 60.0
DIRECT = "DMTCP_SSH_DIRECT"  # the shim leaves an ssh with this alone


def _say(text: str) -> None:
    os.write(2, f"dmtcp-ssh: {text}\n".encode())


def _listen() -> socket.socket:
    """Any address: the relay calls back from wherever ssh reached."""
    try:
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(("::", 0))
    except OSError:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("0.0.0.0", 0))
    sock.listen(1)
    return sock


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BrokenPipeError:
            return


def _pump_stdin(link: frames.Link) -> None:
    try:
        while True:
            data = os.read(0, 65536)
            link.send(frames.STDIN, data)
            if not data:
                return
    except OSError:
        try:
            link.send(frames.STDIN, b"")
        except OSError:
            pass


def _accept(listener: socket.socket, cookie: str) -> socket.socket | None:
    listener.settimeout(ACCEPT_TIMEOUT)
    while True:
        try:
            conn, _ = listener.accept()
        except (socket.timeout, OSError):
            return None
        conn.settimeout(10.0)
        try:
            got = conn.recv(len(cookie), socket.MSG_WAITALL)
        except OSError:
            got = b""
        if got == cookie.encode():
            conn.settimeout(None)
            return conn
        conn.close()  # not our relay


def _serve(link: frames.Link) -> int:
    def forward(signum, _frame):
        try:
            link.send_int(frames.SIGNAL, signum)
        except OSError:
            os._exit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, forward)
    threading.Thread(target=_pump_stdin, args=(link,), daemon=True).start()
    status = take_output(link)
    if status is None:
        _say("lost the connection to the remote command")
        return 255
    return status


def take_output(link: frames.Link) -> int | None:
    """What the far command prints, onto our stdout and stderr, until its
    exit status comes: that status as a shell tells it (128+N: killed by
    signal N), or None if the connection was lost first."""
    while True:
        try:
            frame = link.recv()
        except (OSError, ConnectionError):
            return None
        if frame is None:
            return None
        channel, data = frame
        if channel == frames.STDOUT and data:
            _write_all(1, data)
        elif channel == frames.STDERR and data:
            _write_all(2, data)
        elif channel == frames.EXIT:
            status = frames.Link.as_int(data)
            return status if status >= 0 else 128 - status


def run(argv: list[str]) -> int:
    if not argv:
        _say("usage: dmtcp-ssh SSH [ARGS...]")
        return 255
    ssh, args = argv[0], argv[1:]
    env = {**os.environ, DIRECT: "1"}
    call = command.parse(args)
    port = os.environ.get("DMTCP_COORD_PORT")
    if call is None or not port:
        os.execvpe(ssh, [ssh, *args], env)
    listener = _listen()
    relay = command.Relay(
        launch=paths.tool("dmtcp-launch"), python=sys.executable,
        coord_host=os.environ.get("DMTCP_COORD_HOST", "127.0.0.1"), coord_port=int(port),
        token=os.environ.get("DMTCP_COORD_TOKEN", ""),
        ckptdir=os.environ.get("DMTCP_CHECKPOINT_DIR"),
        port=listener.getsockname()[1], cookie=secrets.token_hex(16),
        tmpdir=os.environ.get("DMTCP_TMPDIR"))
    try:
        started = subprocess.run(command.ssh_argv(ssh, call, command.remote_command(call, relay)),
                                 stdin=subprocess.DEVNULL, env=env)
    except OSError as exc:
        _say(f"cannot run {ssh}: {exc.strerror or exc}")
        return 255
    if started.returncode != 0:
        return started.returncode
    conn = _accept(listener, relay.cookie)
    listener.close()
    if conn is None:
        hint = ("the coordinator is at a loopback address: start it with --listen ADDR "
                "and launch with -h ADDR" if relay.coord_host.startswith(("127.", "localhost"))
                else "see the agent's log there")
        _say(f"the command on {call.destination} did not call back within "
             f"{ACCEPT_TIMEOUT:g} s ({hint})")
        return 255
    return _serve(frames.Link(conn))


def main() -> None:
    sys.exit(run(sys.argv[1:]))


if __name__ == "__main__":
    main()
