"""Small pieces the benchmark scripts share (they import it from their
own directory, which Python puts first on the path)."""
from __future__ import annotations

import resource


def raise_nofile(needed: int) -> None:
    """Enough fds for `needed` sockets (root may raise the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        hard = needed
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
