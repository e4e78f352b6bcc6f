"""Trees being launched: started by `dmtcp-launch`, their agents not joined yet.

dmtcp-launch starts the program before its agent has loaded (issue 17: the
program starts at once), so for ~0.1 s, longer on a busy host, a tree runs
that the coordinator does not know.  A checkpoint taken then would leave it
out: refused ("no processes to checkpoint") when it is the only one, or a
generation without it, whose restart lacks a tree that may be talking to
the others.  DMTCP has no such window: its launch joins before the program
runs.  So dmtcp-launch announces the tree in its hello, before it starts
the program, and keeps that connection open until its agent has joined;
a checkpoint asked for meanwhile waits (CoordinatorMachine.request_checkpoint).
A launch that says hello while a round is under way is welcomed, and its
program started, once the round is over (CoordinatorMachine.client_joined),
as DMTCP's launch waits for a checkpoint under way: a program that ran
while the others were stopped would be in no image of that generation.

An announcement ends when its tree's agent joins, when its connection
closes (the launch ended or failed: its program ended before the agent
loaded, or it was killed), or after JOIN_WAIT seconds, so that a launch
that hangs cannot hold checkpoints off for ever.  A launch that starts its
coordinator announces its tree when it starts it (no connection: key
OWN_COORDINATOR, ended by the join or by JOIN_WAIT).

No I/O, no clock: time is a parameter.
"""
from __future__ import annotations

from dmtcp_py.frozen import record

# seconds a checkpoint waits at most for an announced tree (below the 30 s
# that `dmtcp-command -c` waits for its answer)
JOIN_WAIT = 20.0
OWN_COORDINATOR = 0  # the key of the tree a coordinator was started for (no connection)
# ... which its environment names (cli/coordinators.py Starting.begin)
LAUNCHING_ENV = "DMTCP_LAUNCHING_TREE"


@record
class Launch:
    tree_id: str
    since: float


@record
class CheckpointAsk:
    """A checkpoint asked for while trees were being launched, with
    request_checkpoint's arguments, asked again once none is."""
    client_id: int | None
    blocking: bool
    stop: bool
    progress: bool


class Launches:
    """The trees announced and not joined, by the key of their announcement
    (the client connection's id)."""

    def __init__(self) -> None:
        self._by_key: dict[int, Launch] = {}

    def __len__(self) -> int:
        return len(self._by_key)

    def announced(self, key: int, tree_id: str, now: float) -> None:
        self._by_key[key] = Launch(tree_id, now)

    def joined(self, tree_id: str) -> bool:
        """Its agent joined; whether it was announced."""
        keys = [key for key, launch in self._by_key.items() if launch.tree_id == tree_id]
        for key in keys:
            del self._by_key[key]
        return bool(keys)

    def gone(self, key: int) -> bool:
        """Its connection closed; whether it had announced a tree not joined."""
        return self._by_key.pop(key, None) is not None

    def expire(self, now: float, within: float = JOIN_WAIT) -> list[str]:
        """The trees announced more than `within` seconds ago, dropped."""
        late = [key for key, launch in self._by_key.items() if now - launch.since > within]
        return [self._by_key.pop(key).tree_id for key in late]
