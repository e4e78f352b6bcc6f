"""The tree's processes as the coordinator lists them (`dmtcp-command -l`)."""
from __future__ import annotations

import asyncio
import os
from typing import Callable

from dmtcp_py import procfs
from dmtcp_py.protocol import messages

# The coordinator hears of the tree's processes at most this often: a
# program that forks and execs in a loop makes and ends several shim
# connections per child, and describing every process and telling the
# coordinator each time cost more than the fork itself.
REPORT_DELAY = 0.05
# processes connect to their agent only at a checkpoint: the tree is
# looked at this often for processes come and gone, and, while they stay
# the same, half as often each time down to WATCH_AT_MOST_EVERY (each look
# is a dozen /proc reads and two wake-ups: an idle agent took ~3 ms of CPU
# a second, a tenth of this 2-core host's CPU under 64 trees)
WATCH_EVERY = 0.5
WATCH_AT_MOST_EVERY = 2.0

# where Open MPI, PMIx and MPICH's Hydra tell a process its rank
_RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK")


def describe(pid: int) -> messages.ProcInfo:
    """A process's name and MPI rank, as `dmtcp-command -l` shows it; from
    /proc, as psutil names it (psutil's import took ~10 ms of the loop
    just as a restarted tree was released, and delayed its report)."""
    comm = procfs.read(f"/proc/{pid}/comm")
    if comm is None:
        return messages.ProcInfo(pid=pid)
    return messages.ProcInfo(pid=pid, name=_full_name(pid, comm.rstrip("\n")),
                             rank=mpi_rank(pid))


def _full_name(pid: int, comm: str) -> str:
    """The kernel cuts a command's name to 15 bytes: the name the command
    line starts with, when the cut one is its beginning."""
    if len(comm) < 15:
        return comm
    cmdline = procfs.read(f"/proc/{pid}/cmdline") or ""
    first = os.path.basename(cmdline.split("\0", 1)[0])
    return first if first.startswith(comm) else comm


def mpi_rank(pid: int) -> int | None:
    """The MPI rank of a process, from the environment its launcher gave it."""
    environ = procfs.read(f"/proc/{pid}/environ")
    if not environ:
        return None
    found = dict(entry.partition("=")[::2] for entry in environ.split("\0") if entry)
    for name in _RANK_VARIABLES:
        if found.get(name, "").isdigit():
            return int(found[name])
    return None


class PeersReport:
    """Reports the processes that run the shim (members: their pids, from
    the tree), once a burst of changes is over."""
    def __init__(self, members: Callable[[], list[int]],
                 send: Callable[[messages.Message], None],
                 in_round: Callable[[], bool] = lambda: False) -> None:
        self._members = members
        self._send = send
        # while a round stops the tree, its processes come and go only as
        # the dump detaches them: looking at them then (every process's
        # /proc, the dump under way beside us) would only cost the stop
        self._in_round = in_round
        self._due: asyncio.TimerHandle | None = None
        # pid -> (its command name, its label): a process that execs is
        # described again
        self._labels: dict[int, tuple[str, messages.ProcInfo]] = {}
        self._last: tuple[messages.ProcInfo, ...] | None = None
        self._watch_every = WATCH_EVERY  # (seconds until the next look)

    def changed(self) -> None:
        self._watch_every = WATCH_EVERY
        if self._due is None:
            self._due = asyncio.get_running_loop().call_later(REPORT_DELAY, self.now, False)

    async def watch(self) -> None:
        """Report again whenever the processes changed."""
        while True:
            await asyncio.sleep(self._watch_every)
            before = self._last
            self.now(False)  # (not changed(): a look needs no burst to end)
            same = self._last == before and self._due is None
            self._watch_every = min(self._watch_every * 2, WATCH_AT_MOST_EVERY) if same \
                else WATCH_EVERY

    def _label(self, pid: int) -> messages.ProcInfo:
        comm = procfs.read(f"/proc/{pid}/comm") or ""
        known = self._labels.get(pid)
        if known is None or known[0] != comm:
            known = self._labels[pid] = (comm, describe(pid))
        return known[1]

    def now(self, force: bool = True) -> None:
        if self._due is not None:
            self._due.cancel()
            self._due = None
        if not force and self._in_round():  # looked at as soon as the tree runs
            self._due = asyncio.get_running_loop().call_later(REPORT_DELAY, self.now, False)
            return
        pids = self._members()
        for gone in self._labels.keys() - set(pids):
            del self._labels[gone]
        procs = tuple(self._label(pid) for pid in pids)
        if procs == self._last and not force:
            return
        self._last = procs
        self._send(messages.Peers(procs=procs))
