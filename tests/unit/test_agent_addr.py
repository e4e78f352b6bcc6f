"""The shim (hijack/include/agent_addr.h) and the agent (ShimLink) make the
same abstract name for a tree: its base name, '-', the inode number of the
PID namespace the tree runs in.  A small C program built from the header
prints the shim's; the agent's is made for this process as a tree's root."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from dmtcp_py.agent.shimlink import ShimLink

INCLUDE = Path(__file__).resolve().parents[2] / "hijack" / "include"

PROGRAM = r"""
#define _GNU_SOURCE /* as the shim and the init: syscall() */
#include <stdio.h>
#include "agent_addr.h"
int main(int argc, char **argv)
{
    struct sockaddr_un addr;
    socklen_t len;
    (void)argc;
    if (dmtcp_agent_addr(argv[1], &addr, &len) < 0)
        return 1;
    /* abstract: a NUL, then the name, len bytes in all */
    fwrite(addr.sun_path + 1, 1, len - offsetof(struct sockaddr_un, sun_path) - 1, stdout);
    return 0;
}
"""


@pytest.mark.skipif(not shutil.which("cc"), reason="needs cc")
def test_the_shim_and_the_agent_name_the_same_socket(tmp_path):
    src, exe = tmp_path / "addr.c", tmp_path / "addr"
    src.write_text(PROGRAM)
    subprocess.run(["cc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-I", str(INCLUDE),
                    "-o", str(exe), str(src)], check=True)
    link = ShimLink("dmtcp-agent-0123abcd")
    link.bind_to_tree(os.getpid())  # the same PID namespace as the program's
    shim = subprocess.run([str(exe), link.address], capture_output=True, text=True,
                          check=True).stdout
    inode = os.readlink("/proc/self/ns/pid")[len("pid:["):-1]
    assert shim == link.name == f"dmtcp-agent-0123abcd-{inode}"
