"""`ssh HOST CMD` run by a program under dmtcp-launch is taken over: CMD
runs on HOST as a tree of the same computation, and the program sees what
ssh would give it: CMD's stdout and stderr, its exit status, and its stdin."""
from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import kill_descendants, need_root
from tests.e2e.harness import TIMEOUT, wait_for
from tests.multihost.netns import TestNetwork
from tests.multihost.sshd import SshHosts

BIN = Path(sys.executable).parent


@pytest.fixture
def hosts(tmp_path):
    need_root()
    with TestNetwork(2) as net:
        ssh = SshHosts(net.hosts, tmp_path / "ssh")
        h1 = net.hosts[0]
        env = ssh.env({**os.environ, "DMTCP_COORD_TOKEN": secrets.token_hex(16),
                       "DMTCP_TMPDIR": str(tmp_path / "tmp")})
        coordinator = h1.popen([BIN / "dmtcp-coordinator", "--listen", h1.addr, "-p", "7779",
                                "--ckptdir", tmp_path, "-q"], env=env)
        try:
            wait_for(lambda: h1.run([BIN / "dmtcp-command", "-h", h1.addr, "-p", "7779", "-s"],
                                    env=env, capture_output=True).returncode == 0,
                     what="the coordinator")
            yield net, env
        finally:
            coordinator.kill()
            coordinator.wait()
            kill_descendants()
            ssh.close()


def _launch(h1, *argv):
    return [BIN / "dmtcp-launch", "--join", "-h", h1.addr, "-p", "7779", *argv]


def test_streams_stdin_and_exit_status_come_back(hosts):
    net, env = hosts
    h1 = net.hosts[0]
    res = h1.run(_launch(h1, "ssh", "h2", "read line; echo \"$line from $(hostname)\"; "
                         "echo oops >&2; exit 7"),
                 input="hello\n", capture_output=True, text=True, env=env, timeout=TIMEOUT)
    assert res.returncode == 7, res.stderr
    assert res.stdout == "hello from h2\n"
    assert res.stderr == "oops\n"


def test_the_remote_command_is_a_tree_of_the_computation(hosts, tmp_path):
    net, env = hosts
    h1 = net.hosts[0]
    out = tmp_path / "out"
    with open(out, "w") as o:
        job = h1.popen(_launch(h1, "ssh", "h2", "sleep 30"), stdout=o,
                       stderr=subprocess.STDOUT, env=env)
    command = [BIN / "dmtcp-command", "-h", h1.addr, "-p", "7779", "-l", "--json"]

    def trees():
        res = h1.run(command, capture_output=True, text=True, env=env)
        return json.loads(res.stdout)["trees"] if res.returncode == 0 else []

    wait_for(lambda: {t["host"] for t in trees()} == {"h1", "h2"}, what="a tree on h2")
    # its agent reports the tree's processes a moment after it joined
    # (peers.REPORT_DELAY), and the program runs from before it joined
    wait_for(lambda: any(p[1] == "sleep" for t in trees() if t["host"] == "h2"
                         for p in t["procs"]), what="sleep listed in the tree on h2")
    local = next(t for t in trees() if t["host"] == "h1")
    assert not any(p[1] == "ssh" for p in local["procs"]), "the real ssh is still running"
    job.kill()
    job.wait()
