"""What an agent is told to do: launch a program, or restore an image."""
from __future__ import annotations

from pathlib import Path

from dmtcp_py.frozen import field, mutable_record
from dmtcp_py.images.manifest import Manifest


@mutable_record
class AgentConfig:
    coord_host: str
    coord_port: int
    token: str
    ckptdir: Path | None   # None: the coordinator's, else the cwd (set at join)
    tree_id: str
    program: str
    argv: list[str] = field(default_factory=list)
    path: str = ""                      # resolved program path (launch)
    image: Path | None = None           # restart
    manifest: Manifest | None = None
    compress: bool = False              # memory pages in zstd (images.compress)
    incremental: bool = False           # pages as chunks shared with the previous generation
    precopy: bool = False               # memory pre-dumped as a round begins (images.precopy)
    lazy: bool = False                  # restart: memory pages on demand (criu lazy-pages)
    claim: int = 0                      # restart: the tree's claim (coordinator/claims.py)
    keep: int | None = None             # previous generations kept (None: the coordinator's)


def agents_can_share(manifests: list[Manifest]) -> bool:
    """Whether these restored trees' agents may run in one process
    (agent/together.py): several trees, each in a PID namespace of its
    own.  An orphan of a tree without one comes back to the agents'
    process, and nothing would say whose it is."""
    return len(manifests) > 1 and all(m.pid_namespace for m in manifests)
