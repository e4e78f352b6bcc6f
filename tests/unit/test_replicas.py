"""Replicas (--replicas), driven in memory: which hosts get copies, what
the coordinator knows of them, and a recovery from a lost host's copy
(coordinator/replication.py and its part of coordinator/machine.py)."""
from __future__ import annotations

from dmtcp_py.coordinator import replication
from dmtcp_py.coordinator.machine import GenerationComplete, Notice
from dmtcp_py.coordinator.recovery import RecoveryPolicy
from dmtcp_py.protocol.messages import (
    Copy, Heartbeat, ImageInfo, ReplicaService, ReplicaTarget, Replicate, Replicated, Welcome)
from tests.unit.test_machine import Sim, of_type, sent
from tests.unit.test_recovery import finish_restart, restart_joins, the_restart

REPL = RecoveryPolicy(auto_restart=True, heartbeat=1.0, heartbeat_timeout=5.0, replicas=1,
                      hosts=("host0", "host1", "host2", "spare"))


def target(host: str) -> ReplicaTarget:
    return ReplicaTarget(host=host, address=f"198.18.9.{host[-1] if host[-1].isdigit() else 9}",
                         port=4000)


def serving(n: int = 3, policy: RecoveryPolicy = REPL) -> Sim:
    """n trees on host0..host2 (agent i on host{i % 3}), each taking copies."""
    sim = Sim(n, now=10.0, policy=policy)
    for agent_id, agent in sim.m.agents.items():
        t = target(agent.host)
        sim.send(agent_id, ReplicaService(address=t.address, port=t.port))
    return sim


def copy_all(sim: Sim, actions: list) -> list:
    """Every agent told to copy says it did; what the last answer caused."""
    out = []
    for order in sent(actions, Replicate):
        for t in order.message.targets:
            out = sim.send(order.agent_id, Replicated(generation=order.message.generation,
                                                      host=t.host, path=order.message.path))
    return out


# ---- pure decisions ------------------------------------------------------------------------

def test_targets_are_the_next_hosts_in_name_order():
    services = {h: target(h) for h in ("a", "b", "c", "d")}
    assert [t.host for t in replication.targets("b", services, 2)] == ["c", "d"]
    assert [t.host for t in replication.targets("d", services, 2)] == ["a", "b"]
    assert replication.targets("a", {"a": target("a")}, 1) == ()  # no other host
    assert replication.targets("a", services, 0) == ()


def test_surviving_forgets_copies_on_lost_hosts():
    img = ImageInfo(path="/c/x", host="a", tree_id="t1", program="p",
                    replicas=(Copy("b", "/c/x"), Copy("c", "/c/x")))
    kept = replication.surviving((img,), {"a", "b"})
    assert kept[0].host == "a" and kept[0].replicas == (Copy("c", "/c/x"),)
    assert replication.surviving((img,), set()) == (img,)


# ---- the machine ----------------------------------------------------------------------------

def test_welcome_asks_for_replicas():
    sim = Sim(0, policy=REPL)
    _, actions = sim.join_one()
    welcome = sent(actions, Welcome)[0].message
    assert welcome.replicas == 1


def test_each_published_tree_is_copied_to_the_next_host_and_the_script_learns_it():
    sim = serving(3)
    sim.run_checkpoint()
    orders = sent(sim.log, Replicate)
    assert {(o.agent_id, o.message.targets[0].host) for o in orders} == \
        {(1, "host2"), (2, "host0"), (3, "host1")}  # agent i is on host{i % 3}
    assert all(o.message.generation == 1 for o in orders)
    assert sim.m.status()["replicated_trees"] == 0
    last = copy_all(sim, sim.log)
    done = of_type(last, GenerationComplete)
    assert done and all(len(i.replicas) == 1 for i in done[0].images)
    assert sim.m.status()["replicated_trees"] == 3


def test_a_failed_copy_is_reported_and_not_counted():
    sim = serving(2)
    sim.run_checkpoint()
    order = sent(sim.log, Replicate)[0]
    actions = sim.send(order.agent_id, Replicated(generation=1, host="host9", ok=False,
                                                  error="disk full"))
    assert any("disk full" in n.text for n in of_type(actions, Notice))
    assert sim.m.status()["replicated_trees"] == 0


def test_a_silent_host_is_restarted_on_the_spare_from_a_copy():
    sim = serving(3)
    sim.run_checkpoint()
    copy_all(sim, sim.log)
    # host1 (agent 1) goes silent; the others keep beating
    sim.now += 6.0
    for agent_id in (2, 3):
        sim.send(agent_id, Heartbeat())
    start = len(sim.log)
    sim.tick(sim.now)
    for agent_id in list(sim.m.agents):
        sim.leave(agent_id)
    sim.tick(sim.now + 1.0)
    restart = the_restart(sim.log[start:])
    assert dict(restart.placement)["host1"] == "spare"
    assert restart.lost_hosts == ("host1",)
    lost_tree = next(i for i in restart.images if i.host == "host1")
    assert lost_tree.replicas and all(c.host != "host1" for c in lost_tree.replicas)
    finish_restart(sim, restart_joins(sim, restart))
    assert sim.m.recovery is None and sim.m.restarts == 1


def test_a_host_lost_before_its_newest_copy_falls_back_to_the_generation_before():
    sim = serving(3)
    sim.run_checkpoint()
    copy_all(sim, sim.log)                      # generation 1: every tree copied
    start = len(sim.log)
    sim.run_checkpoint()                        # generation 2: no copy made yet
    assert sim.m.complete.generation == 2 and sim.m.previous.generation == 1
    assert all(i.replicas for i in sim.m.previous.images)
    sim.now += 6.0
    for agent_id in (2, 3):
        sim.send(agent_id, Heartbeat())
    sim.tick(sim.now)                           # host1 went silent
    for agent_id in list(sim.m.agents):
        sim.leave(agent_id)
    sim.tick(sim.now + 1.0)
    restart = the_restart(sim.log[start:])
    assert restart.generation == 1
    assert any("restarting generation 1" in n.text for n in of_type(sim.log[start:], Notice))
