"""Fault-injection points, for tests: the agent lingers in a state on request.

With DMTCP_TEST_HOLD_<STATE>=<seconds> in its environment, an agent that
reaches <STATE> (its work for that barrier done, before it reports it) waits
that many seconds, so that a test can look at the tree there (is it really
stopped? are its sockets parked?) or kill something there (a peer, the
coordinator) and see what the others do.  The agent calls hold() where a
state's work ends: today at PRECOPIED (the pre-copy stored, the program
running), at SUSPENDED, at DRAINED, at CHECKPOINTED (the tree
dumped, before the agent reports it), at REFILLED (the processes back
from a dump or a restore, their sockets refilled, before the release;
also in a round without sockets, which has no REFILLED barrier), at
RESTARTING (a
restarting agent whose tree CRIU restored, before it reports CHECKPOINTED),
and at RUNNING (a launched agent whose program runs, before it joins the
coordinator).

These are read only from the agent's own environment (the one dmtcp-launch
or dmtcp_restart was started with: each becomes an agent); nothing else
reads them (not the coordinator, not the shim, not the program), and
unset, empty or 0 they have no effect.  A value that is not a finite
number >= 0 is an error (ValueError naming the variable), not ignored: a
misspelt hold would make a test check something without holding there and
pass for the wrong reason.  Tests build the entry with hold_env().
"""
from __future__ import annotations

import asyncio
import logging
import math
import os
from collections.abc import Mapping

from dmtcp_py.protocol.states import State

PREFIX = "DMTCP_TEST_HOLD_"


def env_name(state: State) -> str:
    """The variable that holds the agent in `state`: DMTCP_TEST_HOLD_DRAINED."""
    return PREFIX + state.value


def _seconds(name: str, value: str | float) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f"{name}={value!r}: not a number of seconds") from None
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{name}={value!r}: must be a finite number of seconds >= 0")
    return seconds


def hold_seconds(state: State, environ: Mapping[str, str] | None = None) -> float:
    """How long to linger in `state`: 0 unless the variable is set (ValueError
    if it is set to something other than a number >= 0)."""
    name = env_name(state)
    value = (os.environ if environ is None else environ).get(name, "").strip()
    return _seconds(name, value) if value else 0.0


async def hold(state: State) -> None:
    """Called by the agent when it reached `state`: linger there if asked."""
    seconds = hold_seconds(state)
    if seconds > 0:
        # (what a test looks for in the agent's log to know it is there)
        logging.getLogger("fault_injection").info("holding in %s for %g s", state.value, seconds)
        await asyncio.sleep(seconds)


def hold_env(state: State, seconds: float) -> dict[str, str]:
    """The environment entry that makes agents linger `seconds` in `state`:
    hold_env(State.DRAINED, 3) == {"DMTCP_TEST_HOLD_DRAINED": "3"}."""
    name = env_name(state)
    _seconds(name, seconds)
    return {name: f"{seconds:g}"}


# A failure on request, where a real one would leave the most to clean up:
# DMTCP_TEST_FAIL_<POINT>=1.  Today PRECOPY_STORE: CRIU's pre-dump is done
# (the program's written pages protected again) and storing it fails, so
# the round's dump must not leave a page to any earlier image.
FAIL_PREFIX = "DMTCP_TEST_FAIL_"


class InjectedFault(OSError):
    """What a failure point raises (an OSError: handled as the real ones)."""


def fail_point(point: str) -> None:
    """Raise InjectedFault if DMTCP_TEST_FAIL_<point> is 1 in our environment."""
    if os.environ.get(FAIL_PREFIX + point, "").strip() == "1":
        raise InjectedFault(f"fault injected at {point} ({FAIL_PREFIX + point}=1)")


# How long a restarted tree waits for each of its connections' other end
# (agent/network.py: its agent publishes or looks the connection up, and
# waits for the peer's agent): DMTCP_TEST_CONNECT_TIMEOUT=<seconds>, so a
# test can see a restart whose peer never comes fail without waiting the
# minute it waits by default.
CONNECT_TIMEOUT_ENV = "DMTCP_TEST_CONNECT_TIMEOUT"


def connect_timeout(default: float) -> float:
    value = os.environ.get(CONNECT_TIMEOUT_ENV, "").strip()
    return _seconds(CONNECT_TIMEOUT_ENV, value) if value else default
