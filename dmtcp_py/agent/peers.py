"""The tree's processes as the coordinator lists them (`dmtcp-command -l`)."""
from __future__ import annotations

import asyncio
from typing import Callable

import psutil

from dmtcp_py.agent.shimlink import ShimLink
from dmtcp_py.protocol import messages

# The coordinator hears of the tree's processes at most this often: a
# program that forks and execs in a loop makes and ends several shim
# connections per child, and describing every process and telling the
# coordinator each time cost more than the fork itself.
REPORT_DELAY = 0.05

# where Open MPI, PMIx and MPICH's Hydra tell a process its rank
_RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK")


def describe(pid: int) -> messages.ProcInfo:
    """A process's name and MPI rank, as `dmtcp-command -l` shows it."""
    try:
        proc = psutil.Process(pid)
        return messages.ProcInfo(pid=pid, name=proc.name(), rank=mpi_rank(proc))
    except psutil.Error:
        return messages.ProcInfo(pid=pid)


def mpi_rank(proc: psutil.Process) -> int | None:
    """The MPI rank of a process, from the environment its launcher gave it."""
    try:
        env = proc.environ()
    except psutil.Error:
        return None
    for name in _RANK_VARIABLES:
        if env.get(name, "").isdigit():
            return int(env[name])
    return None


class PeersReport:
    """Reports the processes once a burst of changes is over."""

    def __init__(self, shims: ShimLink, send: Callable[[messages.Message], None]) -> None:
        self._shims = shims
        self._send = send
        self._due: asyncio.TimerHandle | None = None

    def changed(self) -> None:
        if self._due is None:
            self._due = asyncio.get_running_loop().call_later(REPORT_DELAY, self.now)

    def now(self) -> None:
        if self._due is not None:
            self._due.cancel()
            self._due = None
        procs = []
        for shim in sorted(self._shims.shims, key=lambda s: s.pid):
            if shim.label is None:  # once per connection: a process that execs connects anew
                shim.label = describe(shim.pid)
            procs.append(shim.label)
        self._send(messages.Peers(procs=tuple(procs)))
