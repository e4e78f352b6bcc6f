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
    State.SUSPENDED: State.FD_LEADER_ELECTION,
    State.FD_LEADER_ELECTION: State.DRAINED,
    State.DRAINED: State.CHECKPOINTED,
    State.CHECKPOINTED: State.REFILLED,
    State.REFILLED: State.RUNNING,
    State.RESTARTING: State.CHECKPOINTED,
}


class TransitionError(ValueError):
    """A peer asked for a transition the protocol does not have."""


def next_state(state: State) -> State:
    return _NEXT[state]


def check_transition(current: State, target: State) -> None:
    if _NEXT.get(current) is not target:
        raise TransitionError(f"illegal transition {current.value} -> {target.value}")


def parse(name: str) -> State:
    try:
        return State(name)
    except ValueError:
        raise TransitionError(f"unknown state {name!r}") from None
