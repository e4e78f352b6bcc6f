"""Replicas (--replicas 1) between two hosts on one machine: each tree runs
in a UTS namespace of its own (its own host name) with its own checkpoint
directory, so the agents copy each published generation to each other.
(Recovery of a lost host from these copies is in
tests/multihost/test_auto_restart_hosts.py, on namespace hosts with private
storage.)"""
from __future__ import annotations

import os
import secrets
import stat
import subprocess
import sys

import pytest

from dmtcp_py.coordinator import restart_script
from dmtcp_py.images.manifest import load
from tests.conftest import kill_descendants
from tests.e2e.conftest import need_root
from tests.e2e.harness import Computation, tool, wait_for

HOSTS = ("replica-a", "replica-b")
IDLE = "import time\nwhile True: time.sleep(0.05)\n"


@pytest.fixture
def two_hosts(tmp_path):
    need_root()
    token = secrets.token_hex(16)
    comp = Computation(tmp_path, "--replicas", "1", env={"DMTCP_COORD_TOKEN": token})
    # host a keeps its images beside the coordinator's restart script
    dirs = {HOSTS[0]: comp.ckptdir, HOSTS[1]: tmp_path / HOSTS[1]}
    dirs[HOSTS[1]].mkdir(mode=0o700)
    procs = []
    try:
        for host, directory in dirs.items():
            argv = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', host,
                    tool("dmtcp-launch"), "--join", "-p", str(comp.port), "--ckptdir",
                    str(directory), sys.executable, "-c", IDLE]
            procs.append(comp._start(f"launch-{host}", argv,
                                     env={**os.environ, "DMTCP_COORD_TOKEN": token})[0])
        comp.wait_peers(2)
        yield comp, dirs
    finally:
        comp.command("-k", check=False)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except Exception:  # noqa: BLE001 - killed below
                proc.kill()
                proc.wait()
        comp.close()
        kill_descendants()


def images_in(directory):
    return {p.name: p for p in directory.glob("ckpt_*.dmtcp")}


def test_each_generation_is_copied_to_the_other_host(two_hosts):
    comp, dirs = two_hosts
    for generation in (1, 2):
        comp.checkpoint()
        wait_for(lambda: comp.status()["replicated_trees"] == 2, what="both trees copied")
        a, b = images_in(dirs[HOSTS[0]]), images_in(dirs[HOSTS[1]])
        # every tree's image, its own and the other's, in each directory
        assert len(a) == 2 and a.keys() == b.keys()
        for image in [*a.values(), *b.values()]:
            m = load(image)
            assert m.generation == generation
            assert stat.S_IMODE(image.stat().st_mode) == 0o700
            assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in image.iterdir())
    st = comp.status()
    assert st["replicas"] == 1
    listing = comp.command("-s").stdout
    assert "REPLICAS=1 (2 of 2 trees copied)" in listing
    # the restart script knows where else each image is
    script = (comp.ckptdir / restart_script.LINK).read_text()
    copies = restart_script.copies_in(script)
    assert len(copies) == 2
    assert {h for where in copies.values() for h, _ in where} == set(HOSTS)
    # and dmtcp-inspect shows it, beside the script
    for image in images_in(comp.ckptdir).values():
        out = subprocess.run([tool("dmtcp-inspect"), image], capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, out.stderr
        assert "copies       " in out.stdout
