"""Trees being launched (coordinator/launching.py): a checkpoint asked for
while dmtcp-launch has started a program whose agent has not joined yet
waits for it, and goes on when it joins, when the launch's connection
closes, or after JOIN_WAIT; driven in memory like test_machine."""
from __future__ import annotations

import pytest

from dmtcp_py.coordinator.launching import JOIN_WAIT, OWN_COORDINATOR, Launches
from dmtcp_py.coordinator.machine import Notice, ReplyClient
from dmtcp_py.protocol.messages import Barrier, Hello, Reply, Role, Welcome
from dmtcp_py.protocol.states import State

from test_machine import CLIENT, OTHER_CLIENT, Sim, of_type, only_reply, sent

LAUNCH = 501  # the launch's client connection


def _launch_hello(tree_id: str) -> Hello:
    """A client's hello, announcing tree_id (a launch) or nothing."""
    return Hello(role=Role.CLIENT, token="t", launching=tree_id)


def test_launches_end_by_join_by_connection_or_by_age():
    launches = Launches()
    launches.announced(1, "ta", now=0.0)
    launches.announced(2, "tb", now=1.0)
    launches.announced(3, "tc", now=2.0)
    assert len(launches) == 3
    assert launches.joined("ta") and not launches.joined("ta")
    assert launches.gone(2) and not launches.gone(2)
    assert not launches.gone(1)  # joined already: its connection's end is nothing
    assert launches.expire(2.0 + JOIN_WAIT) == []
    assert launches.expire(2.1 + JOIN_WAIT) == ["tc"]
    assert len(launches) == 0


def test_a_checkpoint_waits_for_a_tree_being_launched_and_takes_it_in():
    sim = Sim(2)
    sim.m.launch_announced(LAUNCH, "t-new", sim.now)
    actions = sim.checkpoint(CLIENT, blocking=True)
    assert sim.m.round is None and sent(actions, Barrier) == []
    assert of_type(actions, ReplyClient) == []
    assert "1 tree(s) being launched" in of_type(actions, Notice)[0].text
    agent_id, joined = sim.join_one(tree_id="t-new")
    # welcomed first, then the round starts with it among its trees
    assert sim.m.round is not None and sim.m.round.participants == {1, 2, agent_id}
    barriers = sent(joined, Barrier)
    assert [b.agent_id for b in barriers] == [1, 2, agent_id]
    assert barriers[0].message.state is State.SUSPENDED
    sim.advance_to(None)
    assert only_reply(sim.log, CLIENT).ok


def test_a_non_blocking_request_is_answered_when_its_round_starts():
    sim = Sim(1)
    sim.m.launch_announced(LAUNCH, "t-new", sim.now)
    assert of_type(sim.checkpoint(CLIENT), ReplyClient) == []
    assert of_type(sim.checkpoint(OTHER_CLIENT, blocking=True), Notice) == []  # (said once)
    _, joined = sim.join_one(tree_id="t-new")
    replies = of_type(joined, ReplyClient)
    assert replies == [ReplyClient(CLIENT, Reply(ok=True, body={"generation": 1}))]
    sim.advance_to(None)
    assert only_reply(sim.log, OTHER_CLIENT).ok  # the second one waited for that round


def test_another_tree_joining_does_not_end_the_wait():
    sim = Sim(1)
    sim.m.launch_announced(LAUNCH, "t-new", sim.now)
    sim.checkpoint(CLIENT, blocking=True)
    sim.join(1, tree_id="t-other")
    assert sim.m.round is None


@pytest.mark.parametrize("agents", [0, 1])
def test_a_launch_that_ends_before_its_agent_joined_lets_the_checkpoint_go_on(agents):
    sim = Sim(agents)
    sim.m.launch_announced(LAUNCH, "t-new", sim.now)
    sim.checkpoint(CLIENT, blocking=True)
    assert sim.m.client_gone(LAUNCH + 1, sim.now) == []  # some other client
    actions = sim._record(sim.m.client_gone(LAUNCH, sim.now))
    if agents:
        assert sim.m.round is not None and sim.m.round.participants == {1}
        assert sent(actions, Barrier)
    else:
        assert actions == [ReplyClient(CLIENT, Reply(ok=False,
                                                     error="no processes to checkpoint"))]


def test_a_launch_whose_agent_never_joins_is_given_up_after_join_wait():
    sim = Sim(1)
    sim.m.launch_announced(OWN_COORDINATOR, "t-new", sim.now)
    sim.checkpoint(CLIENT, blocking=True)
    sim.tick(JOIN_WAIT - 1)
    assert sim.m.round is None
    actions = sim.tick(JOIN_WAIT + 1)
    assert "did not join within" in of_type(actions, Notice)[0].text
    assert sim.m.round is not None and sim.m.round.participants == {1}


def test_an_interval_checkpoint_waits_too():
    sim = Sim(1, interval=10.0)
    sim.m.launch_announced(LAUNCH, "t-new", sim.now)
    sim.tick(10.5)
    assert sim.m.round is None
    agent_id, _ = sim.join_one(tree_id="t-new")
    assert sim.m.round is not None and agent_id in sim.m.round.participants


def test_a_migration_is_refused_while_a_tree_is_being_launched():
    """It would not take the new tree in (a checkpoint waits for it)."""
    sim = Sim(2)
    sim.m.launch_announced(LAUNCH, "t-new", sim.now)
    actions = sim._record(sim.m.migrate(CLIENT, ("t1",), sim.now))
    reply = only_reply(actions, CLIENT)
    assert not reply.ok and "1 tree(s) being launched" in reply.error
    assert sim.m.round is None and sent(actions, Barrier) == []
    sim.join_one(tree_id="t-new")
    actions = sim._record(sim.m.migrate(OTHER_CLIENT, ("t1",), sim.now))
    assert of_type(actions, ReplyClient) == []  # (answered once it is over)
    assert sim.m.round is not None and len(sim.m.round.participants) == 3


def test_without_launches_nothing_changes():
    sim = Sim(0)
    sim.m.launch_announced(LAUNCH, "t-new", sim.now)
    sim.join_one(tree_id="t-new")
    assert sim.checkpoint(CLIENT, blocking=True) != []
    assert sim.m.round is not None


def welcomes(actions: list, client: int) -> list:
    return [a for a in of_type(actions, ReplyClient)
            if a.client_id == client and isinstance(a.message, Welcome)]


def test_a_launch_during_a_round_starts_its_program_once_the_round_is_over():
    sim = Sim(2)
    sim.checkpoint(CLIENT, blocking=True)
    held = sim._record(sim.m.client_joined(LAUNCH, _launch_hello("t-new"), sim.now))
    assert welcomes(held, LAUNCH) == []
    assert "waits for the checkpoint under way" in of_type(held, Notice)[0].text
    assert welcomes(sim._record(sim.m.client_joined(OTHER_CLIENT, _launch_hello(""), sim.now)),
                    OTHER_CLIENT)  # a command is welcomed at once
    start = len(sim.log)
    sim.advance_to(None)
    [welcome] = welcomes(sim.log[start:], LAUNCH)
    assert welcome.message.comp_id == sim.m.comp_id
    assert only_reply(sim.log, CLIENT).ok  # that checkpoint ended first
    # the next checkpoint waits for the tree it started
    sim.checkpoint(OTHER_CLIENT, blocking=True)
    assert sim.m.round is None
    sim.join_one(tree_id="t-new")
    assert sim.m.round is not None and len(sim.m.round.participants) == 3


def test_a_launch_that_ends_while_held_is_not_welcomed():
    sim = Sim(1)
    sim.checkpoint(CLIENT, blocking=True)
    sim.m.client_joined(LAUNCH, _launch_hello("t-new"), sim.now)
    sim._record(sim.m.client_gone(LAUNCH, sim.now))
    start = len(sim.log)
    sim.advance_to(None)
    assert welcomes(sim.log[start:], LAUNCH) == []
    assert len(sim.m.launches) == 0
