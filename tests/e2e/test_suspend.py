"""SUSPENDED means stopped: every thread but the one serving the agent sleeps
in the shim's handler, whatever the program did to its signals.  The one
serving is the checkpoint thread, or, in a process that has none, the
program thread whose signal handler took the agent's wake-up: it waits in
the handler for the agent's next record."""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import psutil

from dmtcp_py.fault_injection import hold_env
from dmtcp_py.protocol.states import State
from tests.e2e.harness import TIMEOUT, last_tick, tool, wait_for

FUTEX = "202"  # x86_64 syscall number, first field of /proc/<pid>/task/<tid>/syscall
RECVMSG = "47"  # where the thread serving the agent waits for its next record
HOLD = 6        # seconds the agent lingers in SUSPENDED
INTERVAL = 1.0  # the program ticks every 10 ms: ~100 ticks in this time


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
    env = {**os.environ, **hold_env(State.SUSPENDED, HOLD)}
    proc, out = comp.launch(*programs["busy_threads"], "100000", "10", env=env)
    comp.wait_peers(1)
    wait_for(lambda: last_tick(out) >= 5, what="the program")
    [pid] = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)
             if c.name() == "busy_threads"]
    busy = lambda: [c for n, c in program_threads(pid).values() if n != "dmtcp_ckpt"]  # noqa: E731
    assert len(busy()) == 4 and "running" in busy()
    # the measure can see movement: running, the ticks advance over INTERVAL
    before = last_tick(out)
    time.sleep(INTERVAL)
    assert last_tick(out) > before + 10
    ckpt = subprocess.Popen([tool("dmtcp-command"), "-p", str(comp.port), "-bc"],
                            stdout=subprocess.PIPE, text=True)
    wait_for(lambda: comp.status()["state"] == "SUSPENDED", what="the SUSPENDED barrier")
    stopped = lambda: sorted(busy()) in ([FUTEX] * 4, [FUTEX] * 3 + [RECVMSG])  # noqa: E731
    wait_for(stopped, timeout=3, what="every program thread to be stopped in the shim")
    # held in SUSPENDED (HOLD seconds): over a real interval, no tick
    stopped_at = last_tick(out)
    time.sleep(INTERVAL)
    assert last_tick(out) == stopped_at
    # ...and the whole interval was in SUSPENDED: still held, still stopped
    assert ckpt.poll() is None and comp.status()["state"] == "SUSPENDED"
    assert stopped()
    assert "done" in ckpt.communicate(timeout=TIMEOUT)[0]
    wait_for(lambda: "running" in busy(), what="the threads to run again")
    wait_for(lambda: last_tick(out) > stopped_at + 10, what="ticks after the checkpoint")
    comp.kill_and_wait(proc)
