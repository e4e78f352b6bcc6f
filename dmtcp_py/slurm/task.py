"""One task of a taken-over srun, on its node: `python -m
dmtcp_py.slurm.task --port N --cookie C -- CMD...`, the program of a
`dmtcp-launch --join` tree that the real srun started detached.

Calls dmtcp-srun back at the address srun ran on (SLURM_LAUNCH_NODE_IPADDR),
says which task it is, runs CMD with the task's environment (SLURM_PROCID,
SLURM_NODEID... as srun set them) and carries its stdin, stdout, stderr,
signals and exit status over that connection (the framing of
dmtcp_py.ssh.frames).
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys

from dmtcp_py.slurm.srun_args import DIRECT_MARKS
from dmtcp_py.ssh import frames
from dmtcp_py.ssh.relay import connect_back, relay_child

HELLO = 16  # channel of the first frame: "PROCID NTASKS NODE"


def _connect(port: int, cookie: str) -> socket.socket:
    origin = os.environ.get("SLURM_LAUNCH_NODE_IPADDR", "")
    if not origin:
        raise SystemExit("dmtcp srun task: no SLURM_LAUNCH_NODE_IPADDR: not started by srun")
    return connect_back(origin, port, cookie, "dmtcp srun task")


def hello_text(env: dict) -> str:
    procid = env.get("SLURM_PROCID", "0")
    ntasks = env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or "1"
    node = env.get("SLURMD_NODENAME") or socket.gethostname()
    return f"{procid} {ntasks} {node}"


def main() -> None:
    parser = argparse.ArgumentParser(prog="dmtcp srun task")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cookie", required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    opts = parser.parse_args()
    command = opts.command[1:] if opts.command[:1] == ["--"] else opts.command
    link = frames.Link(_connect(opts.port, opts.cookie))
    link.send(HELLO, hello_text(os.environ).encode())
    # (our tree's own DMTCP_AGENT_SOCK stays: dmtcp-launch set it)
    env = {k: v for k, v in os.environ.items() if k not in DIRECT_MARKS}
    try:
        child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, bufsize=0, env=env)
    except OSError as exc:
        name = command[0] if command else "?"
        link.send(frames.STDERR, f"dmtcp-srun: task {os.environ.get('SLURM_PROCID', '?')}: "
                                 f"cannot run {name}: {exc.strerror or exc}\n".encode())
        link.send_int(frames.EXIT, 2)
        sys.exit(0)
    relay_child(link, child)
    sys.exit(0)


if __name__ == "__main__":
    main()
