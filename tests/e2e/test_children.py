"""Every way of starting a child keeps it under control: counted, and
checkpointed and restarted with the rest of the tree."""
from __future__ import annotations

from tests.e2e.harness import TIMEOUT, last_tick, wait_for

# spawner itself, its fork child, and one child each from vfork+execv,
# posix_spawn with an empty environment, popen and system
EXPECTED = 6


def test_children_of_every_kind_are_counted_and_restarted(comp, programs):
    proc, out = comp.launch(*programs["spawner"], "100000", "20")
    comp.wait_peers(EXPECTED)
    assert comp.status()["num_peers"] == EXPECTED
    comp.checkpoint()
    comp.kill_and_wait(proc)
    killed = last_tick(out)
    restarted, rout = comp.restart()
    comp.wait_peers(EXPECTED)
    wait_for(lambda: last_tick(rout) > 3, what="the restarted program")
    assert 1 < int(rout.read_text().split()[1]) <= killed + 1
    comp.kill_and_wait(restarted)
    assert restarted.wait(timeout=TIMEOUT) != 0
