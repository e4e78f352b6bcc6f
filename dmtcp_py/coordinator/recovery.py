"""Self-healing: what a lost tree is, and the facts of one recovery.

Pure data and decisions, no I/O and no clock (times are numbers given by
the caller).  The coordinator's machine drives a recovery through its
phases: the other trees are stopped, then the newest complete generation
is restarted (each tree on its own host if that host is alive, a lost
host's trees on a spare), and the restart goes through the barriers as any
restart does.  MPICH-V's volatile nodes, on this project's protocol.
"""
from __future__ import annotations

import enum

from dmtcp_py.frozen import mutable_record, record
from dmtcp_py.listing import signal_name
from dmtcp_py.protocol.messages import ImageInfo, TreeEnded

HEARTBEAT = 1.0           # seconds between heartbeats, both ways
HEARTBEAT_TIMEOUT = 5.0   # a peer silent this long is lost
MAX_RESTARTS = 10
RESTART_TIMEOUT = 120.0   # a recovery's restart that has not finished by then failed
# A tree whose agent vanished is still running: its processes end by
# themselves once they find no agent for DMTCP_FATE_GRACE_MS (3 s, the
# shim's record header).  Its restored copy must not meet them (their pids,
# their ports), so a restart after such a loss waits this long.
AGENT_LOSS_DELAY = 4.0
RETRY_DELAY = 1.0         # seconds before attempt N+1, times N: a failing restart is not a busy loop


@record
class RecoveryPolicy:
    auto_restart: bool = False
    max_restarts: int = MAX_RESTARTS
    heartbeat: float = HEARTBEAT
    heartbeat_timeout: float = HEARTBEAT_TIMEOUT
    hosts: tuple[str, ...] = ()   # where trees may run; those not in use are spares
    restart_timeout: float = RESTART_TIMEOUT
    replicas: int = 0             # copies of every image on other hosts


class Phase(enum.Enum):
    STOPPING = "stopping"       # the other trees are told to end; waiting for them to go
    RESTARTING = "restarting"   # the restart command runs; its trees join the round


@record
class Failure:
    tree_id: str
    program: str
    host: str
    why: str
    at: float   # the machine's clock

    def describe(self) -> str:
        return f"{self.program}@{self.host} (tree {self.tree_id}): {self.why}"


@mutable_record
class Recovery:
    """One recovery under way (attempts of it count against max_restarts)."""
    failure: Failure
    phase: Phase
    started: float
    attempt: int = 0
    not_before: float = 0.0   # no restart before then (AGENT_LOSS_DELAY)
    generation: int = 0
    serial: int = 0           # the restart command of the current attempt (machine's count)


def why_lost(ended: TreeEnded | None, *, dismissed: bool, silent: str | None) -> str | None:
    """Why a tree that left is lost, or None if its end is no failure.

    No failure: a tree the coordinator told to end (kill, quit, a recovery
    stopping it), one its checkpoint ended (--stop), and one whose program
    exited by itself, whatever its exit code, unless a failure came first
    (below).  Lost: a program killed by a signal (a core dump is one); a
    program that failed (a non-zero status) after one of its processes was
    killed by a failure signal (an MPI rank the OOM killer took: mpirun
    then exits 1); an agent that went away without saying how its tree
    ended; and a host that went silent."""
    if dismissed:
        return None
    if ended is not None:
        if ended.requested or ended.checkpointed or ended.code == 0:
            return None
        if ended.killed is not None:  # it came first: the cause
            k = ended.killed
            return (f"its process {k.name} (pid {k.pid}) was killed by {signal_name(k.signal)}"
                    + (" (core dumped)" if k.core else ""))
        if ended.code > 0:
            return None
        return f"its program was killed by {signal_name(-ended.code)}"
    if silent is not None:
        return silent
    return AGENT_VANISHED


AGENT_VANISHED = "its agent disappeared"


def own_exit(ended: TreeEnded | None, *, dismissed: bool) -> int | None:
    """The exit code of a program that ended by itself (no failure, and
    not on anyone's word); None for any other end."""
    if ended is None or dismissed or ended.requested or ended.checkpointed or ended.code < 0:
        return None
    if ended.killed is not None and ended.code != 0:
        return None  # a failure (why_lost)
    return ended.code


def place(images: tuple[ImageInfo, ...], alive: set[str], hosts: tuple[str, ...]) -> dict[str, str]:
    """old host -> host to restart its trees on.  A host that is alive keeps
    its trees; a lost host's trees go to a spare (a host of `hosts` that
    runs none of the computation's trees), one spare per lost host while
    there are spares, then to the alive host with the fewest trees.
    Raises ValueError when there is nowhere to go."""
    old_hosts = list(dict.fromkeys(i.host for i in images))
    placement = {h: h for h in old_hosts if h in alive}
    lost = [h for h in old_hosts if h not in alive]
    spares = [h for h in hosts if h not in old_hosts and h not in placement.values()]
    load = {h: sum(1 for i in images if i.host == h) for h in placement.values()}
    for h in lost:
        if spares:
            target = spares.pop(0)
        elif load:
            target = min(load, key=lambda x: (load[x], x))
        else:
            raise ValueError(f"host {h} is lost and there is no host to restart its trees on "
                             "(give spares with --hosts)")
        placement[h] = target
        load[target] = load.get(target, 0) + sum(1 for i in images if i.host == h)
    return placement
