"""A tree alone in its round, with no socket to give back, runs again as soon
as CRIU has let it go: the rest of the round (the report, the commit, the
release) no longer keeps the program stopped.  Where something still waits
for it, it stays stopped until the round's release: another tree whose dump
may still be under way, or, after a restore, the rest of the restart (the
token of its last checkpoint is in the restored memory too, and must not
let it go)."""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from dmtcp_py.fault_injection import hold_env
from dmtcp_py.protocol.states import State
from dmtcp_py.paths import run_dir
from tests.e2e.harness import TIMEOUT, tool, wait_for

HOLD = 4        # seconds an agent lingers, its work for the state done
INTERVAL = 1.0  # the program ticks every 10 ms: ~100 ticks in this time
# Ticks appended to a file of their own, opened for each: what the program
# prints reaches its output through the agent, and may show only later
TICKER = ("import sys, time\n"
          "while True:\n"
          "    with open(sys.argv[1], 'a') as f:\n"
          "        f.write('tick\\n')\n"
          "    time.sleep(0.01)\n")


def launch_ticker(comp, path: Path, state: State) -> subprocess.Popen:
    proc, _ = comp.launch("python3", "-c", TICKER, str(path),
                          env={**os.environ, **hold_env(state, HOLD)})
    return proc


def count(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def restart_held(since: float) -> bool:
    """A restart's agent started after `since` lingers in REFILLED."""
    return any("holding in REFILLED" in log.read_text()
               for log in run_dir().glob("agent-*-restart-*.log")
               if log.stat().st_mtime >= since)


def begin_checkpoint(comp) -> subprocess.Popen:
    """`dmtcp-command -bc`, returning at once; waits until the round is at
    its dump (the trees stopped, the agents dumping or held after it)."""
    ckpt = subprocess.Popen([tool("dmtcp-command"), "-p", str(comp.port), "-bc"],
                            stdout=subprocess.PIPE, text=True)
    wait_for(lambda: comp.status()["state"] == "CHECKPOINTED", what="the dump's barrier")
    return ckpt


def test_a_tree_alone_without_sockets_runs_while_its_round_ends(comp, tmp_path):
    ticks = tmp_path / "ticks"
    proc = launch_ticker(comp, ticks, State.CHECKPOINTED)
    comp.wait_peers(1)
    wait_for(lambda: count(ticks) >= 5, what="the program")
    ckpt = begin_checkpoint(comp)
    # the agent lingers after the dump: the program runs meanwhile
    before = count(ticks)
    time.sleep(INTERVAL)
    assert count(ticks) > before + 10
    assert ckpt.poll() is None and comp.status()["state"] == "CHECKPOINTED"
    assert "done" in ckpt.communicate(timeout=TIMEOUT)[0]
    assert comp.status()["running"]
    comp.kill_and_wait(proc)

    # restored, it waits for the restart's release (held here with every
    # process back, connected to its new agent)
    at_kill = count(ticks)
    since = time.time()
    restarted, _ = comp.restart(env={**os.environ, **hold_env(State.REFILLED, HOLD)})
    wait_for(lambda: restarted.poll() is not None or restart_held(since),
             what="the restart's agent to hold with its processes back")
    time.sleep(INTERVAL)
    assert restarted.poll() is None
    assert count(ticks) == at_kill, "the restored program ran before its release"
    wait_for(lambda: count(ticks) > at_kill + 10, what="the restored program to run")
    comp.kill_and_wait(restarted)


def test_two_trees_wait_for_each_other_s_dump(comp, tmp_path):
    files = [tmp_path / "ticks-a", tmp_path / "ticks-b"]
    procs = [launch_ticker(comp, path, State.CHECKPOINTED) for path in files]
    comp.wait_peers(2)
    for path in files:
        wait_for(lambda: count(path) >= 5, what="the programs")
    ckpt = begin_checkpoint(comp)
    # each agent lingers after its dump: both programs stay stopped
    stopped = [count(path) for path in files]
    time.sleep(INTERVAL)
    assert ckpt.poll() is None and comp.status()["state"] == "CHECKPOINTED"
    assert [count(path) for path in files] == stopped
    assert "done" in ckpt.communicate(timeout=TIMEOUT)[0]
    for path, before in zip(files, stopped):
        wait_for(lambda: count(path) > before, what="ticks after the round")
    comp.command("-k")
    for proc in procs:
        proc.wait(timeout=TIMEOUT)
