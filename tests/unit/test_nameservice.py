"""The coordinator's name service and connection matching, in memory."""
from __future__ import annotations

from dmtcp_py.coordinator.machine import CoordinatorMachine, SendAgent
from dmtcp_py.coordinator.nameservice import NameService
from dmtcp_py.protocol.messages import (
    ConnMatch,
    Endpoint,
    Found,
    Hello,
    Matched,
    Message,
    Relay,
    Role,
    Sockets,
)


def ep(local: str, peer: str, udp: bool = False) -> Endpoint:
    return Endpoint(local=local, peer=peer, udp=udp)


def by_agent(pairs) -> dict[int, Message]:
    return {a: m for a, m in pairs}


def test_matches_only_when_every_participant_reported():
    ns = NameService()
    assert ns.report(1, 5, [ep("tcp:A", "tcp:B"), ep("tcp:X", "tcp:outside")], {1, 2}) == []
    out = by_agent(ns.report(2, 5, [ep("tcp:B", "tcp:A")], {1, 2}))
    assert isinstance(out[1], Matched) and out[1].generation == 5
    assert out[1].peers == {"tcp:A>tcp:B": ConnMatch(conn="tcp:A|tcp:B", side="a")}
    assert out[2].peers == {"tcp:B>tcp:A": ConnMatch(conn="tcp:A|tcp:B", side="b")}
    # tcp:X leads outside: not in the answer


def test_connections_accepted_on_one_port_are_told_apart():
    ns = NameService()
    server = [ep("tcp:S:80", f"tcp:C:{p}") for p in (1001, 1002, 1003)]
    clients = [ep(f"tcp:C:{p}", "tcp:S:80") for p in (1001, 1002, 1003)]
    assert ns.report(1, 1, server, {1, 2}) == []
    out = by_agent(ns.report(2, 1, clients, {1, 2}))
    assert len(out[1].peers) == 3 and len(out[2].peers) == 3
    conns = {v.conn for v in out[1].peers.values()}
    assert conns == {v.conn for v in out[2].peers.values()} and len(conns) == 3


def test_both_ends_in_one_agent_and_one_sided_claims():
    ns = NameService()
    out = by_agent(ns.report(1, 1, [ep("u:1", "u:2"), ep("u:2", "u:1"), ep("u:3", "u:1")], {1}))
    # u:3 names u:1, which names u:2
    assert set(out[1].peers) == {"u:1>u:2", "u:2>u:1"}


def test_a_new_generation_forgets_old_reports():
    ns = NameService()
    ns.report(1, 1, [ep("a", "b")], {1, 2})
    assert ns.report(2, 2, [ep("b", "a")], {1, 2}) == []  # agent 1's report was for 1


def test_agent_leaving_completes_the_others():
    ns = NameService()
    ns.report(1, 1, [ep("a", "b")], {1, 2})
    ns.agent_left(2)
    out = by_agent(ns.participants_changed({1}))
    assert out[1].peers == {}


def test_lookup_waits_for_publish_and_reset_forgets():
    ns = NameService()
    assert ns.lookup(7, "conn:x") == []
    assert by_agent(ns.publish(8, "conn:x", "198.18.0.2:4000"))[7] == \
        Found(key="conn:x", value="198.18.0.2:4000")
    assert by_agent(ns.lookup(9, "conn:x"))[9].value == "198.18.0.2:4000"
    ns.reset()
    assert ns.lookup(9, "conn:x") == []
    ns.agent_left(9)
    assert ns.publish(8, "conn:x", "v") == []  # nobody waits any more


def test_relay_goes_to_the_other_end():
    ns = NameService()
    ns.report(1, 1, [ep("a", "b")], {1, 2})
    ns.report(2, 1, [ep("b", "a")], {1, 2})
    assert by_agent(ns.relay(1, "a|b", "QQ=="))[2] == Relay(conn="a|b", data="QQ==")
    assert isinstance(by_agent(ns.relay(2, "a|b", "QQ=="))[1], Relay)
    assert ns.relay(1, "unknown|conn", "QQ==") == []


def test_machine_routes_socket_reports_of_a_checkpoint():
    m = CoordinatorMachine("comp")
    for a in (1, 2):
        m.agent_joined(a, Hello(role=Role.AGENT, token="t", host="h", pid=a, program="p",
                                tree_id=f"t{a}"), 0.0)
    m.request_checkpoint(None, 0.0)
    gen = m.round.generation
    assert m.agent_message(1, Sockets(generation=gen, endpoints=(ep("a", "b"),)), 0.0) == []
    out = m.agent_message(2, Sockets(generation=gen, endpoints=(ep("b", "a"),)), 0.0)
    assert sorted(x.agent_id for x in out if isinstance(x, SendAgent)) == [1, 2]
    assert all(isinstance(x.message, Matched) for x in out if isinstance(x, SendAgent))
    # outside a checkpoint a report is refused with a notice, never matched
    m2 = CoordinatorMachine("comp")
    m2.agent_joined(1, Hello(role=Role.AGENT, token="t"), 0.0)
    assert not any(isinstance(x, SendAgent) for x in
                   m2.agent_message(1, Sockets(generation=1), 0.0))


def test_udp_addresses_are_told_to_everyone_and_never_matched():
    ns = NameService()
    ns.report(1, 1, [ep("udp:R", "udp:S", udp=True)], {1, 2})
    out = by_agent(ns.report(2, 1, [ep("udp:S", "udp:R", udp=True)], {1, 2}))
    assert out[1].udp == out[2].udp == ("udp:R", "udp:S")
    assert out[1].peers == {} and out[2].peers == {}
