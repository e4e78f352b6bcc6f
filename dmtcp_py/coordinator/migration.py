"""Migration (issue 16): which trees move, where to, and which connections
of the trees that stay must be made again.  No I/O; the machine holds the
round (machine.py) and asks these questions of it.

A migration is a round of every tree: all stop, elect and drain, as for a
checkpoint.  Then the moving trees are dumped (their processes kept,
frozen) while the staying trees make again, toward the moving trees' new
copies, each connection they share with them; the images are restored on
the target host; when every new copy is there, the old ones end and the
round refills and releases everything.  A failure before that point puts
everything back as it was: the old copies were never let go.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from dmtcp_py.frozen import record


@record
class TreeRef:
    """What a tree is known by: its id, its host, its agent's and its
    processes' pids."""
    agent_id: int
    tree_id: str
    host: str
    pids: tuple[int, ...]


class MigrationError(ValueError):
    """A migration asked for that cannot be done: the one-line reason."""


def resolve(specs: Sequence[str], trees: Iterable[TreeRef]) -> list[int]:
    """The agents of the trees named: a tree id as `-l --json` shows it, or
    HOST:PID of any process of the tree (or of its agent)."""
    trees = list(trees)
    chosen: list[int] = []
    for spec in specs:
        spec = spec.strip()
        found = [t for t in trees if t.tree_id == spec]
        if not found and ":" in spec:
            host, _, pid = spec.rpartition(":")
            if pid.isdigit():
                found = [t for t in trees if t.host == host and int(pid) in t.pids]
        if not found:
            raise MigrationError(f"no tree {spec!r} under control (see dmtcp-command -l --json)")
        if len(found) > 1:  # small pids repeat in trees' own PID namespaces, and the
            # trees a restart brought back on one host share their agent's
            raise MigrationError(f"{spec} is a process of {len(found)} trees (pids repeat in "
                                 "their own PID namespaces, and a host's restarted trees share "
                                 "one agent): name the tree by its id")
        if found[0].agent_id not in chosen:
            chosen.append(found[0].agent_id)
    if not chosen:
        raise MigrationError("no tree named to migrate")
    return chosen


def on_host(host: str, trees: Iterable[TreeRef]) -> list[int]:
    """--vacate HOST: every tree that runs there."""
    found = [t.agent_id for t in trees if t.host == host]
    if not found:
        raise MigrationError(f"no tree runs on {host!r} (see dmtcp-command -l)")
    return found


def with_groups(tree_ids: set[str], groups: Iterable[Iterable[str]]) -> set[str]:
    """--with-group: each named tree with the trees of its group (the
    traffic matrix's groups of frequent communicators)."""
    out = set(tree_ids)
    for group in groups:
        members = set(group)
        if members & tree_ids:
            out |= members
    return out


def placement(hosts: Iterable[str], to: str) -> dict[str, str]:
    """Old host -> new host for the moving trees: all to `to`, or each to
    its own host (a fresh copy there) when none is given."""
    return {h: (to or h) for h in sorted(set(hosts))}


UDP = "udp:"  # a datagram socket's peer to look up again, as a reconnect entry


def reconnects(conn_ends: Mapping[str, tuple[int, int]], moving: set[int],
               datagram_ends: Iterable[tuple[int, str, str]] = ()) -> dict[int, set[str]]:
    """The connections each staying agent makes again: those whose other
    end moves.  (Both ends moving: their images hold both; both staying:
    the parked sockets go back as after a checkpoint.)  A staying datagram
    socket connected to a moving one's address is pointed at its new place
    (UDP + that address)."""
    out: dict[int, set[str]] = {}
    for conn, (a, b) in conn_ends.items():
        if (a in moving) == (b in moving):
            continue
        out.setdefault(b if a in moving else a, set()).add(conn)
    ends = list(datagram_ends)
    moved = {local for agent, local, _ in ends if agent in moving}
    for agent, _, peer in ends:
        if agent not in moving and peer in moved:
            out.setdefault(agent, set()).add(UDP + peer)
    return out
