"""Self-healing when what dies is not the program but a process under it.

A parent that waits for its worker and exits 1 when the worker dies
abnormally (as mpirun does when a rank is killed) never dies of a signal
itself: the failure is known from the worker's end, which its parent's
wait wrappers tell the agent.  A worker SIGKILLed after a checkpoint and
the computation is restarted, from the checkpoint, by itself; a worker
ended by SIGTERM, a pipeline whose writer dies of SIGPIPE, a child its own
parent SIGKILLed, with a parent exiting non-zero, is an exit of the
program's own (LAST_EXIT), not a failure.  With Open MPI and MPICH: a rank SIGKILLed after a checkpoint
(its launcher then kills the others and exits non-zero), and the job is
restarted and ends with the uninterrupted run's answer.
"""
from __future__ import annotations

import os
import shutil
import signal
import sys

import psutil
import pytest

from dmtcp_py.coordinator import restarter
from tests.e2e import mpi
from tests.e2e.harness import Computation, ticks, wait_for
from tests.e2e.test_auto_restart import assert_exit_not_restarted

# the parent: runs its worker, says how it ended, fails when it did not
# end well
PARENT = """\
import subprocess, sys
code = subprocess.Popen(sys.argv[1:]).wait()
print(f"worker ended {code}", flush=True)
sys.exit(0 if code == 0 else 1)
"""
WORKER_TICKS = "1000000"   # ends only when it is told to
TICK_MS = "20"


def only_process(name: str) -> psutil.Process:
    """The one process of that name below us (the restored ones are the
    coordinator's descendants)."""
    procs = [p for p in psutil.Process().children(recursive=True) if p.name() == name]
    assert len(procs) == 1, procs
    return procs[0]


def first_checkpoint(comp: Computation) -> None:
    comp.command("-i", "1")
    wait_for(lambda: comp.status()["generation"] >= 1, what="an interval checkpoint")
    # no more: the interval would only slow the recovery down here
    comp.command("-i", "0")
    wait_for(lambda: comp.status()["state"] == "RUNNING", what="the checkpoint to end")


def test_a_worker_killed_by_sigkill_restarts_the_computation(auto, programs, tmp_path):
    parent = tmp_path / "parent.py"
    parent.write_text(PARENT)
    launch, out = auto.launch(sys.executable, str(parent), *programs["counter_single"],
                              WORKER_TICKS, TICK_MS)
    auto.wait_peers(2)
    first_checkpoint(auto)
    worker = only_process("counter_single")
    os.kill(worker.pid, signal.SIGKILL)
    assert launch.wait(timeout=30) == 1    # the parent exited by itself, non-zero
    st = wait_for(lambda: (s := auto.status())["restarts"] >= 1 and s["running"]
                  and s["num_peers"] == 2 and s, timeout=60, what="the automatic restart")
    assert st["last_failure"]["why"] == \
        f"its process counter_single (pid {worker.pid}) was killed by SIGKILL"
    assert st["last_exit"] is None and st["gave_up"] is None
    # the restored worker goes on from the checkpoint, not from the start
    restored = restarter.output_path(auto.port)
    wait_for(lambda: len(ticks(restored)) >= 2, what="the restored worker's ticks")
    assert int(ticks(restored)[0][1]) > 1
    # SIGTERM is how programs end each other: the parent's exit 1 is its own
    os.kill(only_process("counter_single").pid, signal.SIGTERM)
    st = wait_for(lambda: auto.status()["last_exit"], what="the restored program's exit")
    assert st["exit_code"] == 1
    st = auto.status()
    assert st["restarts"] == 1 and st["recovering"] is None
    assert f"pid {worker.pid}" in st["last_failure"]["why"]
    assert "worker ended -15" in restored.read_text()


def test_a_pipeline_and_a_child_its_parent_killed_are_no_failure(auto, tmp_path):
    go = tmp_path / "go"
    stays, _ = auto.launch(sys.executable, "-c", "import time; time.sleep(60)")
    # `yes` dies of SIGPIPE once `head` has its line; the shell SIGKILLs a
    # child of its own (as `timeout -s KILL` would); then it exits 3
    ends, _ = auto.launch("sh", "-c", 'while [ ! -e "$1" ]; do sleep 0.05; done; '
                          'yes | head -n 1 > /dev/null; '
                          'sleep 60 & kill -KILL $!; wait $!; exit 3', "sh", str(go))
    auto.wait_peers(2)
    first_checkpoint(auto)
    go.touch()
    assert_exit_not_restarted(auto, ends, stays)


# ---- an MPI job -----------------------------------------------------------------------------

RANKS, ITERATIONS, PAUSE_US = 3, 400, 20000   # about 8 s of solving


@pytest.fixture
def scratch():
    before = mpi.scratch_entries()
    yield before
    mpi.remove_scratch(before)


@pytest.mark.parametrize("impl", mpi.BOTH, ids=lambda m: m.name)
def test_an_mpi_job_whose_rank_is_killed_heals_itself(scratch, auto, tmp_path, impl):
    # (scratch first: its files go once auto's processes are gone)
    if not shutil.which(impl.mpirun):
        pytest.skip(f"needs {impl.mpirun}")
    exe = mpi.build(impl, tmp_path)
    expected = mpi.reference_checksum(impl, exe, RANKS, ITERATIONS)
    launch, _ = auto.launch(impl.mpirun, *impl.options, "-np", str(RANKS), exe,
                            str(ITERATIONS), str(PAUSE_US), env={**os.environ, **impl.env})
    auto.wait_peers(RANKS + 1)
    first_checkpoint(auto)
    rank = [p for p in psutil.Process().children(recursive=True)
            if p.name() == os.path.basename(exe)][1]
    os.kill(rank.pid, signal.SIGKILL)
    assert launch.wait(timeout=60) != 0
    st = wait_for(lambda: (s := auto.status())["restarts"] >= 1 and s["running"] and s,
                  timeout=90, what="the automatic restart")
    assert f"(pid {rank.pid}) was killed by SIGKILL" in st["last_failure"]["why"]
    st = wait_for(lambda: auto.status()["last_exit"], timeout=120, what="the job's end")
    assert st["exit_code"] == 0
    text = restarter.output_path(auto.port).read_text()
    assert mpi.checksum(text) == expected
