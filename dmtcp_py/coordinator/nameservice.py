"""The coordinator's name service and connection matching (sans-IO).

Two jobs, both about network connections that outlive a checkpoint:

- Matching.  At DRAINED each agent reports the connected sockets it parked,
  each as its own address and its peer's ("endpoints").  Once every agent
  of the round has reported, two endpoints that name each other are the
  two ends of one connection under control: both agents get its id, which
  side they are, and drain and refill it together.  An endpoint nobody
  answers leads out of the computation.  Nothing is ever written into the
  application's byte stream to find this out.  Datagram (UDP) sockets have
  no connection: every agent learns which UDP addresses are in the
  computation, so that after a restart it knows whom to look up.
- Names.  At restart, agents publish where a listener or one end of a
  connection is now (key -> "host:port") and look up where their peer is;
  a lookup of a name not yet published is answered when it is.  Names live
  for one restart round.

It also forwards "relay" messages between the two agents of a connection
(refill data that cannot go through the socket, whose write side the
application shut down).
"""
from __future__ import annotations

from collections import defaultdict

from dmtcp_py.protocol.ids import endpoint_id
from dmtcp_py.protocol.messages import ConnMatch, Endpoint, Found, Matched, Relay


class NameService:
    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self._waiting: dict[str, list[int]] = defaultdict(list)
        self._reports: dict[int, tuple[Endpoint, ...]] = {}
        self._generation: int | None = None
        self._conn_agents: dict[str, tuple[int, int]] = {}
        # the last matching's datagram sockets: (agent, own address, the
        # address it is connected to or "")
        self._udp_ends: list[tuple[int, str, str]] = []

    # ---- names --------------------------------------------------------------

    def reset(self) -> None:
        """A new restart round: earlier addresses mean nothing any more."""
        self.names.clear()
        self._waiting.clear()

    def publish(self, agent_id: int, key: str, value: str) -> list[tuple[int, Found]]:
        self.names[key] = value
        found = Found(key=key, value=value)
        return [(a, found) for a in self._waiting.pop(key, [])]

    def lookup(self, agent_id: int, key: str) -> list[tuple[int, Found]]:
        if key in self.names:
            return [(agent_id, Found(key=key, value=self.names[key]))]
        self._waiting[key].append(agent_id)
        return []

    # ---- matching -------------------------------------------------------------

    def report(self, agent_id: int, generation: int, endpoints: tuple[Endpoint, ...],
               participants: set[int]) -> list[tuple[int, Matched]]:
        """One agent's endpoints; when all participants have reported,
        the matches for everyone."""
        if generation != self._generation:
            self._reports.clear()
            self._generation = generation
        self._reports[agent_id] = tuple(endpoints)
        return self._match_if_complete(participants)

    def _match_if_complete(self, participants: set[int]) -> list[tuple[int, Matched]]:
        if not participants or not participants <= self._reports.keys():
            return []
        # an endpoint is its (local, peer) pair: every connection a server
        # accepts has the same local address
        owner: dict[tuple[str, str], int] = {}
        udp: set[str] = set()  # datagram sockets: no connection, only addresses
        self._udp_ends = []
        for agent_id in sorted(participants):
            for e in self._reports[agent_id]:
                pair = (e.local, e.peer)
                if e.udp:
                    udp.add(pair[0])
                    self._udp_ends.append((agent_id, e.local, e.peer))
                elif all(pair) and pair not in owner:
                    owner[pair] = agent_id
        answers: dict[int, dict[str, ConnMatch]] = {a: {} for a in participants}
        self._conn_agents = {}
        for (local, peer), agent_id in owner.items():
            if (peer, local) in owner:
                a, b = sorted((local, peer))
                conn = f"{a}|{b}"
                answers[agent_id][endpoint_id(local, peer)] = ConnMatch(
                    conn=conn, side="a" if local == a else "b")
                self._conn_agents[conn] = (owner[(a, b)], owner[(b, a)])
        generation = self._generation if self._generation is not None else 0
        self._reports.clear()
        self._generation = None
        udp_addresses = tuple(sorted(udp))
        return [(a, Matched(generation=generation, peers=answers[a], udp=udp_addresses))
                for a in sorted(participants)]

    def connections(self) -> dict[str, tuple[int, int]]:
        """The last matching's connections: id -> the agents of its ends."""
        return dict(self._conn_agents)

    def datagram_ends(self) -> list[tuple[int, str, str]]:
        """The last matching's datagram sockets: (agent, address, peer or "")."""
        return list(self._udp_ends)

    def participants_changed(self, participants: set[int]) -> list[tuple[int, Matched]]:
        """An agent left: the others may be complete now (the round fails
        anyway, but nobody must wait for ever)."""
        if self._generation is None:
            return []
        return self._match_if_complete(participants)

    def relay(self, agent_id: int, conn: str, data: str) -> list[tuple[int, Relay]]:
        ends = self._conn_agents.get(conn)
        if ends is None:
            return []
        other = ends[1] if agent_id == ends[0] else ends[0]
        return [(other, Relay(conn=conn, data=data))]

    def agent_left(self, agent_id: int) -> None:
        self._reports.pop(agent_id, None)
        for waiting in self._waiting.values():
            while agent_id in waiting:
                waiting.remove(agent_id)
