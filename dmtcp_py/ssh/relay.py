"""The remote end of dmtcp-ssh: `python -m dmtcp_py.ssh.relay --port N
--cookie C -- COMMAND`, run under dmtcp-launch on the remote host.

Calls dmtcp-ssh back at the address ssh came from (SSH_CONNECTION), runs
COMMAND with the shell as sshd would, and carries its stdin, stdout,
stderr and exit status over that connection.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from dmtcp_py.ssh import frames

CONNECT_TIMEOUT = 30.0


def _connect(port: int, cookie: str) -> socket.socket:
    origin = os.environ.get("SSH_CONNECTION", "").split()
    if not origin:
        raise SystemExit("dmtcp relay: no SSH_CONNECTION: not started by sshd")
    return connect_back(origin[0], port, cookie, "dmtcp relay")


def connect_back(host: str, port: int, cookie: str, who: str) -> socket.socket:
    """A connection to the waiting end (dmtcp-ssh, dmtcp-srun) at host:port,
    tried again for CONNECT_TIMEOUT; it starts with the cookie."""
    deadline = time.monotonic() + CONNECT_TIMEOUT
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=5.0)
            sock.settimeout(None)
            sock.sendall(cookie.encode())
            return sock
        except OSError as exc:
            if time.monotonic() > deadline:
                raise SystemExit(f"{who}: cannot reach {host}:{port}: {exc}")
            time.sleep(0.2)


def _pump(stream, link: frames.Link, channel: int) -> None:
    fd = stream.fileno()
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:
            data = b""
        try:
            link.send(channel, data)
        except OSError:
            return
        if not data:
            return


def _feed(link: frames.Link, child: subprocess.Popen) -> None:
    """What comes from dmtcp-ssh: stdin for the command, signals."""
    while True:
        try:
            frame = link.recv()
        except OSError:
            frame = None
        if frame is None:  # dmtcp-ssh is gone: as sshd does, hang up
            try:
                child.stdin.close()
                child.send_signal(signal.SIGHUP)
            except OSError:
                pass
            return
        channel, data = frame
        try:
            if channel == frames.STDIN and data:
                child.stdin.write(data)
                child.stdin.flush()
            elif channel == frames.STDIN:
                child.stdin.close()
            elif channel == frames.SIGNAL:
                child.send_signal(frames.Link.as_int(data))
        except (OSError, ValueError):
            pass


def main() -> None:
    parser = argparse.ArgumentParser(prog="dmtcp relay")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cookie", required=True)
    parser.add_argument("command")
    opts = parser.parse_args()
    link = frames.Link(_connect(opts.port, opts.cookie))
    child = subprocess.Popen(["/bin/sh", "-c", opts.command], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
    relay_child(link, child)
    sys.exit(0)


def relay_child(link: frames.Link, child: subprocess.Popen) -> None:
    """Carry a started child's stdin, stdout and stderr over link, then its
    exit status; return once the far end (dmtcp-ssh, dmtcp-srun) has it all
    and closed its end."""
    threading.Thread(target=_feed, args=(link, child), daemon=True).start()
    pumps = [threading.Thread(target=_pump, args=(child.stdout, link, frames.STDOUT)),
             threading.Thread(target=_pump, args=(child.stderr, link, frames.STDERR))]
    for pump in pumps:
        pump.start()
    for pump in pumps:
        pump.join()
    status = child.wait()
    try:
        link.send_int(frames.EXIT, status)
        link.sock.shutdown(socket.SHUT_WR)
        link.sock.recv(1)  # until the far end closed its end
    except OSError:
        pass


if __name__ == "__main__":
    main()
