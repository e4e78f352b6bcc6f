"""Facts about other processes that only /proc has."""
from __future__ import annotations

import os
from collections.abc import Iterator


def fds(pids: list[int]) -> Iterator[tuple[int, str]]:
    """(pid, fd number as /proc names it) for every open fd of pids; a
    process that is gone or not ours to read is skipped."""
    for pid in pids:
        try:
            names = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for name in names:
            yield pid, name
