"""--rebalance (issue 16, part 4): the pure decisions (coordinator/rebalance.py),
the Load message, the agent's sampler on real processes, and the
coordinator machine starting a migration by itself, driven in memory."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from dmtcp_py.agent import hostload
from dmtcp_py.coordinator.machine import MoveTrees, Notice, RoundKind
from dmtcp_py.coordinator.rebalance import AFTER, STALE, WAIT, Rebalancer, Report
from dmtcp_py.coordinator.recovery import RecoveryPolicy
from dmtcp_py.listing import status_lines
from dmtcp_py.protocol import messages
from dmtcp_py.protocol.messages import Barrier, Load, MessageError, Traffic, FlowInfo
from dmtcp_py.protocol.states import State
from tests.unit.test_machine import COMP, Sim, image_of, of_type, sent

HOSTS = ("h2", "h3", "h4", "h5")
K = "kernel-1"


def slowed(cpus=(0,), busy=1.0, tree_cpu=0.5, wait=0.5, kernel=K) -> Load:
    """A tree that waits half the time on a CPU it shares with a hog."""
    return Load(interval=5.0, cpus=cpus, busy=busy, tree_cpu=tree_cpu, wait=wait, kernel=kernel)


def calm(cpus=(1,), busy=0.1, tree_cpu=0.1, kernel=K) -> Load:
    return Load(interval=5.0, cpus=cpus, busy=busy, tree_cpu=tree_cpu, wait=0.0, kernel=kernel)


TREES = {"t2": "h2", "t3": "h3", "t4": "h4"}


def reports(rb: Rebalancer, at: float, t3: Load | None = None, kernel: str = K) -> None:
    rb.report("t2", "h2", calm(kernel=kernel + "2"), at)
    rb.report("t3", "h3", t3 or slowed(kernel=kernel + "3"), at)
    rb.report("t4", "h4", calm(kernel=kernel + "4"), at)


# ---- the pure decisions ----------------------------------------------------------

def test_a_host_overloaded_for_the_set_time_sends_its_slowed_tree_to_the_spare():
    rb = Rebalancer(HOSTS, after=10)
    reports(rb, 0.0)
    assert rb.overloaded(0.0) == {"h3": 0.0}
    assert rb.decide(0.0, TREES, []) is None          # one report is no "stays"
    reports(rb, 5.0)
    assert rb.decide(5.0, TREES, []) is None          # 5 s < 10 s
    reports(rb, 10.0)
    d = rb.decide(10.0, TREES, [])
    assert (d.host, d.to, d.trees, d.overloaded_for) == ("h3", "h5", ("t3",), 10.0)
    assert d.waits == (("t3", 0.5),) and d.foreign == pytest.approx(0.5)
    text = d.describe()
    for part in ("h3 overloaded for 10 s", "t3 waits 50%", "take 0.5 CPUs",
                 "moving t3 to h5 (a spare)"):
        assert part in text, text


def test_one_calm_report_starts_the_count_again():
    rb = Rebalancer(HOSTS, after=10)
    reports(rb, 0.0)
    reports(rb, 5.0, t3=calm(kernel=K + "3"))
    assert rb.overloaded(5.0) == {}
    reports(rb, 10.0)
    reports(rb, 15.0)
    assert rb.decide(15.0, TREES, []) is None
    assert rb.decide(20.0, TREES, []) is None  # no newer report: still 5 s
    reports(rb, 20.0)
    assert rb.decide(20.0, TREES, []).to == "h5"


@pytest.mark.parametrize("load", [
    slowed(wait=WAIT / 2),               # busy, but the tree hardly waits
    slowed(busy=1.0, tree_cpu=0.9),      # it waits for itself (its own threads)
    slowed(busy=0.6, tree_cpu=0.5),      # others take only 0.1 CPU
])
def test_no_rebalance_without_both_a_wait_and_processes_not_under_control(load):
    rb = Rebalancer(HOSTS, after=5)
    for at in (0.0, 5.0, 10.0):
        rb.report("t3", "h3", load, at)
    assert rb.overloaded(10.0) == {} and rb.decide(10.0, TREES, []) is None


def test_trees_of_the_computation_on_the_same_kernel_are_its_own_use():
    """Namespace hosts of one machine: t2 and t4 share CPU 1 and wait for
    each other; that is the computation's doing, not a foreign load.  t3
    shares CPU 0 with a hog: it is slowed."""
    rb = Rebalancer(HOSTS, after=5)
    for at in (0.0, 5.0):
        rb.report("t2", "h2", slowed(cpus=(1,), busy=1.0, tree_cpu=0.5), at)
        rb.report("t4", "h4", slowed(cpus=(1,), busy=1.0, tree_cpu=0.5), at)
        rb.report("t3", "h3", slowed(cpus=(0,), busy=1.0, tree_cpu=0.5), at)
    assert rb.overloaded(5.0) == {"h3": 5.0}
    assert rb.decide(5.0, TREES, []).trees == ("t3",)
    # on separate kernels the same figures mean another process on CPU 1
    rb = Rebalancer(HOSTS, after=5)
    rb.report("t2", "h2", slowed(cpus=(1,), kernel="a"), 0.0)
    rb.report("t4", "h4", slowed(cpus=(1,), kernel="b"), 0.0)
    assert sorted(rb.overloaded(0.0)) == ["h2", "h4"]


def test_a_tree_on_two_cpus_counts_its_share_of_the_slowed_trees_cpu():
    rb = Rebalancer(HOSTS)
    rb.report("t2", "h2", calm(cpus=(0, 1), tree_cpu=1.0), 0.0)
    r3 = slowed(cpus=(0,), busy=1.0, tree_cpu=0.3)
    rb.report("t3", "h3", r3, 0.0)
    # t2 used 1 CPU over CPUs 0 and 1: half of it on CPU 0
    assert rb.foreign(Report("t3", "h3", r3, 0.0), 0.0) == pytest.approx(0.2)


def test_the_group_on_the_same_host_moves_with_the_slowed_tree():
    trees = {**TREES, "t3b": "h3", "t3c": "h3"}
    rb = Rebalancer(HOSTS, after=5)
    for at in (0.0, 5.0):
        reports(rb, at)
        rb.report("t3b", "h3", calm(cpus=(0,), busy=1.0, kernel=K + "3"), at)
        rb.report("t3c", "h3", calm(cpus=(0,), busy=1.0, kernel=K + "3"), at)
    # t3 talks most with t3b (same host) and t2 (elsewhere: stays)
    d = rb.decide(5.0, trees, [["t2", "t3", "t3b"], ["t3c"], ["t4"]])
    assert d.trees == ("t3", "t3b") and d.to == "h5"


def test_without_a_spare_the_least_busy_host_that_is_less_busy():
    trees = {**TREES, "t5": "h5"}
    rb = Rebalancer(HOSTS, after=5)
    for at in (0.0, 5.0):
        reports(rb, at)
        rb.report("t5", "h5", calm(busy=0.05, kernel="k5"), at)
    d = rb.decide(5.0, trees, [])
    assert d.to == "h5" and d.load_there == pytest.approx(0.05)
    assert "(5% busy)" in d.describe()
    # every other host as busy as the overloaded one: nowhere to go
    rb = Rebalancer(("h3", "h4"), after=5)
    for at in (0.0, 5.0):
        rb.report("t3", "h3", slowed(kernel="k3"), at)
        rb.report("t4", "h4", calm(busy=1.0, kernel="k4"), at)
    d = rb.decide(5.0, {"t3": "h3", "t4": "h4"}, [])
    assert d.to == "" and "no other host of --hosts is less loaded" in d.describe()


def test_cool_down_stale_reports_and_trees_that_left():
    rb = Rebalancer(HOSTS, after=5)
    reports(rb, 0.0)
    reports(rb, 5.0)
    assert rb.decide(5.0 + STALE + 1, TREES, []) is None  # the reports are too old
    reports(rb, 30.0)
    reports(rb, 35.0)
    assert rb.decide(35.0, {"t2": "h2", "t4": "h4"}, []) is None  # t3 left
    rb = Rebalancer(HOSTS, after=5)
    reports(rb, 0.0)
    reports(rb, 5.0)
    assert rb.decide(5.0, TREES, []) is not None
    rb.started(5.0)
    assert rb.overloaded(5.0) == {}
    reports(rb, 6.0)
    reports(rb, 9.0)
    assert rb.decide(9.0, TREES, []) is None   # cooling down until 10
    reports(rb, 11.0)
    assert rb.decide(11.0, TREES, []) is not None
    assert AFTER > 0


# ---- the message and the sampler ------------------------------------------------------

def test_the_load_message_is_checked():
    wire = messages.decode(messages.to_wire(slowed()))
    assert wire == slowed()
    with pytest.raises(MessageError, match="cpus"):
        Load(interval=1.0, cpus=())
    with pytest.raises(MessageError):
        Load(interval=1.0, cpus=(0,), wait=-0.1)
    with pytest.raises(MessageError):
        messages.decode({"v": 1, "type": "load", "interval": 1.0, "cpus": [0], "busy": "x"})


def test_the_sampler_sees_a_thread_wait_for_a_cpu_it_shares():
    """Two spinning processes pinned on one CPU: the one sampled uses about
    half of it, waits about half the time, and the CPU is all busy."""
    cpu = min(os.sched_getaffinity(0))
    spin = [sys.executable, "-c", "while True: pass"]
    procs = [subprocess.Popen(["taskset", "-c", str(cpu), *spin]) for _ in range(2)]
    try:
        sampler = hostload.LoadSampler()
        assert sampler.sample([procs[0].pid], time.monotonic()) is None  # the baseline
        time.sleep(1.0)
        load = sampler.sample([procs[0].pid], time.monotonic())
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert load.cpus == (cpu,) and load.kernel == hostload.kernel_id() != ""
    assert load.busy > 0.8, load
    assert 0.1 < load.tree_cpu < 0.9, load
    assert 0.1 < load.wait < 0.9, load


def test_the_sampler_says_nothing_of_processes_that_are_gone():
    sampler = hostload.LoadSampler()
    sampler.sample([2 ** 22 + 1], 1.0)
    load = sampler.sample([2 ** 22 + 1], 2.0)
    assert load.tree_cpu == 0.0 and load.wait == 0.0 and load.cpus


# ---- the machine -----------------------------------------------------------------------

def rebalancing(after: float = 10.0) -> tuple[Sim, dict[str, int]]:
    sim = Sim(policy=RecoveryPolicy(heartbeat=0, hosts=HOSTS), rebalance_after=after)
    ids = {host: sim.join(host=host, tree_id=f"t{host[1]}")[0] for host in ("h2", "h3", "h4")}
    return sim, ids


def load_reports(sim: Sim, ids: dict[str, int], at: float) -> None:
    sim.now = at
    sim.send(ids["h2"], calm(kernel="k2"))
    sim.send(ids["h3"], slowed(kernel="k3"))
    sim.send(ids["h4"], calm(kernel="k4"))


def test_the_coordinator_moves_the_slowed_tree_by_itself_and_says_why():
    sim, ids = rebalancing()
    for at in (0.0, 5.0):
        load_reports(sim, ids, at)
        assert sim.tick(at) == []
    assert sim.m.status()["rebalance"]["overloaded"] == {"h3": 5.0}
    load_reports(sim, ids, 10.0)
    actions = sim.tick(10.0)
    notes = [n.text for n in of_type(actions, Notice)]
    assert notes[0].startswith("rebalance: h3 overloaded for 10 s") and "to h5" in notes[0]
    assert sim.m.round.kind is RoundKind.MIGRATE
    assert sim.m.round.migration.placement == {"h3": "h5"}
    assert list(sim.m.round.migration.moving) == ["t3"]
    assert sorted(b.agent_id for b in sent(actions, Barrier)) == sorted(ids.values())
    st = sim.m.status()["rebalance"]
    assert st["last"]["to"] == "h5" and st["last"]["ok"] is None
    # no load counts while the round runs; the round goes through
    load_reports(sim, ids, 11.0)
    assert sim.m.rebalancer.overloaded(11.0) == {}
    sim.step(State.SUSPENDED)
    sim.step(State.FD_LEADER_ELECTION)
    sim.step(State.DRAINED)
    for stay in (ids["h2"], ids["h4"]):  # no connections: bystanders, released at once
        for state in (State.CHECKPOINTED, State.REFILLED, State.RUNNING):
            sim.report(stay, state)
    moved = of_type(sim.report(ids["h3"], State.CHECKPOINTED, image=image_of(ids["h3"])),
                    MoveTrees)
    assert moved and moved[0].placement == (("h3", "h5"),)
    new, _ = sim.restart_join(comp_id=COMP, generation=sim.m.round.generation, tree_id="t3",
                              host="h5")
    sim.report(new, State.CHECKPOINTED)
    sim.step(State.REFILLED)
    sim.step(State.RUNNING)
    assert sim.m.round is None
    last = sim.m.status()["rebalance"]["last"]
    assert last["ok"] is True and last["trees"] == ["t3"] and last["host"] == "h3"
    lines = status_lines(sim.m.status())
    assert any(line.startswith("LAST_REBALANCE=rebalance: h3 overloaded") and "(done)" in line
               for line in lines), lines


def test_no_rebalance_while_a_round_runs_and_none_without_the_option():
    sim, ids = rebalancing(after=5.0)
    sim.checkpoint(None)
    for at in (0.0, 5.0, 10.0):
        load_reports(sim, ids, at)
        assert not of_type(sim.tick(at), Notice)
    assert sim.m.round.kind is RoundKind.CHECKPOINT
    sim = Sim(policy=RecoveryPolicy(heartbeat=0, hosts=HOSTS))
    a = sim.join(host="h3")[0]
    for at in (0.0, 5.0, 10.0, 40.0):
        sim.now = at
        sim.send(a, slowed())
        assert sim.tick(at) == []
    assert sim.m.status()["rebalance"] is None and sim.m.round is None


def test_a_rebalance_with_nowhere_to_go_is_logged_once_per_cool_down():
    sim = Sim(policy=RecoveryPolicy(heartbeat=0, hosts=("h3",)), rebalance_after=5.0)
    a = sim.join(host="h3", tree_id="t3")[0]
    notes = []
    for at in (0.0, 5.0, 6.0, 7.0):
        sim.now = at
        sim.send(a, slowed())
        notes += [n.text for n in of_type(sim.tick(at), Notice)]
    assert len(notes) == 1 and "staying" in notes[0], notes
    assert sim.m.round is None


def test_traffic_groups_move_together():
    """t3 and t3b on h3 stream to each other: both move."""
    sim = Sim(policy=RecoveryPolicy(heartbeat=0, hosts=HOSTS), rebalance_after=5.0)
    a = sim.join(host="h3", tree_id="t3")[0]
    b = sim.join(host="h3", tree_id="t3b")[0]
    sim.join(host="h2", tree_id="t2")
    for at, sent_bytes in ((0.0, 0), (5.0, 10 ** 7)):
        sim.now = at
        sim.send(a, Traffic(flows=(FlowInfo(local="10.0.0.3:1", peer="10.0.0.3:2",
                                            sent=sent_bytes, received=sent_bytes),)))
        sim.send(b, Traffic(flows=(FlowInfo(local="10.0.0.3:2", peer="10.0.0.3:1",
                                            sent=sent_bytes, received=sent_bytes),)))
        sim.send(a, slowed(kernel="k3"))
        sim.send(b, calm(cpus=(0,), busy=1.0, kernel="k3"))
        sim.tick(at)
    assert sorted(sim.m.round.migration.moving) == ["t3", "t3b"]


def test_a_host_left_for_its_load_is_no_target_for_a_while():
    """t3 left h3 for h5; now h5 is overloaded too: the spare h3 is barred
    (its hog is likely still there), so t3 goes to the spare h4."""
    rb = Rebalancer(("h2", "h3", "h4", "h5"), after=5)
    trees = {"t2": "h2", "t3": "h5"}
    rb.started(0.0, left="h3")
    for at in (10.0, 15.0):
        rb.report("t2", "h2", calm(kernel="k2"), at)
        rb.report("t3", "h5", slowed(kernel="k5"), at)
    assert rb.decide(15.0, trees, []).to == "h4"
    rb.started(15.0, left="h5")
    trees = {"t2": "h2", "t3": "h4"}
    for at in (30.0, 35.0):
        rb.report("t2", "h2", calm(kernel="k2"), at)
        rb.report("t3", "h4", slowed(kernel="k4"), at)
    # h3 and h5 are both barred, h2 (5% busy) is less busy than h4: h2
    d = rb.decide(35.0, trees, [])
    assert d.to == "h2", d
    # once the bar is over, the spare h3 again comes first
    rb.started(35.0)
    for at in (100.0, 105.0):
        rb.report("t2", "h2", calm(kernel="k2"), at)
        rb.report("t3", "h4", slowed(kernel="k4"), at)
    assert rb.decide(105.0, trees, []).to == "h3"


def test_no_rebalance_while_a_tree_is_on_its_way_out_nor_to_a_host_as_busy():
    sim, ids = rebalancing(after=5.0)
    sim.m.agents[ids["h2"]].dismissed = True  # told to end, not gone yet
    for at in (0.0, 5.0, 10.0):
        load_reports(sim, ids, at)
        assert sim.tick(at) == []
    sim.m.agents[ids["h2"]].dismissed = False
    assert sim.tick(10.0) and sim.m.round is not None
    # no spare, and the other host nearly as busy: staying
    rb = Rebalancer(("h3", "h4"), after=5)
    for at in (0.0, 5.0):
        rb.report("t3", "h3", slowed(kernel="k3"), at)
        rb.report("t4", "h4", calm(busy=0.9, kernel="k4"), at)
    assert rb.decide(5.0, {"t3": "h3", "t4": "h4"}, []).to == ""
