"""Jobs under Slurm on the local test cluster (scripts/slurm-cluster.sh, 3
nodes): examples/slurm/requeue.sbatch, an MPI job across 2 nodes whose
mpirun starts its daemon with srun (taken over), runs under `dmtcp-slurm
run`, is checkpointed and requeued at its time limit, and ends with the
right answer; a checkpoint on demand (`scancel --batch --signal=...`); a
node drained between two runs, whose trees restart on another node, after
a SIGTERM to every process of the job (as before a preemption); srun's
tasks and exit status."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import reap_zombies
from tests.multihost.slurm import CONF, ROOT, cluster_up

EXAMPLE = ROOT / "examples" / "slurm" / "requeue.sbatch"
NODES = 3
TIMEOUT = 600.0  # a safety net only (the example needs several 1-minute runs)
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
         "BOOT_FAIL", "DEADLINE", "PREEMPTED")


@pytest.fixture(scope="module")
def cluster():
    with cluster_up(NODES, needs=("mpicc.openmpi",)):
        yield


def _build(cc: str, out: Path) -> Path:
    subprocess.run([cc, "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(out),
                    str(EXAMPLE.parent / "mpi_chain.c")], check=True)
    return out


@pytest.fixture(scope="module")
def mpi_chain(tmp_path_factory):
    return _build("mpicc.openmpi", tmp_path_factory.mktemp("mpi_chain") / "mpi_chain")


class Job:
    """One submission of the example, its files under tmp_path; removes
    every process it made (by the job directory in their environment)."""

    def __init__(self, tmp_path: Path, exe: Path, steps: int, ms: int, *sbatch: str,
                 mpirun: str | None = None) -> None:
        self.dir = tmp_path / "job"
        self.out = tmp_path / "job.out"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "DMTCP_"))}
        self.env.update(SLURM_CONF=str(CONF), MPI_CHAIN_EXE=str(exe), MPI_CHAIN_STEPS=str(steps),
                        MPI_CHAIN_MS=str(ms), DMTCP_JOB_DIR=str(self.dir))
        if mpirun:
            self.env["MPIRUN"] = mpirun
        res = self.slurm("sbatch", "--parsable", f"--output={self.out}", *sbatch, str(EXAMPLE))
        self.id = res.stdout.strip().split(";")[0]

    def slurm(self, *argv: str) -> subprocess.CompletedProcess:
        res = subprocess.run(argv, capture_output=True, text=True, env=self.env, cwd=ROOT,
                             timeout=60, check=False)
        assert res.returncode == 0, f"{' '.join(argv)}: {res.stderr}"
        return res

    def show(self) -> dict[str, str]:
        text = self.slurm("scontrol", "-o", "show", "job", self.id).stdout
        return dict(f.split("=", 1) for f in text.split() if "=" in f)

    def text(self) -> str:
        try:
            return self.out.read_text()
        except FileNotFoundError:
            return ""

    def wait_for(self, what: str, cond, timeout: float = TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            reap_zombies()
            state = self.show().get("JobState")
            assert state not in ENDED or cond(), \
                f"job {self.id} {state} before {what}:\n{self.text()[-2000:]}"
            assert time.monotonic() < deadline, f"no {what}:\n{self.text()[-2000:]}"
            time.sleep(0.5)

    def step_seen(self) -> int:
        steps = re.findall(r"^step (\d+) of", self.text(), re.M)
        return int(steps[-1]) if steps else -1

    def wait_ended(self) -> dict[str, str]:
        self.wait_for("its end", lambda: self.show().get("JobState") in ENDED)
        return self.show()

    def signal(self, name: str, every_process: bool = False) -> None:
        """To the batch shell (dmtcp-slurm), or as a preemption does, to
        every process of the job's steps (--full)."""
        self.slurm("scancel", "--full" if every_process else "--batch", f"--signal={name}", self.id)

    def cleanup(self) -> None:
        subprocess.run(["scancel", self.id], env=self.env, capture_output=True, check=False)
        marker = f"DMTCP_TMPDIR={self.dir}/tmp".encode()
        for proc in psutil.process_iter():
            try:
                if marker in Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0"):
                    os.kill(proc.pid, signal.SIGKILL)
            except (OSError, psutil.Error):
                pass
        reap_zombies()


@pytest.fixture
def job(cluster, mpi_chain, tmp_path):
    made: list[Job] = []

    def submit(steps: int, ms: int, *sbatch: str, exe: Path | None = None,
               mpirun: str | None = None) -> Job:
        made.append(Job(tmp_path, exe or mpi_chain, steps, ms, *sbatch, mpirun=mpirun))
        return made[-1]

    try:
        yield submit
    finally:
        for j in made:
            j.cleanup()


def _result_ok(text: str) -> None:
    results = [line for line in text.splitlines() if line.startswith("RESULT")]
    assert len(results) == 1 and results[0].startswith("RESULT OK "), text[-2000:]


def test_example_outlives_its_time_limit(job):
    # 130 s of computation, 2-minute runs warned 60 to 90 s before their
    # end (Slurm looks every 30 s): at most 60 s of progress a run, so at
    # least 3 runs
    j = job(1300, 100)
    shown = j.wait_ended()
    text = j.text()
    assert shown["JobState"] == "COMPLETED", text[-2000:]
    assert int(shown["Restarts"]) >= 2, text[-2000:]
    _result_ok(text)
    assert "rank 1 of 2 on h" in text
    assert text.count("SIGUSR1: checkpoint, then requeue") == int(shown["Restarts"])
    assert "the program exited with status 0 after" in text
    # every checkpoint's images and restart script are the job's, and private
    ckpt = j.dir / "ckpt"
    assert (ckpt / "dmtcp_restart_script.sh").exists()
    assert ckpt.stat().st_mode & 0o777 == 0o700


def test_checkpoint_on_demand(job):
    j = job(400, 100, "--time=10")
    j.wait_for("step 30", lambda: j.step_seen() >= 30)
    j.signal("USR2")  # checkpoint and go on
    j.wait_for("the checkpoint", lambda: "checkpoint 1 done" in j.text())
    assert j.show()["Restarts"] == "0"
    at = j.step_seen()
    j.wait_for("steps after the checkpoint", lambda: j.step_seen() >= at + 20)
    j.signal("USR1")  # checkpoint, stop, requeue
    shown = j.wait_ended()
    text = j.text()
    assert shown["JobState"] == "COMPLETED", text[-2000:]
    assert shown["Restarts"] == "1"
    assert "SIGUSR2: checkpoint\n" in text and "SIGUSR1: checkpoint, then requeue" in text
    assert re.search(r"checkpoint 2 done: 2 trees, .*computation stopped", text), text[-2000:]
    assert "requeue 1: restarting on" in text
    _result_ok(text)


def test_drained_node_is_replaced(job):
    j = job(400, 100, "--time=10")
    j.wait_for("step 30", lambda: j.step_seen() >= 30)
    batch_host = j.show()["BatchHost"]
    before = j.slurm("scontrol", "show", "hostnames", j.show()["NodeList"]).stdout.split()
    drained = next(n for n in before if n != batch_host)
    j.slurm("scontrol", "update", f"nodename={drained}", "state=drain", "reason=dmtcp-test")
    try:
        # as before a preemption: SIGTERM to every process of the job
        j.signal("TERM", every_process=True)
        shown = j.wait_ended()
    finally:
        j.slurm("scontrol", "update", f"nodename={drained}", "state=resume")
    text = j.text()
    assert shown["JobState"] == "COMPLETED", text[-2000:]
    after = j.slurm("scontrol", "show", "hostnames", shown["NodeList"]).stdout.split()
    assert drained not in after
    spare = next(n for n in after if n not in before)
    assert f"trees of {drained} restart on {spare}" in text, text[-2000:]
    assert f"rank 1 of 2 on {drained}" in text
    assert "SIGTERM: checkpoint, then requeue" in text
    _result_ok(text)


def test_mpich_job_is_requeued(job, tmp_path):
    # hydra starts a proxy on every node, the job script's own too, with
    # srun; the test nodes have no name service: -iface
    exe = _build("mpicc.mpich", tmp_path / "mpi_chain_mpich")
    j = job(300, 100, "--time=10", exe=exe, mpirun="mpirun.mpich -iface eth0")
    j.wait_for("step 50", lambda: j.step_seen() >= 50)
    j.signal("USR1")
    shown = j.wait_ended()
    text = j.text()
    assert shown["JobState"] == "COMPLETED" and shown["Restarts"] == "1", text[-2000:]
    assert re.search(r"checkpoint 1 done: 3 trees", text), text[-2000:]
    _result_ok(text)


def test_srun_tasks_join_and_report(cluster, tmp_path):
    # `srun` as the launched program itself (dmtcp-launch takes it over)
    out = tmp_path / "srun.out"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "DMTCP_"))}
    env["SLURM_CONF"] = str(CONF)
    bin_dir = Path(sys.executable).parent
    wrap = (f"exec {bin_dir}/dmtcp-slurm run --dir {tmp_path}/job -- srun -N2 /bin/sh -c "
            "'echo task $SLURM_PROCID of $SLURM_NTASKS on $(hostname); exit $SLURM_PROCID'")
    res = subprocess.run(["sbatch", "--parsable", "-N2", f"--output={out}", "--wrap", wrap],
                         capture_output=True, text=True, env=env, timeout=60, check=True)
    job_id = res.stdout.strip().split(";")[0]
    try:
        deadline = time.monotonic() + 120
        while True:
            text = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True,
                                  text=True, env=env, timeout=60, check=True).stdout
            state = dict(f.split("=", 1) for f in text.split() if "=" in f)
            if state["JobState"] in ENDED:
                break
            assert time.monotonic() < deadline, out.read_text()
            time.sleep(0.5)
        lines = out.read_text().splitlines()
        nodes = subprocess.run(["scontrol", "show", "hostnames", state["NodeList"]],
                               capture_output=True, text=True, env=env, timeout=60,
                               check=True).stdout.split()
        assert sorted(line for line in lines if line.startswith("task ")) == \
            [f"task 0 of 2 on {nodes[0]}", f"task 1 of 2 on {nodes[1]}"], lines
        # srun's status: the highest of its tasks'
        assert state["JobState"] == "FAILED" and state["ExitCode"] == "1:0", lines
        assert "the program exited with status 1" in out.read_text()
    finally:
        subprocess.run(["scancel", job_id], env=env, capture_output=True, check=False)
        reap_zombies()


def test_outside_a_job_is_one_line_and_no_traceback(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "DMTCP_"))}
    bin_dir = Path(sys.executable).parent
    res = subprocess.run([str(bin_dir / "dmtcp-slurm"), "run", "--dir", str(tmp_path), "--",
                          "true"], capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 1
    assert res.stderr.count("\n") == 1 and "not in a Slurm job" in res.stderr
    res = subprocess.run([str(bin_dir / "dmtcp-slurm"), "run", "--signal", "NOPE", "--", "true"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "NOPE" in res.stderr
    # dmtcp-srun outside an allocation, with a coordinator to join
    res = subprocess.run([str(bin_dir / "dmtcp-srun"), "srun", "-N2", "hostname"],
                         capture_output=True, text=True, timeout=60,
                         env={**env, "DMTCP_COORD_PORT": "7779"})
    assert res.returncode == 1 and res.stderr.count("\n") == 1
    assert "outside a Slurm allocation" in res.stderr
