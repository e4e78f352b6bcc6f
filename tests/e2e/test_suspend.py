"""SUSPENDED means stopped: every thread but the checkpoint thread sleeps in
the shim's handler, whatever the program did to its signals."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import psutil

from tests.e2e.harness import TIMEOUT, last_tick, tool, wait_for

FUTEX = "202"  # x86_64 syscall number, first field of /proc/<pid>/task/<tid>/syscall


def program_threads(pid: int) -> dict[int, tuple[str, str]]:
    """tid -> (thread name, current syscall or 'running')"""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            call = (task / "syscall").read_text().split()[0]
        except OSError:
            continue
        out[int(task.name)] = (name, call)
    return out


def test_threads_stop_at_suspended_and_run_again(comp, programs):
    env = {**os.environ, "DMTCP_TEST_HOLD_SUSPENDED": "4"}
    proc, out = comp.launch(*programs["busy_threads"], "100000", "10", env=env)
    comp.wait_peers(1)
    wait_for(lambda: last_tick(out) >= 5, what="the program")
    [pid] = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)
             if c.name() == "busy_threads"]
    busy = lambda: [c for n, c in program_threads(pid).values() if n != "dmtcp_ckpt"]  # noqa: E731
    assert len(busy()) == 4 and "running" in busy()
    ckpt = subprocess.Popen([tool("dmtcp-command"), "-p", str(comp.port), "-bc"],
                            stdout=subprocess.PIPE, text=True)
    wait_for(lambda: comp.status()["state"] == "SUSPENDED", what="the SUSPENDED barrier")
    wait_for(lambda: all(call == FUTEX for call in busy()), timeout=3,
             what="every program thread to be stopped in the shim")
    stopped_at = last_tick(out)
    assert last_tick(out) == stopped_at
    assert "done" in ckpt.communicate(timeout=TIMEOUT)[0]
    wait_for(lambda: "running" in busy(), what="the threads to run again")
    wait_for(lambda: last_tick(out) > stopped_at + 3, what="ticks after the checkpoint")
    comp.kill_and_wait(proc)
