"""The state enum and its transition table."""
from __future__ import annotations

import itertools

import pytest

from dmtcp_py.protocol.states import State, TransitionError, check_transition, next_state, parse

CYCLE = [State.RUNNING, State.SUSPENDED, State.FD_LEADER_ELECTION, State.DRAINED,
         State.CHECKPOINTED, State.REFILLED, State.RUNNING]


def test_checkpoint_cycle_in_order():
    state = State.RUNNING
    visited = [state]
    for _ in range(len(CYCLE) - 1):
        nxt = next_state(state)
        check_transition(state, nxt)
        visited.append(nxt)
        state = nxt
    assert visited == CYCLE


def test_restart_enters_at_checkpointed():
    assert next_state(State.RESTARTING) is State.CHECKPOINTED
    check_transition(State.RESTARTING, State.CHECKPOINTED)
    # and from there joins the normal sequence
    assert next_state(State.CHECKPOINTED) is State.REFILLED


def test_every_state_has_exactly_one_successor():
    for state in State:
        assert isinstance(next_state(state), State)
    # nothing leads back into RESTARTING
    assert State.RESTARTING not in {next_state(s) for s in State}


@pytest.mark.parametrize("current,target", list(itertools.product(State, State)))
def test_only_table_transitions_are_legal(current, target):
    if next_state(current) is target:
        check_transition(current, target)
    else:
        with pytest.raises(TransitionError, match=f"illegal transition {current.value} -> {target.value}"):
            check_transition(current, target)


@pytest.mark.parametrize("current,target", [
    (State.RUNNING, State.RUNNING),
    (State.RUNNING, State.DRAINED),
    (State.SUSPENDED, State.RUNNING),
    (State.CHECKPOINTED, State.RUNNING),
    (State.RESTARTING, State.REFILLED),
    (State.REFILLED, State.SUSPENDED),
])
def test_examples_of_illegal_transitions(current, target):
    with pytest.raises(TransitionError):
        check_transition(current, target)


@pytest.mark.parametrize("state", list(State))
def test_parse_known_names(state):
    assert parse(state.value) is state


@pytest.mark.parametrize("name", ["", "running", "PAUSED", "RUNNING ", "None"])
def test_parse_unknown_names(name):
    with pytest.raises(TransitionError, match=f"unknown state {name!r}"):
        parse(name)


def test_transition_error_is_a_value_error():
    assert issubclass(TransitionError, ValueError)
