"""Self-healing on one host: a ring of three separately launched trees
streams counters (every byte checked by its receiver) under a coordinator
with interval checkpoints and --auto-restart.  A program SIGKILLed, or an
agent SIGKILLed, and the ring goes on by itself from the last checkpoint
to its end with every byte exactly once; a program that exits by itself is
not restarted.  The restored programs write where the recovery's restart
command does (restarter.output_path), as programs restarted by hand write
where dmtcp_restart does."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil
import pytest

from dmtcp_py.coordinator import restarter
from tests.e2e.harness import Computation, ticks, wait_for

TICKS = 160          # ticks of the ring's programs ...
TICK_MS = 50         # ... this far apart: ~8 s of running, longer than a recovery
PORT = "7921"
ADDRS = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]  # loopback, one listener each


def launch_ring(comp: Computation, net_stream: list[str]):
    nodes = []
    for i, addr in enumerate(ADDRS):
        nxt = ADDRS[(i + 1) % len(ADDRS)]
        nodes.append(comp.launch(*net_stream, "ring", addr, PORT, nxt, str(TICKS), str(TICK_MS)))
    comp.wait_peers(3)
    ring_streams(out for _, out in nodes)
    comp.command("-i", "1")
    return nodes


def ring_streams(outputs) -> None:
    """Every node has received bytes: the ring's connections are made."""
    for out in outputs:
        wait_for(lambda: any(r[0] == "tick" and r[-1] != "0" for r in ticks(out)),
                 what="the ring to stream")


def program_pid(launch: subprocess.Popen, name: str) -> int:
    procs = [p for p in psutil.Process(launch.pid).children(recursive=True) if p.name() == name]
    assert len(procs) == 1, procs
    return procs[0].pid


def wait_restarted(comp: Computation, restarts: int) -> dict:
    def healed():
        st = comp.status()
        return st if st["restarts"] >= restarts and st["running"] and st["num_peers"] == 3 \
            else None
    return wait_for(healed, timeout=60, what=f"{restarts} automatic restart(s)")


def assert_ring_finished(comp: Computation) -> None:
    """Each of the three restored programs ran to its end and found every
    counter in sequence (a FAIL line, and exit 3, otherwise)."""
    out = restarter.output_path(comp.port)
    done = wait_for(lambda: len([r for r in ticks(out) if r[0] == "done"]) == 3 and
                    [r for r in ticks(out) if r[0] == "done"], timeout=60,
                    what="the end of the restored ring")
    assert "FAIL" not in out.read_text(), out.read_text()[-2000:]
    assert all(r[:3] == ["done", str(TICKS), "ring"] for r in done)


@pytest.mark.parametrize("victim", ["program", "agent"])
def test_a_ring_heals_itself(auto, programs, victim):
    nodes = launch_ring(auto, programs["net_stream"])
    wait_for(lambda: auto.status()["generation"] >= 1, what="an interval checkpoint")
    # no more checkpoints: the ring streams hundreds of MB between them, and
    # one that meets a program's shutdown(SHUT_WR) with bytes in flight fails
    # (README, known limits)
    auto.command("-i", "0")
    wait_for(lambda: auto.status()["state"] == "RUNNING", what="the checkpoint to end")
    launch, _out = nodes[1]
    root = program_pid(launch, "dmtcp_tree_init")
    pid = program_pid(launch, "net_stream") if victim == "program" else launch.pid
    os.kill(pid, signal.SIGKILL)
    if victim == "agent":
        # its tree ends by itself (FATE) and comes to us, the tests' subreaper,
        # as a zombie whose pid the restore needs: reap it as init would
        launch.wait(timeout=30)
        wait_for(lambda: os.waitpid(root, os.WNOHANG)[0] == root, timeout=30,
                 what="the agent's tree to end without it")
    st = wait_restarted(auto, 1)
    failure = st["last_failure"]
    assert failure["tree_id"] and failure["host"]
    assert ("SIGKILL" if victim == "program" else "agent disappeared") in failure["why"]
    assert st["time_lost"] > 0 and st["gave_up"] is None
    # checkpoints go on after the recovery, numbered on from before it
    generation = st["generation"]
    assert "done" in auto.checkpoint()
    assert auto.status()["generation"] == generation + 1
    assert_ring_finished(auto)


def test_a_program_that_exits_by_itself_is_not_restarted(auto, programs):
    stays, _ = auto.launch(sys.executable, "-c", "import time; time.sleep(60)")
    ends, _ = auto.launch("sh", "-c", "sleep 2; exit 3")
    auto.wait_peers(2)
    auto.command("-i", "1")
    wait_for(lambda: auto.status()["generation"] >= 1, what="an interval checkpoint")
    assert_exit_not_restarted(auto, ends, stays)


def assert_exit_not_restarted(comp: Computation, ends, stays) -> None:
    """ends exits 3 by itself: reported as its exit, nothing restarted,
    and stays runs on alone."""
    assert ends.wait(timeout=30) == 3
    st = wait_for(lambda: comp.status()["last_exit"], what="the exit reported")
    assert st["exit_code"] == 3
    st = comp.status()
    assert st["restarts"] == 0 and st["last_failure"] is None and st["recovering"] is None
    assert stays.poll() is None and st["num_trees"] == 1
