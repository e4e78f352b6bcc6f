"""--rebalance across hosts (issue 16, parts 4 and 5): the coordinator on
h1 with --hosts h2,h3,h4,h5 --rebalance; a tree on each of h2, h3, h4; h5
free.  A CPU hog started on h3 takes half of the CPU h3's tree computes
on; the coordinator sees h3 stay overloaded and moves h3's tree to h5 by
itself, and says why.  The two other trees keep their processes; the
moved one goes on from exactly where it was.

The namespace hosts share one kernel and its CPUs, so the test pins: h3's
tree and the hog on CPU 0, the other trees on CPU 1 (they sleep most of
the time: they never wait for a CPU long).  The agents report which
kernel they run on, and the coordinator counts the computation's own
trees on that kernel as its own use of the CPUs."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import need_root
from tests.e2e.harness import TIMEOUT, ticks, wait_for
from tests.multihost.netns import TestNetwork
from tests.multihost.test_auto_restart_hosts import BIN, COORD_PORT
from tests.multihost.sshd import ssh_cluster
from tests.multihost.test_migrate_hosts import Moving

PROGRAMS = Path(__file__).parent.parent / "e2e" / "programs"
STEPS = 4_000_000     # hash steps per tick of spin (tens of ms)
MASK = (1 << 64) - 1
REBALANCE_TIMEOUT = 120.0


class Rebalancing(Moving):
    """The coordinator rebalances after 3 s of overload (the agents report
    every 5 s: two reports in a row)."""

    @staticmethod
    def policy(net: TestNetwork) -> list[str]:
        return ["--hosts", ",".join(h.name for h in net.hosts[1:]),
                "--rebalance", "--rebalance-after", "3"]

    def launch_on(self, host, cpu: int, label: str, *argv) -> subprocess.Popen:
        """dmtcp-launch with its tree pinned on one CPU (taskset)."""
        return self.popen(host, label, ["taskset", "-c", str(cpu), BIN / "dmtcp-launch",
                                        "--join", "-h", self.head.addr, "-p", COORD_PORT,
                                        "--ckptdir", self.ckptdir, *argv])


@pytest.fixture
def rebalancing(tmp_path):
    need_root()
    storage = tmp_path / "storage"
    storage.mkdir()
    with ssh_cluster(5, tmp_path, Rebalancing, storage=storage) as new:
        yield new


@pytest.fixture(scope="module")
def programs(tmp_path_factory) -> dict[str, str]:
    need_root()
    out = tmp_path_factory.mktemp("rebalance")
    built = {}
    for name in ("spin", "counter_single"):
        built[name] = str(out / name)
        subprocess.run(["cc", "-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-o",
                        built[name], str(PROGRAMS / f"{name}.c")], check=True)
    return built


def chain(h: int, n: int, steps: int) -> int:
    """spin.c's tick n from the hash of tick n - 1."""
    for i in range(steps):
        h = (h * 6364136223846793005 + n + i) & MASK
    return h


def two_cpus() -> None:
    if not {0, 1} <= os.sched_getaffinity(0):
        pytest.skip("needs CPUs 0 and 1")


def test_a_cpu_hog_on_a_host_makes_the_coordinator_move_its_tree_to_the_spare(
        rebalancing, programs):
    two_cpus()
    h = rebalancing()
    hosts = h.net.hosts
    calm = [h.launch_on(hosts[i], 1, "counter", programs["counter_single"], "100000", "50")
            for i in (1, 3)]
    spin = h.launch_on(hosts[2], 0, "spin", programs["spin"], "100000000", str(STEPS))
    # (each agent lists its processes a little after its tree joined)
    wait_for(lambda: len(trees := h.trees()) == 3 and all(t["procs"] for t in trees)
             and ticks(spin.out), what="the three trees and their processes")
    before = {t["host"]: t for t in h.trees()}
    # the hog: not under the coordinator's control, on the CPU of h3's tree
    hog = h.popen(hosts[2], "hog", ["taskset", "-c", "0", sys.executable, "-c",
                                    "while True: pass"])
    try:
        def rebalanced():
            last = (h.status()["rebalance"] or {}).get("last")
            return last if last and last["ok"] is not None else None
        last = wait_for(rebalanced, timeout=REBALANCE_TIMEOUT, what="a rebalance")
    finally:
        hog.kill()
        hog.wait()
    assert last["ok"] is True, last
    assert (last["host"], last["to"], last["trees"]) == ("h3", "h5", [before["h3"]["tree_id"]])
    assert last["waits"][before["h3"]["tree_id"]] >= 0.25 and last["foreign_cpus"] >= 0.3, last
    log = h.log()
    assert "rebalance: h3 overloaded" in log and "to h5 (a spare)" in log, log[-3000:]
    after = {t["host"]: t for t in h.trees()}
    assert sorted(after) == ["h2", "h4", "h5"], after
    assert after["h5"]["tree_id"] == before["h3"]["tree_id"]
    for host in ("h2", "h4"):
        assert after[host]["agent_pid"] == before[host]["agent_pid"]
        assert after[host]["procs"] == before[host]["procs"]
    # the moved tree goes on from the tick after its last one here, with the
    # hash that tick has: it was restored as it was dumped
    mine = [r for r in ticks(spin.out) if r[0] == "tick"]
    moved = wait_for(lambda: len(rows := [r for r in ticks(h.moved_out) if r[0] == "tick"]) >= 20
                     and rows, what="the moved tree's ticks")
    assert int(moved[0][1]) == int(mine[-1][1]) + 1, (mine[-1], moved[0])
    assert chain(int(mine[-1][2], 16), int(moved[0][1]), STEPS) == int(moved[0][2], 16)
    assert [int(r[1]) for r in moved] == list(range(int(moved[0][1]), int(moved[0][1]) + len(moved)))
    text = h.moved_out.read_text(errors="replace")
    assert "invariant broken" not in text, text[-2000:]
    # the others ran on meanwhile
    counts = [int(ticks(p.out)[-1][1]) for p in calm]
    wait_for(lambda: all(int(ticks(p.out)[-1][1]) > c for p, c in zip(calm, counts)),
             what="the other trees' ticks")
    h.command("-k")
    for proc in (*calm, spin):
        proc.wait(timeout=TIMEOUT)
    wait_for(lambda: json.loads(h.command("-s", "--json").stdout)["num_trees"] == 0,
             what="every tree to end")
