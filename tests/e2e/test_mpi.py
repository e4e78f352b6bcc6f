"""`dmtcp-launch mpirun -np 3 ./solver` with Open MPI and with MPICH, as
Debian ships them: checkpoint while it runs, kill it, remove the job's
scratch files (session directory, shared-memory segments) as a reboot
would, restart from the restart script, checkpoint the restarted job again,
and the solver ends with the uninterrupted run's checksum.  Open MPI's job
also with --precopy: its ranks (shared-memory transport, TCP to mpirun)
pre-dumped while they solve."""
from __future__ import annotations

import os

import pytest

from tests.e2e import mpi
from tests.e2e.harness import TIMEOUT, agent_log, wait_for

RANKS, ITERATIONS, PAUSE_US = 3, 600, 20000  # about 12 s of solving


@pytest.fixture(scope="module")
def solvers(tmp_path_factory):
    out = tmp_path_factory.mktemp("mpi")
    return {m.name: mpi.build(m, out) for m in mpi.BOTH}


@pytest.fixture
def scratch():
    """The jobs' scratch files: whatever a test's jobs leave is removed."""
    before = mpi.scratch_entries()
    yield before
    mpi.remove_scratch(before)


def _last_iteration(path) -> int:
    seen = mpi.iterations_seen(path.read_text())
    return seen[-1] if seen else 0


@pytest.mark.parametrize("impl, precopy", [(m, False) for m in mpi.BOTH] + [(mpi.OPENMPI, True)],
                         ids=lambda v: v.name if isinstance(v, mpi.Mpi) else
                         "precopy" if v else "whole")
def test_mpi_job_restarts_and_gets_the_uninterrupted_answer(comp, solvers, scratch, impl,
                                                            precopy):
    exe = solvers[impl.name]
    expected = mpi.reference_checksum(impl, exe, RANKS, ITERATIONS)
    env = {**os.environ, **impl.env}
    proc, out = comp.launch(*(["--precopy"] if precopy else []), impl.mpirun, *impl.options,
                            "-np", str(RANKS), exe, str(ITERATIONS), str(PAUSE_US), env=env)
    comp.wait_peers(RANKS + 1)  # the ranks and at least mpirun
    wait_for(lambda: _last_iteration(out) >= 100, what="iteration 100")
    before = _last_iteration(out)
    comp.checkpoint()
    if precopy:
        assert "generation 1: pre-copied" in agent_log(comp)
    listing = comp.command("-l").stdout
    assert listing.count("mpi_solver_") == RANKS, listing
    assert all(f"rank {r}" in listing for r in range(RANKS)), listing
    resumed = _last_iteration(out)
    wait_for(lambda: _last_iteration(out) >= resumed + 50, what="iterations after the checkpoint")
    assert comp.kill_and_wait(proc) != 0
    killed = _last_iteration(out)
    assert killed < ITERATIONS, "the job ended before it was killed"
    removed = mpi.remove_scratch(scratch)
    # MPICH removes its segments' names itself once mapped (the image holds
    # them as removed files); Open MPI's session directory stays behind
    assert removed or impl is not mpi.OPENMPI, "Open MPI left no session directory"

    restarted, rout = comp.restart()
    comp.wait_peers(RANKS + 1)
    wait_for(lambda: _last_iteration(rout) >= killed + 50, what="iterations after the restart")
    comp.checkpoint()  # a second cycle: the restarted job checkpoints and goes on
    assert restarted.wait(timeout=TIMEOUT) == 0, restarted.err_path.read_text()
    text = rout.read_text()
    seen = mpi.iterations_seen(text)
    # it went on from the checkpoint, never from the start
    assert before < seen[0] <= killed + 50, (before, seen[:3], killed)
    assert seen == list(range(seen[0], ITERATIONS + 1, 50)), "iterations lost or repeated"
    assert mpi.checksum(text) == expected
