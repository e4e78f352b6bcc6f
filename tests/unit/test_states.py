"""The state enum and its transition table."""
from __future__ import annotations

import itertools

import pytest

from dmtcp_py.protocol.states import (State, TransitionError, check_transition, first_state,
                                      next_state, parse)

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
    # nothing leads back into RESTARTING, nor into PRECOPIED (a round enters there)
    assert State.RESTARTING not in {next_state(s) for s in State}
    assert State.PRECOPIED not in {next_state(s) for s in State}


def test_a_round_with_precopy_enters_at_precopied_then_suspends():
    assert first_state(precopy=False) is State.SUSPENDED
    assert first_state(precopy=True) is State.PRECOPIED
    assert next_state(State.PRECOPIED) is State.SUSPENDED
    # the program runs at PRECOPIED: a round given up there leaves an agent
    # there, from where the next round begins either way
    for current in (State.RUNNING, State.PRECOPIED):
        check_transition(current, State.PRECOPIED)
    check_transition(State.PRECOPIED, State.SUSPENDED)


# entered from where the program runs, not from a successor's table
ENTRIES = {(State.RUNNING, State.PRECOPIED), (State.PRECOPIED, State.PRECOPIED)}


@pytest.mark.parametrize("current,target", list(itertools.product(State, State)))
def test_only_table_transitions_are_legal(current, target):
    if next_state(current) is target or (current, target) in ENTRIES:
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
    (State.SUSPENDED, State.PRECOPIED),
    (State.CHECKPOINTED, State.PRECOPIED),
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
