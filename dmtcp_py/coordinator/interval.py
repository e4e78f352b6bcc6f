"""`--interval auto`: the checkpoint interval chosen from what the
coordinator measures, the cost of its checkpoints and the failures it sees.

Young (1974) showed that the interval that loses the least time, between
checkpoints that cost C seconds and failures that come every M seconds on
average, is about sqrt(2 C M): checkpoint more often and the checkpoints
themselves cost more; less often, and a failure throws more work away.
Daly (2006) refines it with higher-order terms (and the restart's cost),
which matter only when C is not small against M; the first-order formula
is what the issue asks for, and what the measurements here can support.

Pure arithmetic, no I/O and no clock: the coordinator's machine passes the
times in as numbers (its own clock), as it does everywhere else.

- C: the median of the last few checkpoints' costs, the seconds the
  program was stopped (from the round's start until its trees run again).
  A median, so that one slow checkpoint (a cold page cache, a busy disk)
  does not swing the interval, while a lasting change shows after a few.
- M: the time the computation has been observed, divided by the failures
  seen in it plus one.  With no failure yet, the whole observed time: an
  estimate from below, so the interval grows (as the square root of time)
  toward the ceiling while nothing fails.  The one more keeps it from
  below (the next failure may be due any time) and makes the first failure
  shorten the interval too: T/1 with none and T/1 with one would not.
"""
from __future__ import annotations

import math
from collections import deque

FLOOR = 1.0          # seconds: never checkpoint more often than this
CEILING = 3600.0     # seconds: never less often (a failure loses at most about this much)
START = 10.0         # seconds, before any checkpoint was measured
# The interval is at least this many times the cost: however often failures
# come, the computation runs at least this much longer than it is stopped.
COST_FACTOR = 5.0
COSTS_KEPT = 5       # the checkpoints whose median is the cost
# Trees lost within this many seconds of a failure counted are that same
# failure: a host that goes takes all its trees, and the heartbeat timeout
# finds them in one tick; one event must not look like many.
SAME_FAILURE = 10.0


class AutoInterval:
    """Fed the cost of each successful checkpoint and each failure;
    choose(now) says the interval."""

    def __init__(self, *, floor: float = FLOOR, ceiling: float = CEILING,
                 start: float = START, costs_kept: int = COSTS_KEPT) -> None:
        if not 0 < floor <= ceiling:
            raise ValueError(f"need 0 < floor ({floor}) <= ceiling ({ceiling})")
        self.floor = floor
        self.ceiling = ceiling
        self.start = start
        self.costs: deque[float] = deque(maxlen=costs_kept)
        self.started: float | None = None   # when the computation was first seen running
        self.failures = 0
        self._last_failure: float | None = None

    def begin(self, now: float) -> bool:
        """The computation runs (from now, the first time): failures are
        counted over the time since.  True the first time only."""
        if self.started is not None:
            return False
        self.started = now
        return True

    def checkpointed(self, cost: float) -> None:
        """A successful checkpoint stopped the program for cost seconds."""
        self.costs.append(max(0.0, cost))

    def failed(self, at: float) -> bool:
        """A tree was lost at `at`; False when it is part of a failure
        already counted (SAME_FAILURE)."""
        self.begin(at)
        if self._last_failure is not None and at - self._last_failure < SAME_FAILURE:
            return False
        self._last_failure = at
        self.failures += 1
        return True

    def cost(self) -> float | None:
        """C: the smoothed cost of a checkpoint, None before the first."""
        import statistics  # (with fractions and decimal: ~4 ms of every coordinator's start)
        return statistics.median(self.costs) if self.costs else None

    def mtbf(self, now: float) -> float:
        """M: the observed time per failure, one more counted than seen."""
        observed = max(0.0, now - self.started) if self.started is not None else 0.0
        return observed / (self.failures + 1)

    def choose(self, now: float) -> float:
        """The interval, in seconds: sqrt(2 C M) within the bounds."""
        cost = self.cost()
        if cost is None:
            return self._bounded(self.start, 0.0)
        return self._bounded(math.sqrt(2.0 * cost * self.mtbf(now)), cost)

    def _bounded(self, seconds: float, cost: float) -> float:
        # the ceiling wins over the cost's floor: a checkpoint that takes
        # longer than ceiling / COST_FACTOR still comes once per ceiling
        low = max(self.floor, COST_FACTOR * cost)
        return min(self.ceiling, max(low, seconds))

    def describe(self, now: float) -> str:
        """Why the interval is what it is, for the coordinator's log."""
        cost = self.cost()
        if cost is None:
            return f"{self.choose(now):.1f} s (no checkpoint measured yet)"
        n = self.failures
        observed = now - self.started if self.started is not None else 0.0
        seen = f"{n} failure{'s' if n > 1 else ''} in {observed:.0f} s" if n else "no failure yet"
        return (f"{self.choose(now):.1f} s (checkpoint cost {cost:.3f} s, mean time "
                f"between failures {self.mtbf(now):.0f} s: {seen})")
