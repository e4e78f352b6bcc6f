"""Migration (issue 16): the pure choices (coordinator/migration.py) and the
coordinator machine's migration round, driven in memory."""
from __future__ import annotations

import socket

import pytest

from dmtcp_py.agent.network import _in_family
from dmtcp_py.coordinator import migration
from dmtcp_py.coordinator.machine import MoveTrees, Notice, RoundKind
from dmtcp_py.coordinator.migration import MigrationError, TreeRef
from dmtcp_py.protocol.messages import (Barrier, CancelMove, Endpoint, Kill, Move, ProcInfo,
                                        Peers, Refused, Sockets, Welcome)
from dmtcp_py.protocol.states import State
from tests.unit.test_machine import CLIENT, COMP, Sim, image_of, of_type, only_reply, sent

TREES = [TreeRef(1, "t1", "h1", (100, 5, 6)), TreeRef(2, "t2", "h1", (200, 5)),
         TreeRef(3, "t3", "h2", (300, 7))]


# ---- the pure choices ------------------------------------------------------------

def test_trees_are_named_by_id_or_by_host_and_pid():
    assert migration.resolve(["t3"], TREES) == [3]
    assert migration.resolve(["h1:100", "h2:7", "t3"], TREES) == [1, 3]
    with pytest.raises(MigrationError, match="no tree 'h2:100'"):
        migration.resolve(["h2:100"], TREES)
    with pytest.raises(MigrationError, match="no tree named"):
        migration.resolve([], TREES)


def test_a_pid_two_trees_share_names_neither():
    """Trees in PID namespaces of their own have the same small pids."""
    with pytest.raises(MigrationError, match="h1:5 is a process of 2 trees"):
        migration.resolve(["h1:5"], TREES)


def test_vacating_a_host_moves_its_trees_only():
    assert migration.on_host("h1", TREES) == [1, 2]
    with pytest.raises(MigrationError, match="no tree runs on 'h9'"):
        migration.on_host("h9", TREES)


def test_placement_and_groups():
    assert migration.placement(["h1", "h2", "h1"], "h4") == {"h1": "h4", "h2": "h4"}
    assert migration.placement(["h1", "h2"], "") == {"h1": "h1", "h2": "h2"}
    groups = [["t1", "t2"], ["t3"], ["t4", "t5"]]
    assert migration.with_groups({"t2"}, groups) == {"t1", "t2"}
    assert migration.with_groups({"t3", "t5"}, groups) == {"t3", "t4", "t5"}


def test_only_connections_between_a_staying_and_a_moving_tree_are_made_again():
    ends = {"a|b": (1, 2), "b|c": (2, 3), "c|d": (3, 4), "d|e": (2, 2)}
    assert migration.reconnects(ends, {2}) == {1: {"a|b"}, 3: {"b|c"}}
    assert migration.reconnects(ends, {2, 3}) == {1: {"a|b"}, 4: {"c|d"}}


# ---- the round ----------------------------------------------------------------------

def ring(sim: Sim) -> list[int]:
    """Three trees t1 -> t2 -> t3 -> t1, each with its processes reported."""
    ids = sim.join(3)
    for a in ids:
        sim.send(a, Peers(procs=(ProcInfo(pid=10 * a, name="prog"),)))
    return ids


def drain_ring(sim: Sim, alone: tuple[int, ...] = ()) -> list:
    """Every tree of the ring reports its two connections, those alone
    none; then DRAINED."""
    sim.step(State.SUSPENDED)
    sim.step(State.FD_LEADER_ELECTION)
    for a in alone:
        sim.send(a, Sockets(generation=sim.m.round.generation))
    for a in (1, 2, 3):
        nxt, prev = a % 3 + 1, (a + 1) % 3 + 1
        sim.send(a, Sockets(generation=sim.m.round.generation, endpoints=(
            Endpoint(local=f"out{a}", peer=f"in{nxt}"), Endpoint(local=f"in{a}", peer=f"out{prev}"))))
    return sim.step(State.DRAINED)


def migrate(sim: Sim, *trees: str, to: str = "h9") -> list:
    return sim._record(sim.m.migrate(CLIENT, trees, sim.now, to=to))


def t2_moving(sim: Sim) -> int:
    """The ring, t2 asked to move, every tree drained: the round's generation."""
    ring(sim)
    migrate(sim, "t2")
    drain_ring(sim)
    return sim.m.round.generation


def test_a_tree_moves_and_the_others_only_make_their_connections_to_it_again():
    sim = Sim()
    ids = ring(sim)
    actions = migrate(sim, "t2")
    assert [a.agent_id for a in sent(actions, Barrier)] == ids
    assert sim.m.round.kind is RoundKind.MIGRATE
    gen = sim.m.round.generation
    parts = {a.agent_id: a.message for a in sent(drain_ring(sim), Barrier)}
    assert parts[2].move is Move.GO and parts[2].num_trees == 1
    assert parts[1].move is Move.STAY and parts[1].reconnect == ("in2|out1",)
    assert parts[3].move is Move.STAY and parts[3].reconnect == ("in3|out2",)
    assert sim.report(1, State.CHECKPOINTED) == []
    moved = of_type(sim.report(2, State.CHECKPOINTED, image=image_of(2)), MoveTrees)
    assert [(m.generation, m.placement) for m in moved] == [(gen, (("host2", "h9"),))]
    assert [i.tree_id for i in moved[0].images] == ["t2"]
    assert sim.report(3, State.CHECKPOINTED) == []  # waits for the new copy
    # the new copy of t2 joins, restored on h9
    new, joined = sim.restart_join(comp_id=COMP, generation=gen, tree_id="t2", host="h9")
    assert sent(joined, Welcome)
    actions = sim.report(new, State.CHECKPOINTED)
    assert [(k.agent_id, k.message.moved_to) for k in sent(actions, Kill)] == [(2, "h9")]
    assert [b.agent_id for b in sent(actions, Barrier)] == [1, 3, new]
    assert not any(b.message.rollback for b in sent(actions, Barrier))
    sim.step(State.REFILLED)
    sim.step(State.RUNNING)
    reply = only_reply(sim.log, CLIENT)
    assert reply.ok and reply.body["moved"] == ["t2"] and reply.body["to"] == ["h9"]
    assert sim.m.round is None
    # the old copy's end is no failure
    actions = sim.leave(2)
    assert not any("LOST" in n.text for n in of_type(actions, Notice))
    assert sim.m.last_failure is None and sim.m.generation == 0
    assert sorted(a.tree_id for a in sim.m.agents.values()) == ["t1", "t2", "t3"]


def test_a_migration_elects_and_drains_even_where_no_tree_has_sockets():
    sim = Sim()
    ids = ring(sim)
    migrate(sim, "t2")
    for a in ids[:-1]:
        sim.report(a, State.SUSPENDED, sockets=False)
    actions = sim.report(ids[-1], State.SUSPENDED, sockets=False)
    assert {b.message.state for b in sent(actions, Barrier)} == {State.FD_LEADER_ELECTION}


def test_a_staying_tree_that_cannot_reconnect_calls_it_off():
    sim = Sim()
    t2_moving(sim)
    actions = sim.report(1, State.CHECKPOINTED, ok=False, error="cannot connect")
    assert [a.agent_id for a in sent(actions, CancelMove)] == [3]
    sim.report(2, State.CHECKPOINTED, image=image_of(2))
    assert not of_type(sim.log, MoveTrees)
    actions = sim.report(3, State.CHECKPOINTED, ok=False, error="called off")
    barriers = sent(actions, Barrier)
    assert [b.agent_id for b in barriers] == [1, 2, 3] and all(b.message.rollback for b in barriers)
    sim.step(State.REFILLED)
    sim.step(State.RUNNING)
    reply = only_reply(sim.log, CLIENT)
    assert not reply.ok and "cannot connect" in reply.error
    assert not sent(sim.log, Kill)


@pytest.mark.parametrize("how", ["command", "new copy fails", "timeout"])
def test_a_failed_restore_puts_everything_back(how):
    sim = Sim()
    gen = t2_moving(sim)
    sim.report(1, State.CHECKPOINTED)
    [move] = of_type(sim.report(2, State.CHECKPOINTED, image=image_of(2)), MoveTrees)
    if how == "command":
        actions = sim._record(sim.m.migration_command_ended(move.serial, "ssh: no route", sim.now))
    elif how == "new copy fails":
        new, _ = sim.restart_join(comp_id=COMP, generation=gen, tree_id="t2", host="h9")
        actions = sim.report(new, State.CHECKPOINTED, ok=False, error="pid 5 is taken")
        assert [k.agent_id for k in sent(actions, Kill)] == [new]
    else:
        assert not sent(sim.tick(sim.m.policy.restart_timeout - 1), CancelMove)
        actions = sim.tick(sim.m.policy.restart_timeout + 1)
    # (t1 made its connection already: it is not told; its REFILLED rolls back)
    assert [a.agent_id for a in sent(actions, CancelMove)] == [3]
    # a late copy is refused
    _, late = sim.restart_join(comp_id=COMP, generation=gen, tree_id="t2", host="h9")
    assert sent(late, Refused)
    actions = sim.report(3, State.CHECKPOINTED, ok=False, error="called off")
    assert all(b.message.rollback for b in sent(actions, Barrier))
    assert [b.agent_id for b in sent(actions, Barrier)] == [1, 2, 3]
    sim.step(State.REFILLED)
    sim.step(State.RUNNING)
    assert not only_reply(sim.log, CLIENT).ok
    assert not [k for k in sent(sim.log, Kill) if k.agent_id in (1, 2, 3)]


def test_migrations_are_refused_while_busy_or_for_unknown_trees():
    sim = Sim()
    ring(sim)
    reply = only_reply(migrate(sim, "nope"), CLIENT)
    assert not reply.ok and "no tree 'nope'" in reply.error
    sim.checkpoint(client=None)
    reply = only_reply(sim._record(sim.m.migrate(CLIENT + 1, ("t1",), sim.now)), CLIENT + 1)
    assert "a checkpoint is in progress" in reply.error
    sim.advance_to(None)
    reply = only_reply(sim._record(sim.m.migrate(CLIENT + 3, (), sim.now, vacate="h1", to="h1")),
                       CLIENT + 3)
    assert "is the host being vacated" in reply.error
    migrate(sim, "t1")
    actions = sim.checkpoint(client=CLIENT + 2)
    assert "a migration is in progress" in only_reply(actions, CLIENT + 2).error


def test_a_moving_tree_leaving_calls_the_migration_off():
    sim = Sim()
    t2_moving(sim)
    actions = sim.leave(2)
    assert [a.agent_id for a in sent(actions, CancelMove)] == [1, 3]


def test_a_bystander_is_released_at_once_and_the_round_ends_after_it():
    sim = Sim()
    ring(sim)
    [quiet] = sim.join(1)
    migrate(sim, "t2")
    actions = drain_ring(sim, alone=(quiet,))
    alone = [b.message for b in sent(actions, Barrier) if b.agent_id == quiet]
    assert [(b.state, b.move, b.reconnect) for b in alone] == [(State.CHECKPOINTED, Move.STAY, ())]
    assert quiet not in sim.m.round.participants
    assert [b.message.state for b in sent(sim.report(quiet, State.CHECKPOINTED), Barrier)] \
        == [State.REFILLED]
    assert [b.message.state for b in sent(sim.report(quiet, State.REFILLED), Barrier)] \
        == [State.RUNNING]
    # the others move on meanwhile; the round ends only once the bystander runs
    sim.report(1, State.CHECKPOINTED)
    sim.report(2, State.CHECKPOINTED, image=image_of(2))
    sim.report(3, State.CHECKPOINTED)
    new, _ = sim.restart_join(comp_id=COMP, generation=sim.m.round.generation, tree_id="t2")
    sim.report(new, State.CHECKPOINTED)
    sim.step(State.REFILLED)
    sim.step(State.RUNNING)
    assert sim.m.round is not None
    sim.report(quiet, State.RUNNING)
    assert sim.m.round is None and only_reply(sim.log, CLIENT).ok


def test_a_bystander_leaving_does_not_hold_the_round():
    sim = Sim()
    [a, b] = sim.join(2)
    migrate(sim, "t1")
    sim.advance_to(State.DRAINED)
    for x in (a, b):
        sim.send(x, Sockets(generation=sim.m.round.generation))
    sim.step(State.DRAINED)
    sim.leave(b)
    sim.report(a, State.CHECKPOINTED, image=image_of(a))
    new, _ = sim.restart_join(comp_id=COMP, generation=sim.m.round.generation, tree_id="t1")
    sim.report(new, State.CHECKPOINTED)
    sim.step(State.REFILLED)
    sim.step(State.RUNNING)
    assert sim.m.round is None and only_reply(sim.log, CLIENT).ok


def test_a_staying_datagram_socket_connected_to_a_moving_one_is_pointed_again():
    udp = [(1, "u1", "u2"), (2, "u2", "u1"), (3, "u3", ""), (4, "u4", "u3")]
    assert migration.reconnects({}, {2}, udp) == {1: {"udp:u2"}}
    assert migration.reconnects({}, {3}, udp) == {4: {"udp:u3"}}


def test_staying_trees_holding_their_connections_run_on_and_swap_at_the_end():
    sim = Sim()
    ring(sim)
    migrate(sim, "t2")
    parts = {b.agent_id: b.message for b in sent(drain_ring(sim), Barrier)}
    assert parts[1].hold and parts[3].hold and not parts[2].hold
    # t1 holds: it runs on; t3 cannot (it waits, as without holding)
    released = sim.report(1, State.CHECKPOINTED, held=True)
    assert [(b.agent_id, b.message.state) for b in sent(released, Barrier)] == [(1, State.REFILLED)]
    assert [b.message.state for b in sent(sim.report(1, State.REFILLED), Barrier)] == [State.RUNNING]
    assert sim.report(1, State.RUNNING) == []
    sim.report(2, State.CHECKPOINTED, image=image_of(2))
    new, _ = sim.restart_join(comp_id=COMP, generation=sim.m.round.generation, tree_id="t2")
    sim.report(3, State.CHECKPOINTED)
    # every new copy is there: t1 stops again to swap
    actions = sim.report(new, State.CHECKPOINTED)
    assert [(b.agent_id, b.message.state) for b in sent(actions, Barrier)] == [(1, State.SUSPENDED)]
    assert not sent(actions, Kill)
    swap = []
    for state in (State.SUSPENDED, State.FD_LEADER_ELECTION, State.DRAINED):
        swap += [b.message for b in sent(sim.report(1, state), Barrier)]
    assert [(b.state, b.swap) for b in swap] == [
        (State.FD_LEADER_ELECTION, False), (State.DRAINED, True), (State.CHECKPOINTED, True)]
    assert swap[-1].move is Move.STAY and not swap[-1].rollback
    actions = sim.report(1, State.CHECKPOINTED)
    assert [k.agent_id for k in sent(actions, Kill)] == [2]
    assert [b.agent_id for b in sent(actions, Barrier)] == [1, 3, new]
    sim.step(State.REFILLED)
    sim.step(State.RUNNING)
    assert only_reply(sim.log, CLIENT).ok


def test_a_held_tree_swaps_its_old_connections_back_when_the_migration_fails():
    sim = Sim()
    t2_moving(sim)
    for state, extra in ((State.CHECKPOINTED, {"held": True}), (State.REFILLED, {}),
                         (State.RUNNING, {})):
        sim.report(1, state, **extra)
        sim.report(3, state, **extra)
    [move] = of_type(sim.report(2, State.CHECKPOINTED, image=image_of(2)), MoveTrees)
    actions = sim._record(sim.m.migration_command_ended(move.serial, "no route", sim.now))
    assert sorted(b.agent_id for b in sent(actions, Barrier)) == [1, 3]
    last = {}
    for state in (State.SUSPENDED, State.FD_LEADER_ELECTION, State.DRAINED):
        for a in (1, 3):
            for b in sent(sim.report(a, state), Barrier):
                last[b.agent_id] = b.message
    assert last[1].rollback and last[3].rollback and last[1].state is State.CHECKPOINTED
    sim.report(1, State.CHECKPOINTED)
    actions = sim.report(3, State.CHECKPOINTED)
    barriers = sent(actions, Barrier)
    assert [b.agent_id for b in barriers] == [1, 2, 3] and all(b.message.rollback for b in barriers)
    sim.step(State.REFILLED)
    sim.step(State.RUNNING)
    assert not only_reply(sim.log, CLIENT).ok


def test_a_failed_moves_new_copy_still_going_takes_no_part_in_the_next_round():
    """Seen when --rebalance moved again soon after a failed move: the new
    copy, told to end but not gone yet, was a participant of the next round
    (and, restoring still, reported illegal transitions)."""
    sim = Sim()
    gen = t2_moving(sim)
    sim.report(1, State.CHECKPOINTED)
    sim.report(2, State.CHECKPOINTED, image=image_of(2))
    new, _ = sim.restart_join(comp_id=COMP, generation=gen, tree_id="t2", host="h9")
    sim.report(new, State.CHECKPOINTED, ok=False, error="pid 5 is taken")
    sim.report(3, State.CHECKPOINTED, ok=False, error="called off")
    sim.step(State.REFILLED)
    sim.step(State.RUNNING)
    assert sim.m.round is None and new in sim.m.agents  # (its agent has not left yet)
    actions = sim._record(sim.m.migrate(None, ("t3",), sim.now, to="h8"))
    assert sorted(b.agent_id for b in sent(actions, Barrier)) == [1, 2, 3]
    assert sim.m.round.participants == {1, 2, 3}


def test_a_meeting_point_is_reached_in_the_connecting_sockets_family():
    """The two ends of one connection may be of two families (a dual-stack
    IPv6 socket and an IPv4 one): the published address is translated."""
    assert _in_family(socket.AF_INET6, "198.18.0.3") == "::ffff:198.18.0.3"
    assert _in_family(socket.AF_INET, "::ffff:198.18.0.3") == "198.18.0.3"
    assert _in_family(socket.AF_INET, "198.18.0.3") == "198.18.0.3"
    assert _in_family(socket.AF_INET6, "::1") == "::1"


def test_a_moving_tree_is_claimed_before_its_new_copy_joins():
    """A migration restarts the moving tree with a claim (coordinator/claims.py):
    taken for a moving tree, refused for one that stays."""
    from test_claims import claim, refusal, welcomed
    sim = Sim()
    gen = t2_moving(sim)
    sim.report(1, State.CHECKPOINTED)
    sim.report(2, State.CHECKPOINTED, image=image_of(2))
    assert "not moving" in refusal(claim(sim, 801, tree_id="t1", comp_id=COMP, generation=gen),
                                   801)
    assert welcomed(claim(sim, 802, tree_id="t2", comp_id=COMP, generation=gen), 802)
    new, joined = sim.restart_join(comp_id=COMP, generation=gen, tree_id="t2", host="h9",
                                   claim=802)
    assert sent(joined, Welcome) and sim.m.round.migration.arrived == {"t2": new}
