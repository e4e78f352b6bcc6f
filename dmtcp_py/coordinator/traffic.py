"""Who talks to whom: the traffic between trees, as bytes per second.

Every few seconds each agent reports its tree's established TCP
connections with their byte counters (messages.Traffic, agent/tcpstats.py).
Here, without I/O and with time as a parameter:

- each connection keeps a decaying sum of the bytes its tree sent, at
  three time scales (half-lives HALF_LIVES): the summaries over short,
  middle and long spans that the grouping paper's system kept ("Grouping
  MPI Processes for Partial Checkpoint and Co-migration", section 2); a
  steady stream of r bytes/s makes a sum of r*h/ln 2, so the rate is the
  sum * ln 2 / h;
- a connection's far end is the tree that reported that address as one
  of its own ends (loopback addresses are told apart by host); none: the
  bytes went out of the computation;
- an edge between two trees carries both directions (each side counts
  what it sent); its weight mixes the scales (WEIGHTS: the recent counts
  most);
- groups of frequent communicators: trees joined by edges that carry at
  least FREQUENT of the traffic of the busier of their two trees (and
  MIN_RATE at all).  The paper predicts groups from recurring patterns of
  MPI-level messages; at the level of sockets what can be seen is how much
  each pair exchanges, over several spans, which is what this weighs.
"""
from __future__ import annotations

import math

from dmtcp_py.frozen import field, mutable_record, record
from dmtcp_py.images.socket_table import is_namespace_local

HALF_LIVES = (10.0, 60.0, 600.0)  # seconds: short, middle, long
WEIGHTS = (0.5, 0.3, 0.2)
FREQUENT = 0.2      # of the busier tree's traffic
MIN_RATE = 1024.0   # bytes per second, weighted: below it, no edge makes a group
OUTSIDE = ""        # the far end of traffic that leaves the computation


def endpoint_key(host: str, endpoint: str) -> str:
    """An "ip:port" as the computation names it: loopback and wildcard
    addresses mean something only on their host."""
    ip = endpoint.rsplit(":", 1)[0].strip("[]")
    return f"{host}/{endpoint}" if is_namespace_local(ip) else endpoint


@mutable_record
class _Conn:
    tree: str
    local: str       # keys (endpoint_key)
    peer: str
    sent: int        # the counters last reported
    received: int
    at: float        # when
    sums: list[float] = field(default_factory=lambda: [0.0] * len(HALF_LIVES))

    def decayed(self, now: float) -> list[float]:
        dt = max(0.0, now - self.at)
        return [s * 0.5 ** (dt / h) for s, h in zip(self.sums, HALF_LIVES)]


@record
class Edge:
    """The traffic between two trees (b == OUTSIDE: out of the
    computation), in bytes per second at each time scale, and weighted."""
    a: str
    b: str
    rates: tuple[float, ...]

    @property
    def weighted(self) -> float:
        return sum(w * r for w, r in zip(WEIGHTS, self.rates))


class TrafficMatrix:
    def __init__(self) -> None:
        self._conns: dict[tuple[str, str, str], _Conn] = {}
        self.hosts: dict[str, str] = {}  # tree -> host

    def report(self, tree: str, host: str, flows: list[tuple[str, str, int, int]],
               now: float) -> None:
        """A tree's connections now: (local, peer, sent, received) counters.
        A connection it no longer reports is closed."""
        self.hosts[tree] = host
        seen = set()
        for local, peer, sent, received in flows:
            key = (tree, endpoint_key(host, local), endpoint_key(host, peer))
            seen.add(key)
            conn = self._conns.get(key)
            if conn is None or sent < conn.sent:  # new (or a reused address)
                self._conns[key] = _Conn(*key, sent=sent, received=received, at=now)
                continue
            conn.sums = [s + (sent - conn.sent) for s in conn.decayed(now)]
            conn.sent, conn.received, conn.at = sent, received, now
        for key in [k for k in self._conns if k[0] == tree and k not in seen]:
            del self._conns[key]

    def forget(self, tree: str) -> None:
        """A tree that left the computation."""
        self.hosts.pop(tree, None)
        for key in [k for k in self._conns if k[0] == tree]:
            del self._conns[key]

    def edges(self, now: float) -> list[Edge]:
        """Every pair of trees that exchanged bytes (and each tree's traffic
        out of the computation), busiest first."""
        owner = {c.local: c.tree for c in self._conns.values()}
        pairs: dict[tuple[str, str], list[float]] = {}
        for conn in self._conns.values():
            far = owner.get(conn.peer, OUTSIDE)
            if far == conn.tree:
                continue  # a connection inside one tree
            a, b = (conn.tree, far) if far == OUTSIDE or conn.tree < far else (far, conn.tree)
            sums = pairs.setdefault((a, b), [0.0] * len(HALF_LIVES))
            for i, s in enumerate(conn.decayed(now)):
                sums[i] += s
        out = [Edge(a, b, tuple(s * math.log(2) / h for s, h in zip(sums, HALF_LIVES)))
               for (a, b), sums in pairs.items()]
        return sorted((e for e in out if any(e.rates)), key=lambda e: (-e.weighted, e.a, e.b))

    def groups(self, now: float) -> list[list[str]]:
        """The trees, in groups of frequent communicators (union of the
        frequent edges; a tree with none is a group of its own)."""
        edges = [e for e in self.edges(now) if e.b != OUTSIDE]
        total: dict[str, float] = {t: 0.0 for t in self.hosts}
        for e in edges:
            total[e.a] = total.get(e.a, 0.0) + e.weighted
            total[e.b] = total.get(e.b, 0.0) + e.weighted
        parent = {t: t for t in total}

        def root(t: str) -> str:
            while parent[t] != t:
                parent[t] = parent[parent[t]]
                t = parent[t]
            return t

        for e in edges:
            if e.weighted >= MIN_RATE and e.weighted >= FREQUENT * max(total[e.a], total[e.b]):
                parent[root(e.a)] = root(e.b)
        found: dict[str, list[str]] = {}
        for t in sorted(total):
            found.setdefault(root(t), []).append(t)
        return sorted(found.values(), key=lambda g: (-len(g), g))

    def graph(self, now: float) -> dict:
        """What `dmtcp-command --graph` shows, as plain JSON."""
        return {
            "trees": [{"tree_id": t, "host": h} for t, h in sorted(self.hosts.items())],
            "edges": [{"a": e.a, "b": e.b or None, "bytes_per_s": round(e.weighted, 1),
                       "by_scale": [round(r, 1) for r in e.rates]} for e in self.edges(now)],
            "groups": self.groups(now),
            "half_lives": list(HALF_LIVES),
        }
