"""Restarts claimed before their agents join.

`dmtcp-restart` of one tree without sockets under a coordinator that runs
already (`--join`, the restart script's other hosts, a recovery, a
migration) waited for its agent to load (asyncio and the agent's modules,
~25 ms here) and join before CRIU could begin: only the coordinator's
welcome says that the restart is wanted, and the restore writes files
back (written files cut to their checkpoint length, scratch files made
again), which must never happen under a tree that still runs.  So it asks
first, once the image is checked, on a connection of its own: a client
hello with `restart` claims the tree.  The coordinator answers as it would answer the
agent (CoordinatorMachine._restart_refusal) and, if it would take it,
holds the tree for that connection: no other restart of it is taken,
nor a restart of another computation or generation.  CRIU then restores
while the agent loads; its hello names the claim (Hello.claim).

A claim ends when its agent joins, when its connection closes (the
restart ended or failed before the join), or after JOIN_WAIT seconds.

No I/O, no clock: time is a parameter.
"""
from __future__ import annotations

from dmtcp_py.coordinator.launching import JOIN_WAIT
from dmtcp_py.frozen import record


@record
class Claim:
    tree_id: str
    comp_id: str
    generation: int
    since: float


class Claims:
    """The claims whose agents have not joined, by their connection's id."""

    def __init__(self) -> None:
        self._by_key: dict[int, Claim] = {}

    def __len__(self) -> int:
        return len(self._by_key)

    def add(self, key: int, claim: Claim) -> None:
        self._by_key[key] = claim

    def taken(self, tree_id: str, key: int) -> bool:
        """Another connection than key claimed tree_id."""
        return any(c.tree_id == tree_id for k, c in self._by_key.items() if k != key)

    def other_than(self, comp_id: str, generation: int) -> bool:
        """A claim of another computation, or of another generation."""
        return any((c.comp_id, c.generation) != (comp_id, generation)
                   for c in self._by_key.values())

    def joined(self, key: int, tree_id: str) -> None:
        """The agent of tree_id that names claim key joined: the coordinator
        has the tree now (a key of another tree's claim ends nothing)."""
        if key in self._by_key and self._by_key[key].tree_id == tree_id:
            del self._by_key[key]

    def gone(self, key: int) -> bool:
        """Its connection closed; whether it held a claim."""
        return self._by_key.pop(key, None) is not None

    def expire(self, now: float, within: float = JOIN_WAIT) -> list[str]:
        """The trees claimed more than `within` seconds ago, dropped."""
        late = [key for key, claim in self._by_key.items() if now - claim.since > within]
        return [self._by_key.pop(key).tree_id for key in late]
