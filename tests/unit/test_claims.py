"""Restarts claimed before their agents join (coordinator/claims.py): the
coordinator answers a claim as it would answer the agent, holds the tree
for the claim's connection, and lets the agent that names the claim in;
driven in memory like test_machine."""
from __future__ import annotations

from dmtcp_py.coordinator.claims import Claim, Claims
from dmtcp_py.coordinator.launching import JOIN_WAIT
from dmtcp_py.coordinator.machine import Notice, ReplyClient
from dmtcp_py.protocol.messages import Hello, Refused, Role, Welcome

from test_machine import Sim, of_type, sent

OLD = "comp-OLD"  # the computation being restarted (Sim.restart_join's)
RESTART = 701     # a dmtcp-restart's client connection
OTHER = 702       # another one's


def claim(sim: Sim, key: int, tree_id: str = "t1", comp_id: str = OLD,
          generation: int = 4, num_trees: int = 1) -> list:
    hello = Hello(role=Role.CLIENT, token="tok", restart=True, tree_id=tree_id,
                  comp_id=comp_id, generation=generation, num_trees=num_trees)
    return sim._record(sim.m.client_joined(key, hello, sim.now))


def welcomed(actions: list, key: int) -> bool:
    return any(isinstance(a, ReplyClient) and a.client_id == key
               and isinstance(a.message, Welcome) and a.message.agent_id == key
               for a in actions)


def refusal(actions: list, key: int) -> str:
    [reply] = [a for a in of_type(actions, ReplyClient) if a.client_id == key]
    assert isinstance(reply.message, Refused), reply
    return reply.message.error


def test_claims_end_by_join_by_connection_or_by_age():
    claims = Claims()
    claims.add(1, Claim("a", OLD, 4, since=0.0))
    claims.add(2, Claim("b", OLD, 4, since=1.0))
    claims.add(3, Claim("c", OLD, 4, since=2.0))
    assert claims.taken("a", 2) and not claims.taken("a", 1) and not claims.taken("z", 0)
    assert not claims.other_than(OLD, 4) and claims.other_than(OLD, 5)
    claims.joined(3, "a")  # (another tree's claim)
    assert claims.taken("a", 0) and claims.taken("c", 0)
    claims.joined(1, "a")
    assert not claims.taken("a", 0)
    assert claims.gone(2) and not claims.gone(2)
    assert claims.expire(2.0 + JOIN_WAIT) == []
    assert claims.expire(2.1 + JOIN_WAIT) == ["c"] and len(claims) == 0


def test_a_claimed_restart_is_taken_when_its_agent_joins():
    sim = Sim(0)
    assert welcomed(claim(sim, RESTART), RESTART)
    assert sim.m.round is None  # (the round begins with the agent, as before)
    agent_id, actions = sim.restart_join(tree_id="t1", claim=RESTART)
    assert agent_id in sim.m.agents and sent(actions, Welcome)
    assert sim.m.round.participants == {agent_id} and len(sim.m.claims) == 0
    # the claim's connection closes afterwards: nothing else happens
    assert sim.m.client_gone(RESTART, sim.now) == []
    assert agent_id in sim.m.agents


def test_a_claim_is_refused_while_the_computation_runs():
    """The case that matters: a restart of trees that still run would cut
    their files back; the claim is refused before the restart touches them."""
    sim = Sim(2)
    assert "busy with computation comp-A" in refusal(claim(sim, RESTART, comp_id="comp-A",
                                                           generation=0), RESTART)
    assert len(sim.m.claims) == 0 and len(sim.m.agents) == 2


def test_a_claimed_tree_is_refused_to_any_other_restart():
    sim = Sim(0)
    claim(sim, RESTART, tree_id="t1", num_trees=2)
    assert "tree t1 is already being restarted" in refusal(
        claim(sim, OTHER, tree_id="t1", num_trees=2), OTHER)
    # an agent of that tree without the claim (a restart that did not claim)
    agent_id, actions = sim.restart_join(tree_id="t1", num_trees=2)
    assert "tree t1 is already being restarted" in sent(actions, Refused)[0].message.error
    assert agent_id not in sim.m.agents
    # another tree of the same generation: claimed, and joins with its claim
    assert welcomed(claim(sim, OTHER, tree_id="t2", num_trees=2), OTHER)
    agent_id, _ = sim.restart_join(tree_id="t2", num_trees=2, claim=OTHER)
    assert agent_id in sim.m.agents


def test_a_claim_holds_the_coordinator_for_its_computation():
    sim = Sim(0)
    claim(sim, RESTART)
    assert "busy" in refusal(claim(sim, OTHER, tree_id="x", comp_id="comp-NEW"), OTHER)
    assert "busy" in refusal(claim(sim, OTHER, tree_id="x", generation=3), OTHER)
    agent_id, actions = sim.restart_join(comp_id="comp-NEW", tree_id="x")
    assert "busy" in sent(actions, Refused)[0].message.error
    assert sim.m.round is None


def test_a_claim_whose_restart_failed_is_let_go():
    sim = Sim(0)
    claim(sim, RESTART)
    assert sim.m.client_gone(RESTART, sim.now) == []
    assert welcomed(claim(sim, OTHER), OTHER)


def test_a_claim_whose_agent_never_joins_is_dropped_after_join_wait():
    sim = Sim(0)
    claim(sim, RESTART)
    assert not any("t1" in n.text for n in of_type(sim.tick(JOIN_WAIT), Notice))
    notices = of_type(sim.tick(JOIN_WAIT + 1), Notice)
    assert any("t1" in n.text and "claim" in n.text for n in notices)
    assert welcomed(claim(sim, OTHER), OTHER)


def test_a_claim_joins_a_restart_round_under_way():
    sim = Sim(0)
    first, _ = sim.restart_join(tree_id="t1", num_trees=2)
    assert "tree t1 is already being restarted" in refusal(
        claim(sim, RESTART, tree_id="t1", num_trees=2), RESTART)
    assert welcomed(claim(sim, OTHER, tree_id="t2", num_trees=2), OTHER)
    second, _ = sim.restart_join(tree_id="t2", num_trees=2, claim=OTHER)
    assert sim.m.round.participants == {first, second}


def test_a_claim_turned_away_by_a_called_off_restart_counts_as_its_tree():
    sim = Sim(0)
    first, _ = sim.restart_join(tree_id="t1", num_trees=3)
    sim.leave(first)  # the restart is called off; t2 and t3 are still on their way
    off = sim.m.called_off
    assert off is not None and off.late == 2
    assert "called off" in refusal(claim(sim, RESTART, tree_id="t2", num_trees=3), RESTART)
    assert off.late == 1 and len(sim.m.claims) == 0
