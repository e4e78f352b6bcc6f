"""Migration across hosts (issue 16, parts 1, 2 and 5): the coordinator on
h1, trees on h2, h3, h4, and h5 free.  Every host has sshd and private
checkpoint storage (as in test_auto_restart_hosts.py), so a moved tree's
image really travels to its new host.

A TCP ring across h2, h3, h4: h3's member moves to h5 while the two others
stream; they keep their processes, and every member runs to its end with
every byte once and in order.  An Open MPI job across h2, h3, h4: h3 is
vacated to h5, and the job ends with the uninterrupted run's answer."""
from __future__ import annotations

import json

import pytest

from tests.e2e import mpi
from tests.e2e.harness import TIMEOUT, ticks, wait_for
from tests.multihost.netns import TestNetwork
from tests.multihost.test_auto_restart_hosts import (ITERATIONS, PAUSE_US, RANKS, Healing,
                                                     five_hosts, last, net_stream,
                                                     no_wrong_bytes, solver, start_ring)

__all__ = ["net_stream", "solver"]  # (module fixtures, used by name)


class Moving(Healing):
    """A coordinator that neither heals nor checkpoints by itself."""

    @staticmethod
    def policy(net: TestNetwork) -> list[str]:
        return []

    @property
    def moved_out(self):
        """Where the trees a migration restored write (the coordinator's host)."""
        return self.run_dir / "migration-7779.out"


@pytest.fixture
def moving(tmp_path):
    yield from five_hosts(tmp_path, Moving)


def by_host(trees: list[dict]) -> dict[str, dict]:
    return {t["host"]: t for t in trees}


def test_a_ring_member_moves_to_a_free_host_while_the_others_stream(moving, net_stream):
    h = moving()
    hosts = h.net.hosts
    members = start_ring(h, net_stream, hosts[1:4])
    before = by_host(h.trees())
    program_pid = before["h3"]["procs"][0][0]
    res = h.command("--migrate", f"h3:{program_pid}", "--to", "h5", "--json")
    body = json.loads(res.stdout)
    assert body["moved"] == [before["h3"]["tree_id"]] and body["to"] == ["h5"], body
    assert members[1].wait(timeout=TIMEOUT) == 0, members[1].err.read_text()
    after = by_host(h.trees())
    assert sorted(after) == ["h2", "h4", "h5"]
    assert after["h5"]["tree_id"] == before["h3"]["tree_id"]
    for host in ("h2", "h4"):
        assert after[host]["agent_pid"] == before[host]["agent_pid"]
        assert after[host]["procs"] == before[host]["procs"]
    # nothing of the migration is left on either host's storage
    for host in (hosts[2], hosts[4]):
        res = host.run(["ls", "-A", str(h.ckptdir / ".dmtcp-migration")],
                       capture_output=True, text=True, timeout=TIMEOUT)
        assert res.stdout.split() == [], (host.name, res.stdout)
    for proc in (members[0], members[2]):
        assert proc.wait(timeout=TIMEOUT) == 0, proc.err.read_text()
        assert ticks(proc.out)[-1][0] == "done"
    no_wrong_bytes(members)
    done = wait_for(lambda: [r for r in ticks(h.moved_out) if r[0] == "done"],
                    what="the moved member's end")
    assert done[0][:3] == ["done", "400", "ring"], done
    assert "FAIL" not in h.moved_out.read_text(errors="replace")
    assert min(last(p.out) for p in members) > 0


def test_an_mpi_job_ends_right_after_its_host_is_vacated(moving, solver):
    impl = mpi.OPENMPI
    expected = mpi.reference_checksum(impl, solver, RANKS, ITERATIONS)
    h = moving(env=impl.env)
    head = h.net.hosts[1]
    job = h.launch(head, "mpirun", impl.mpirun, *impl.options, "--host", "h2,h3,h4",
                   "-np", str(RANKS), solver, str(ITERATIONS), str(PAUSE_US))
    wait_for(lambda: (seen := mpi.iterations_seen(job.out.read_text())) and seen[-1] >= 50,
             what="iteration 50")
    wait_for(lambda: len(h.trees()) == 3, what="the orteds' trees")
    h.command("--vacate", "h3", "--to", "h5")
    assert sorted(t["host"] for t in h.trees()) == ["h2", "h4", "h5"]
    assert job.wait(timeout=TIMEOUT) == 0, job.err.read_text()
    assert mpi.checksum(job.out.read_text()) == expected, job.out.read_text()[-2000:]
