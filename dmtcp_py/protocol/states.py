"""The checkpoint states, as DMTCP names them, and every legal transition.

This is the only place that knows the order of the protocol; the coordinator
and the agent both ask it what comes next.  Each arrow is a global barrier:
the coordinator releases it when every participating agent reported that all
of its processes reached the state.
"""
from __future__ import annotations

import enum


class State(enum.Enum):
    RUNNING = "RUNNING"
    # a round with pre-copy (images.precopy) begins here: its trees' memory
    # pre-dumped while they run, before SUSPENDED
    PRECOPIED = "PRECOPIED"
    SUSPENDED = "SUSPENDED"
    FD_LEADER_ELECTION = "FD_LEADER_ELECTION"
    DRAINED = "DRAINED"
    CHECKPOINTED = "CHECKPOINTED"
    REFILLED = "REFILLED"
    # A restarting agent is here until CRIU restored its tree; it then
    # reports CHECKPOINTED and joins the normal sequence.
    RESTARTING = "RESTARTING"


# state -> the state its barrier leads to
_NEXT: dict[State, State] = {
    State.RUNNING: State.SUSPENDED,
    State.PRECOPIED: State.SUSPENDED,
    State.SUSPENDED: State.FD_LEADER_ELECTION,
    State.FD_LEADER_ELECTION: State.DRAINED,
    State.DRAINED: State.CHECKPOINTED,
    State.CHECKPOINTED: State.REFILLED,
    State.REFILLED: State.RUNNING,
    State.RESTARTING: State.CHECKPOINTED,
}

# A checkpoint round in which no tree holds a socket to hand over (nor an
# inotify instance, whose reader is elected with the sockets) skips the
# barriers only those need: the election and the drain before the dump,
# the refill after it.  Each skipped barrier is a round trip through the
# coordinator, and a step of every agent, while the program is stopped.
_SOCKETLESS: dict[State, State] = {
    State.SUSPENDED: State.CHECKPOINTED,
    State.CHECKPOINTED: State.RUNNING,
}


class TransitionError(ValueError):
    """A peer asked for a transition the protocol does not have."""


def next_state(state: State, socketless: bool = False) -> State:
    """What the barrier after `state` leads to; socketless: in a checkpoint
    round where no tree has a socket to elect, drain or refill."""
    if socketless and state in _SOCKETLESS:
        return _SOCKETLESS[state]
    return _NEXT[state]


# A round with pre-copy (chosen by the coordinator) enters at PRECOPIED
# instead of SUSPENDED; the program still runs there, so a round given up
# in it leaves an agent at PRECOPIED, from where the next round may begin
# with a pre-copy again.
_ENTER_PRECOPY = frozenset({State.RUNNING, State.PRECOPIED})


def first_state(precopy: bool) -> State:
    """Where a checkpoint round begins."""
    return State.PRECOPIED if precopy else State.SUSPENDED


def check_transition(current: State, target: State, socketless: bool = False) -> None:
    """socketless: the round may skip the barriers only sockets need."""
    if target is State.PRECOPIED and current in _ENTER_PRECOPY:
        return
    if _NEXT.get(current) is not target \
            and not (socketless and _SOCKETLESS.get(current) is target):
        raise TransitionError(f"illegal transition {current.value} -> {target.value}")


def parse(name: str) -> State:
    try:
        return State(name)
    except ValueError:
        raise TransitionError(f"unknown state {name!r}") from None
