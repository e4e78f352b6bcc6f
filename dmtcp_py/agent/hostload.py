"""How loaded the CPUs a tree runs on are, and how much of them the tree
gets (--rebalance, coordinator/rebalance.py).

Deltas between two samples of /proc: the busy time of each CPU the tree
may use (/proc/stat: every column but idle and iowait), the tree's
processes' CPU time (/proc/PID/stat utime + stime, all their threads), and
how long each of their threads was runnable but waited for a CPU
(/proc/PID/task/TID/schedstat, its second field: run_delay, ns).  A
thread that waits a quarter of the time while the CPUs are busy with
processes not under control is what the coordinator looks for.

The first sample only sets the baseline: sample() says nothing until it
has two.  Processes that appear between two samples count from their
second one.  Reads only; nothing here decides anything.
"""
from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from dmtcp_py.frozen import field, mutable_record
from dmtcp_py.protocol.messages import Load

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_IDLE_COLUMNS = (3, 4)  # idle, iowait (of user nice system idle iowait irq softirq steal)


def cpu_times() -> dict[int, tuple[int, int]]:
    """CPU number -> (busy, total) clock ticks since boot (/proc/stat)."""
    out: dict[int, tuple[int, int]] = {}
    with open("/proc/stat") as f:
        for line in f:
            if not line.startswith("cpu") or line.startswith("cpu "):
                continue
            words = line.split()
            # guest time is already in user: columns up to steal only
            ticks = [int(w) for w in words[1:9]]
            idle = sum(ticks[i] for i in _IDLE_COLUMNS)
            out[int(words[0][3:])] = (sum(ticks) - idle, sum(ticks))
    return out


def process_cpu(pid: int) -> float | None:
    """Seconds of CPU the process used (every thread), or None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime (14, 15)


def thread_waits(pid: int) -> dict[int, int]:
    """Thread id -> ns it spent runnable, waiting for a CPU (run_delay)."""
    out: dict[int, int] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            words = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()
            out[int(tid)] = int(words[1])
        except (OSError, IndexError, ValueError):
            continue
    return out


def affinity(pids: Iterable[int]) -> set[int]:
    """The CPUs any of the processes may run on (ours if none answers)."""
    cpus: set[int] = set()
    for pid in pids:
        try:
            cpus |= os.sched_getaffinity(pid)
        except OSError:
            continue
    return cpus or os.sched_getaffinity(0)


def kernel_id() -> str:
    """This boot of this kernel: the same on every host that shares it."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


@mutable_record
class _Sample:
    at: float
    cpus: dict[int, tuple[int, int]]
    proc_cpu: dict[int, float]
    waits: dict[int, int]   # thread id -> run_delay ns


@mutable_record
class LoadSampler:
    kernel: str = field(default_factory=kernel_id)
    _last: _Sample | None = None

    def sample(self, pids: list[int], now: float) -> Load | None:
        """The load since the previous sample (None for the first, or when
        no time has passed); now: a monotonic clock, in seconds."""
        proc_cpu = {p: c for p in pids if (c := process_cpu(p)) is not None}
        waits: dict[int, int] = {}
        for pid in proc_cpu:
            waits.update(thread_waits(pid))
        cur = _Sample(now, cpu_times(), proc_cpu, waits)
        prev, self._last = self._last, cur
        if prev is None or cur.at <= prev.at:
            return None
        dt = cur.at - prev.at
        mine = sorted(affinity(proc_cpu) & cur.cpus.keys()) or sorted(cur.cpus)
        busy = 0.0
        for cpu in mine:
            before = prev.cpus.get(cpu)
            if before is None:
                continue
            ticks = cur.cpus[cpu][1] - before[1]
            if ticks > 0:
                busy += max(0, cur.cpus[cpu][0] - before[0]) / ticks
        used = sum(max(0.0, c - prev.proc_cpu[p]) for p, c in proc_cpu.items()
                   if p in prev.proc_cpu)
        wait = max((max(0, w - prev.waits[t]) / 1e9 / dt for t, w in waits.items()
                    if t in prev.waits), default=0.0)
        return Load(interval=round(dt, 3), cpus=tuple(mine), busy=round(busy, 3),
                    tree_cpu=round(used / dt, 3), wait=round(min(wait, 1.0), 3),
                    kernel=self.kernel)
