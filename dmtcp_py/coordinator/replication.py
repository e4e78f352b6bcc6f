"""Replicas (--replicas N): which hosts keep a copy of which tree's image,
and which copy a recovery uses.  Pure decisions, no I/O.

Once a tree's generation is durable on its host, its agent copies it to the
agents of N other hosts of the computation (the next hosts after its own,
in name order: every host sends and takes about as much).  A host that
went silent takes its copies with it; a generation can be restarted when
every tree has a copy on a host that is still there.
"""
from __future__ import annotations

from dataclasses import replace

from dmtcp_py.protocol.messages import Copy, ImageInfo, ReplicaTarget


def targets(own_host: str, services: dict[str, ReplicaTarget], n: int) -> tuple[ReplicaTarget, ...]:
    """N hosts other than own_host that take copies (fewer if there are not
    as many), starting after own_host in name order."""
    hosts = sorted(h for h in services if h != own_host)
    if n <= 0 or not hosts:
        return ()
    after = [h for h in hosts if h > own_host] + [h for h in hosts if h < own_host]
    return tuple(services[h] for h in after[:n])


def with_copies(images: tuple[ImageInfo, ...],
                copies: dict[str, list[Copy]]) -> tuple[ImageInfo, ...]:
    """The images with the copies known of each tree (tree_id -> copies)."""
    out = []
    for image in images:
        known = tuple(c for c in copies.get(image.tree_id, ()) if c.host != image.host)
        out.append(replace(image, replicas=known) if known != image.replicas else image)
    return tuple(out)


def fully_copied(images: tuple[ImageInfo, ...], n: int) -> int:
    """How many trees have their N copies."""
    return sum(1 for i in images if len({c.host for c in i.replicas}) >= n)


def recoverable(images: tuple[ImageInfo, ...], lost_hosts: set[str]) -> bool:
    """Every tree of a lost host has a copy elsewhere."""
    return all(i.host not in lost_hosts or any(c.host not in lost_hosts for c in i.replicas)
               for i in images)


def surviving(images: tuple[ImageInfo, ...], lost_hosts: set[str]) -> tuple[ImageInfo, ...]:
    """The images as a recovery restarts them: copies on lost hosts are
    forgotten.  A tree whose own host is lost keeps that host's name (it
    is placed as that host's tree) and is restarted from a copy that is
    left, or, with none, from its own path on the new host: a checkpoint
    directory on shared storage has it there (the restart script checks,
    and says so in one line when it is not)."""
    return tuple(replace(i, replicas=tuple(c for c in i.replicas if c.host not in lost_hosts))
                 for i in images)
