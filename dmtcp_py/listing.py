"""How a tree's processes are shown by `dmtcp-command -l` and the console."""
from __future__ import annotations


def proc_lines(procs: list) -> list[str]:
    """One line per process: [pid, program] or [pid, program, MPI rank]."""
    lines = []
    for entry in procs:
        pid, name = entry[0], entry[1]
        rank = entry[2] if len(entry) > 2 else None
        lines.append(f"    pid {pid}  {name}" + (f"  rank {rank}" if rank is not None else ""))
    return lines
