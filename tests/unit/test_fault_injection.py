"""The fault-injection points: what DMTCP_TEST_HOLD_<STATE> means.

Unset, empty or 0: no hold.  A number >= 0: that many seconds.  Anything
else is an error naming the variable, never silently ignored (a misspelt
hold would let a test pass without holding)."""
from __future__ import annotations

import asyncio

import pytest

from dmtcp_py import fault_injection as fi
from dmtcp_py.protocol.states import State

NAME = "DMTCP_TEST_HOLD_DRAINED"


def test_hold_env_builds_the_entry():
    assert fi.hold_env(State.DRAINED, 3) == {NAME: "3"}
    assert fi.hold_env(State.SUSPENDED, 0.5) == {"DMTCP_TEST_HOLD_SUSPENDED": "0.5"}
    assert fi.env_name(State.CHECKPOINTED) == "DMTCP_TEST_HOLD_CHECKPOINTED"


def test_what_hold_env_builds_reads_back():
    for seconds in (0, 0.25, 3, 12.5):
        assert fi.hold_seconds(State.DRAINED, fi.hold_env(State.DRAINED, seconds)) == seconds


@pytest.mark.parametrize("environ", [{}, {NAME: ""}, {NAME: "  "}, {NAME: "0"}, {NAME: "0.0"}])
def test_unset_empty_or_zero_is_no_hold(environ):
    assert fi.hold_seconds(State.DRAINED, environ) == 0


@pytest.mark.parametrize("value,seconds", [("3", 3.0), ("0.5", 0.5), (" 2 ", 2.0), ("1e1", 10.0)])
def test_a_number_is_seconds(value, seconds):
    assert fi.hold_seconds(State.DRAINED, {NAME: value}) == seconds


def test_only_its_own_state_is_read():
    assert fi.hold_seconds(State.SUSPENDED, {NAME: "3"}) == 0


@pytest.mark.parametrize("value", ["abc", "3s", "-1", "nan", "inf", "1,5"])
def test_garbage_is_a_clear_error(value):
    with pytest.raises(ValueError, match=NAME):
        fi.hold_seconds(State.DRAINED, {NAME: value})


@pytest.mark.parametrize("seconds", [-1, float("nan"), float("inf")])
def test_hold_env_refuses_what_the_agent_would(seconds):
    with pytest.raises(ValueError, match=NAME):
        fi.hold_env(State.DRAINED, seconds)


def test_hold_reads_the_process_environment(monkeypatch):
    # the waits hold() asks for, recorded instead of timed (a loaded
    # machine makes any bound on elapsed time flaky)
    slept: list[float] = []

    async def sleep(seconds):
        slept.append(seconds)

    monkeypatch.setattr(fi.asyncio, "sleep", sleep)
    monkeypatch.delenv(NAME, raising=False)
    asyncio.run(fi.hold(State.DRAINED))  # unset: returns at once
    assert slept == []
    monkeypatch.setenv(NAME, "0.2")
    asyncio.run(fi.hold(State.DRAINED))
    assert slept == [0.2]
    monkeypatch.setenv(NAME, "soon")
    with pytest.raises(ValueError, match=NAME):
        asyncio.run(fi.hold(State.DRAINED))


def test_the_module_stands_apart_from_agent_and_coordinator():
    import ast
    from pathlib import Path
    tree = ast.parse(Path(fi.__file__).read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not [m for m in names if m.startswith(("dmtcp_py.agent", "dmtcp_py.coordinator"))]
