"""The agent's protocol machine: what one tree does at each barrier (sans-IO).

No sockets, no CRIU, no clock: the asyncio runner (runner.py) feeds in the
coordinator's messages and the results of the work it carried out, and
sends what comes back.  Decisions live here, where unit tests can drive
many agents at once in memory against the coordinator's machine.

At each barrier the machine names one piece of work (a Work value) for
the runner: ask the shims to stop or to elect, park and drain the sockets,
dump, refill and give back, release.  The runner reports how it went and
gets the "reached" message to send.  A dump leaves images waiting for the
coordinator's commit: published when every tree dumped, dropped otherwise.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from dmtcp_py.protocol import messages
from dmtcp_py.protocol.states import State, TransitionError, check_transition, parse

RESUME_RESTORED = 1 << 32  # as hijack/include/dmtcp_record.h says


class Work(enum.Enum):
    SUSPEND = "suspend"        # every process stops its threads
    ELECT = "elect"            # every process claims its sockets (F_SETOWN)
    DRAIN = "drain"            # sockets parked with the agent, connections drained
    DUMP = "dump"              # CRIU dumps the tree; images to a partial directory
    REFILL = "refill"          # processes back; drained bytes and sockets back
    RESUME = "resume"          # threads released


WORK_AT = {
    State.SUSPENDED: Work.SUSPEND,
    State.FD_LEADER_ELECTION: Work.ELECT,
    State.DRAINED: Work.DRAIN,
    State.CHECKPOINTED: Work.DUMP,
    State.REFILLED: Work.REFILL,
    State.RUNNING: Work.RESUME,
}


@dataclass(frozen=True)
class Barrier:
    """One barrier the coordinator opened, as the runner needs it."""
    target: State
    work: Work
    generation: int
    stop: bool
    num_trees: int
    failed_conns: frozenset[str] = frozenset()  # connections not to refill


class Verdict(enum.Enum):
    PUBLISH = "publish"
    DISCARD = "discard"


@dataclass
class AgentMachine:
    restarting: bool = False
    state: State = field(init=False)
    # False from SUSPENDED until RUNNING (and during a restart): a process
    # that says hello while still suspended outside that window is owed a
    # RESUME at once
    running: bool = field(init=False)
    pending_generation: int | None = None  # dumped, waiting for the commit
    stopped_by_checkpoint: bool = False
    # what the processes are told when released: the generation they belong
    # to, and whether this release ends a restart (their hooks differ)
    generation: int = 0
    restored_pending: bool = field(init=False)

    def __post_init__(self) -> None:
        self.state = State.RESTARTING if self.restarting else State.RUNNING
        self.running = not self.restarting
        self.restored_pending = self.restarting

    # ---- barriers ------------------------------------------------------------

    def barrier(self, msg: dict) -> tuple[Barrier | None, dict | None]:
        """A barrier message: the work to do, or (None, the refusal to send)."""
        try:
            target = parse(msg["state"])
            check_transition(self.state, target)
        except TransitionError as exc:
            return None, messages.make("reached", state=msg["state"], ok=False, error=str(exc))
        if target is State.SUSPENDED:
            self.running = False
        failed = msg.get("failed_conns")
        return Barrier(target, WORK_AT[target], int(msg.get("generation", 0)),
                       bool(msg.get("stop")), int(msg.get("num_trees", 1)),
                       frozenset(str(c) for c in failed) if isinstance(failed, list)
                       else frozenset()), None

    def done(self, barrier: Barrier, error: str | None = None, **extra) -> dict:
        """The work of a barrier is over: the state is reached (also when
        the work failed: the checkpoint fails, the tree goes on)."""
        self.state = barrier.target
        if barrier.target is State.RUNNING:
            self.running = True
        if barrier.work is Work.DUMP and error is None:
            self.pending_generation = barrier.generation
            self.stopped_by_checkpoint = barrier.stop
        if error is not None:
            extra["error"] = error
        return messages.make("reached", state=barrier.target.value, ok=error is None, **extra)

    # ---- restart ----------------------------------------------------------------

    def restored(self, error: str | None = None) -> dict:
        """CRIU restored the tree (or could not): the restart joins the
        protocol at CHECKPOINTED."""
        if error is not None:
            return messages.make("reached", state=State.CHECKPOINTED.value, ok=False, error=error)
        self.state = State.CHECKPOINTED
        return messages.make("reached", state=State.CHECKPOINTED.value, ok=True)

    # ---- images --------------------------------------------------------------------

    def commit(self, msg: dict) -> Verdict | None:
        """The coordinator's word on a generation: every tree dumped (publish)
        or not (discard); None when we have nothing of that generation."""
        if self.pending_generation is None or msg["generation"] != self.pending_generation:
            return None
        self.pending_generation = None
        return Verdict.PUBLISH if msg["ok"] else Verdict.DISCARD

    def abandon(self) -> bool:
        """The coordinator is gone: a round under way ends here, the tree
        runs again and its dumped images, if any, are dropped.  True if
        there was a round to abandon."""
        if self.running:
            return False
        self.state = State.RUNNING
        self.running = True
        self.pending_generation = None
        self.stopped_by_checkpoint = False
        return True

    def resume_arg(self, barrier: Barrier | None = None) -> int:
        """RESUME's argument: the generation, | RESUME_RESTORED when this
        release ends a restart (once; a late process after it is told the
        same generation, as a checkpoint)."""
        if barrier is not None:
            self.generation = barrier.generation
        arg = self.generation | (RESUME_RESTORED if self.restored_pending else 0)
        if barrier is not None:
            self.restored_pending = False
        return arg

    def owes_resume(self, suspended: bool) -> bool:
        """A process connected (again) and says whether it is suspended."""
        return suspended and self.running
