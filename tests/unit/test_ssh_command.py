"""ssh's command line as dmtcp-ssh reads it, and the remote line it sends."""
from __future__ import annotations

import dataclasses
import shlex
import subprocess

import pytest

from dmtcp_py.agent.fdtable import inet_key
from dmtcp_py.ssh import command


@pytest.mark.parametrize("args, options, destination, remote", [
    (["h2", "hostname"], [], "h2", "hostname"),
    (["-x", "h2", "orted", "-mca", "a b"], ["-x"], "h2", "orted -mca a b"),
    (["-p", "22", "-o", "BatchMode=yes", "h2", "cmd"], ["-p", "22", "-o", "BatchMode=yes"],
     "h2", "cmd"),
    (["-p22", "-xq", "-F", "cfg", "u@h3", "a", ";", "b"], ["-p22", "-xq", "-F", "cfg"],
     "u@h3", "a ; b"),
    (["-l", "root", "--", "h2", "-weird"], ["-l", "root"], "h2", "-weird"),
])
def test_a_remote_command_is_found(args, options, destination, remote):
    call = command.parse(args)
    assert call == command.SshCall(options, destination, remote)


@pytest.mark.parametrize("args", [
    ["h2"],                      # a login
    ["-N", "-L", "1:h:2", "h2"],  # a tunnel
    ["-W", "h:22", "h2"],
    ["-s", "h2", "sftp"],        # a subsystem
    ["-p"],                      # broken: ssh would refuse it
    [],
])
def test_nothing_to_carry(args):
    assert command.parse(args) is None


def test_the_remote_line_runs_the_relay_with_the_command_as_one_word():
    call = command.parse(["-x", "h2", "echo", "it's", "$HOME;", "true"])
    relay = command.Relay(launch="/opt/x y/dmtcp-launch", python="/usr/bin/python3",
                          coord_host="198.18.0.1", coord_port=7779, token="t0k",
                          ckptdir="/ck pt", port=4242, cookie="c00k")
    line = command.remote_command(call, relay)
    words = shlex.split(line)
    assert words[:4] == ["DMTCP_COORD_TOKEN=t0k", "exec", "setsid", "-f"]
    launch = words[4:words.index("-m")]
    assert launch == ["/opt/x y/dmtcp-launch", "--join", "-h", "198.18.0.1", "-p", "7779",
                      "--ckptdir", "/ck pt", "/usr/bin/python3"]
    assert words[words.index("--") + 1] == "echo it's $HOME; true"
    # what the relay's sh -c gets back is exactly what ssh would have run
    out = subprocess.run(["/bin/sh", "-c", f"printf %s {shlex.quote(call.command)}"],
                         capture_output=True, text=True).stdout
    assert out == "echo it's $HOME; true"
    assert command.ssh_argv("ssh", call, line) == ["ssh", "-x", "h2", line]
    # where the logs go travels too, when it is set
    with_tmp = command.remote_command(call, dataclasses.replace(relay, tmpdir="/var/tmp/d d"))
    assert shlex.split(with_tmp)[1] == "DMTCP_TMPDIR=/var/tmp/d d"


def test_a_dual_stack_view_of_an_ipv4_connection_has_the_same_key():
    assert inet_key("tcp", ("::ffff:198.18.0.1", 5000), "n") == inet_key("tcp", ("198.18.0.1", 5000), "n")
