"""Which node each old host's trees restart on (pure logic: no I/O).

A requeued job gets a new allocation, perhaps on other nodes.  The trees
of the host the job script ran on (the head: mpirun, the coordinator's
side) go to the new head; the other hosts keep their node when the new
allocation has it and it is free, and the rest take the free nodes in
order.  More old hosts than new nodes: several share a node, in turn.
"""
from __future__ import annotations

import shlex


def hosts_in_script(text: str) -> list[str]:
    """The hosts a restart script restarts trees of, in its order
    (its `restart_on HOST IMAGE...` lines)."""
    hosts: list[str] = []
    for line in text.splitlines():
        if not line.startswith("restart_on "):
            continue
        try:
            words = shlex.split(line.rstrip(" &"))
        except ValueError:
            continue
        if len(words) >= 2 and words[1] not in hosts:
            hosts.append(words[1])
    return hosts


def images_in_script(text: str) -> int:
    """How many images (trees) the restart script restarts."""
    count = 0
    for line in text.splitlines():
        if line.startswith("restart_on "):
            try:
                count += max(0, len(shlex.split(line.rstrip(" &"))) - 2)
            except ValueError:
                pass
    return count


def place(old_hosts: list[str], old_head: str | None, new_nodes: list[str],
          new_head: str) -> dict[str, str]:
    """old host -> new node, for every old host."""
    if not new_nodes:
        raise ValueError("the allocation has no nodes")
    nodes = list(new_nodes) if new_head in new_nodes else [new_head, *new_nodes]
    mapping: dict[str, str] = {}
    used: set[str] = set()
    if old_head in old_hosts:
        mapping[old_head] = new_head
        used.add(new_head)
    rest = [h for h in old_hosts if h not in mapping]
    for host in rest:  # a node the job had before, if it is still ours and free
        if host in nodes and host not in used:
            mapping[host] = host
            used.add(host)
    free = [n for n in nodes if n not in used]
    turn = 0
    for host in rest:
        if host in mapping:
            continue
        if free:
            mapping[host] = free.pop(0)
        else:  # more hosts than nodes: share, in turn (the head last)
            others = [n for n in nodes if n != new_head] or nodes
            mapping[host] = others[turn % len(others)]
            turn += 1
        used.add(mapping[host])
    return mapping


def map_options(mapping: dict[str, str]) -> list[str]:
    """--map OLD=NEW for the restart script, for the hosts that move."""
    out: list[str] = []
    for old, new in mapping.items():
        if old != new:
            out += ["--map", f"{old}={new}"]
    return out
