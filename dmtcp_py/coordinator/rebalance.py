"""--rebalance: move the trees a host slows down to the least loaded host.

No I/O and no clock (times are numbers given by the caller).  Every few
seconds each agent reports (messages.Load) how busy the CPUs its tree may
use were, how much of them the tree had, and the largest share of the
time one of its threads waited, runnable, for a CPU.

A host is overloaded when one of its trees waits at least WAIT of the
time while processes not under control take at least FOREIGN CPUs of the
CPUs that tree runs on: their busy time less the computation's own use of
them.  The computation's own use is every tree's that reported from the
same kernel (hosts that are containers or namespaces of one machine share
its CPUs), in proportion to the CPUs it shares with the slowed tree.  A
tree that waits only for the computation's other trees is the program's
own doing, and moving it would not help.

When a host has been overloaded in every report for `after` seconds, no
round or recovery runs and the last rebalance is `after` seconds past, the
slowed trees move, with the trees of their traffic groups on the same
host ("Grouping MPI Processes for Partial Checkpoint and Co-migration":
a slowed process moves with the processes it talks to most), to the
least loaded other host of --hosts: one that runs none of the
computation's trees first (a spare), else the one whose CPUs were least
busy, if its CPUs are at least MARGIN less busy than the overloaded host's.  A host trees left because
it was overloaded is no target for a while (LEFT_FOR): the processes that
took its CPUs are likely still there.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

from dmtcp_py.frozen import record
from dmtcp_py.protocol.messages import Load

WAIT = 0.25      # of the time a thread of the tree waits for a CPU
FOREIGN = 0.3    # CPUs taken by processes not under control
MARGIN = 0.25    # a host with trees is a target only if its CPUs are this much less busy
AFTER = 30.0     # seconds a host stays overloaded before its trees move (default)
STALE = 15.0     # seconds after which a tree's report no longer counts (3 samples)
# a host trees left because it was overloaded is no target for this many
# times `after` (at least LEFT_MIN seconds): no moving back and forth
LEFT_FOR, LEFT_MIN = 10, 60.0


@record
class Report:
    tree_id: str
    host: str
    load: Load
    at: float

    @property
    def share(self) -> float:
        """How busy its CPUs were: 0 idle, 1 all busy."""
        return self.load.busy / len(self.load.cpus)


@record
class Decision:
    """A rebalance: these trees of `host` go to `to` ("" when no host is
    less loaded); why, in figures."""
    host: str
    to: str
    trees: tuple[str, ...]
    overloaded_for: float
    waits: tuple[tuple[str, float], ...]   # each slowed tree's wait
    foreign: float                         # CPUs others took, where the most
    load_there: float | None = None        # the target's busy share (None: a spare)

    def describe(self) -> str:
        waits = ", ".join(f"{t} waits {w:.0%}" for t, w in self.waits)
        why = (f"rebalance: {self.host} overloaded for {self.overloaded_for:.0f} s "
               f"({waits} for a CPU; processes not under control take "
               f"{self.foreign:.1f} CPUs)")
        if not self.to:
            return why + "; no other host of --hosts is less loaded: staying"
        where = "a spare" if self.load_there is None else f"{self.load_there:.0%} busy"
        return why + f"; moving {', '.join(self.trees)} to {self.to} ({where})"

    def as_json(self) -> dict:
        return {"host": self.host, "to": self.to, "trees": list(self.trees),
                "overloaded_for": round(self.overloaded_for, 3),
                "waits": {t: w for t, w in self.waits}, "foreign_cpus": round(self.foreign, 3),
                "why": self.describe()}


class Rebalancer:
    def __init__(self, hosts: Iterable[str], after: float = AFTER) -> None:
        self.hosts = tuple(hosts)
        self.after = after
        self._reports: dict[str, Report] = {}   # tree -> its latest
        self._since: dict[str, float] = {}      # host -> overloaded in every report since
        self._last_over: dict[str, float] = {}  # host -> its latest overloaded report
        self.not_before = 0.0                   # cool-down after a rebalance
        self._left: dict[str, float] = {}       # host -> no target until then

    # ---- what the agents say ---------------------------------------------------

    def report(self, tree_id: str, host: str, load: Load, now: float) -> None:
        self._reports[tree_id] = Report(tree_id, host, load, now)
        if self._slowed(host, now):
            self._since.setdefault(host, now)
            self._last_over[host] = now
        else:
            self._since.pop(host, None)
            self._last_over.pop(host, None)

    def forget(self, tree_id: str) -> None:
        """A tree that left (or moved: its new copy reports afresh)."""
        self._reports.pop(tree_id, None)

    def overloaded(self, now: float) -> dict[str, float]:
        """host -> seconds it has been overloaded (in its fresh reports)."""
        return {h: round(self._last_over[h] - s, 3) for h, s in self._since.items()
                if now - self._last_over[h] <= STALE}

    # ---- the decision ------------------------------------------------------------

    def foreign(self, report: Report, now: float) -> float:
        """CPUs of the report's CPUs that processes not under control took."""
        mine = set(report.load.cpus)
        own = 0.0
        for other in self._fresh(now):
            if other.host != report.host and (not other.load.kernel
                                              or other.load.kernel != report.load.kernel):
                continue
            theirs = set(other.load.cpus)
            own += other.load.tree_cpu * len(theirs & mine) / len(theirs)
        return max(0.0, report.load.busy - own)

    def _slowed(self, host: str, now: float) -> list[Report]:
        return [r for r in self._fresh(now) if r.host == host and r.load.wait >= WAIT
                and self.foreign(r, now) >= FOREIGN]

    def _fresh(self, now: float) -> list[Report]:
        return [r for r in self._reports.values() if now - r.at <= STALE]

    def decide(self, now: float, trees: Mapping[str, str],
               groups: Iterable[Iterable[str]]) -> Decision | None:
        """The rebalance due now, if any.  trees: tree -> host, every tree
        under control now; groups: the traffic matrix's groups."""
        if now < self.not_before:
            return None
        for tree in [t for t, r in self._reports.items() if trees.get(t) != r.host]:
            del self._reports[tree]  # gone, or moved: its figures were of the old place
        due = sorted((s, h) for h, s in self._since.items()
                     if self._last_over[h] - s >= self.after
                     and now - self._last_over[h] <= STALE)
        if not due:
            return None
        since, host = due[0]
        slowed = self._slowed(host, now)
        if not slowed:
            return None
        names = {r.tree_id for r in slowed}
        for group in groups:
            members = set(group)
            if members & names:
                names |= {t for t in members if trees.get(t) == host}
        to, load_there = self._target(host, trees, now)
        here = max(r.share for r in slowed)
        if to and load_there is not None and load_there > here - MARGIN:
            to, load_there = "", None
        return Decision(host, to, tuple(sorted(names)), self._last_over[host] - since,
                        tuple(sorted((r.tree_id, r.load.wait) for r in slowed)),
                        max(self.foreign(r, now) for r in slowed), load_there)

    def _target(self, host: str, trees: Mapping[str, str], now: float) -> tuple[str, float | None]:
        """The least loaded host of --hosts but `host`: a spare (None), else
        the least busy one that reported and is not overloaded itself."""
        used = set(trees.values())
        barred = {h for h, until in self._left.items() if now < until} | {host}
        for h in self.hosts:
            if h not in barred and h not in used:
                return h, None
        busy: dict[str, float] = {}
        for r in self._fresh(now):
            if r.host in self.hosts and r.host != host and trees.get(r.tree_id) == r.host:
                busy[r.host] = max(busy.get(r.host, 0.0), r.share)
        candidates = [h for h in self.hosts if h in busy and h not in barred
                      and h not in self.overloaded(now)]
        if not candidates:
            return "", None
        best = min(candidates, key=lambda h: (busy[h], self.hosts.index(h)))
        return best, busy[best]

    def started(self, now: float, left: str = "") -> None:
        """A rebalance was decided: what was measured is of the old
        placement; nothing moves again before `after` seconds, and nothing
        to the host left for a while."""
        if left:
            self._left[left] = now + max(LEFT_FOR * self.after, LEFT_MIN)
        self._reports.clear()
        self._since.clear()
        self._last_over.clear()
        self.not_before = now + self.after
