"""The Slurm test cluster (scripts/slurm-cluster.sh): its nodes are the
namespace hosts, jobs run on them, and `down` leaves nothing behind."""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import need_root, reap_zombies
from tests.multihost.slurm import CONF, STATE, clear_stale, taking_turns, cluster_up
from tests.multihost.slurm import script as _script
from tests.multihost.netns import NETNS_DIR, RUN_BASE

VETH = "dmtcp-slurm"
DAEMONS = {"munged", "slurmctld", "slurmd", "slurmstepd"}
TIMEOUT = 60.0  # a safety net only, nothing is timed


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["SLURM_CONF"] = str(CONF)
    return env


def _slurm(*argv: str) -> subprocess.CompletedProcess:
    res = subprocess.run(argv, capture_output=True, text=True, env=_env(), timeout=TIMEOUT,
                         check=False)
    assert res.returncode == 0, f"{' '.join(argv)}: {res.stderr}"
    return res


@pytest.fixture
def cluster():
    with cluster_up(2):
        yield


def test_srun_runs_a_task_on_each_node(cluster):
    res = _slurm("srun", "-N2", "hostname")
    assert sorted(res.stdout.split()) == ["h1", "h2"]


def test_a_batch_job_completes(cluster, tmp_path):
    out = tmp_path / "job.out"
    job = _slurm("sbatch", "--parsable", "-o", str(out), "--wrap", "hostname").stdout.strip()
    deadline = time.monotonic() + TIMEOUT
    while True:
        shown = _slurm("scontrol", "-o", "show", "job", job).stdout
        state = next(f for f in shown.split() if f.startswith("JobState=")).split("=", 1)[1]
        if state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
            break
        assert time.monotonic() < deadline, f"job {job} still {state}"
        time.sleep(0.1)
    assert state == "COMPLETED", shown
    assert out.read_text().strip() in ("h1", "h2")


def _records() -> list[tuple[str, int, int]]:
    """(name, pid, start time) of every process the script recorded."""
    rows = [line.split() for line in (STATE / "pids").read_text().splitlines()]
    return [(name, int(pid), int(start)) for _, name, pid, start in rows]


def _start_time(pid: int) -> int | None:
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (psutil.Error, OSError):
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def _cluster_processes() -> list[str]:
    """Live processes of a cluster: its daemons below us (they are orphaned
    to this subreaper) or anything that names the cluster's files."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and proc.name() in DAEMONS:
                found.append(f"{proc.pid} {proc.name()}")
        except psutil.Error:
            pass
    for proc in psutil.process_iter(["cmdline", "status"]):
        if proc.info["status"] != psutil.STATUS_ZOMBIE \
                and str(STATE) in " ".join(proc.info["cmdline"] or ()):
            found.append(f"{proc.pid} {' '.join(proc.info['cmdline'])}")
    return found


def test_down_leaves_nothing_behind(cluster):
    records = _records()
    holder = next((pid, start) for name, pid, start in records if name == "netns")
    prefix = f"dmtcp-th-{holder[0]}-{holder[1]}-slurm"
    assert {name for name, _, _ in records} == {"munged", "netns", "slurmctld", "h1", "h2"}
    assert (NETNS_DIR / f"{prefix}-h1").exists()  # what the checks below look for

    res = _script("down")
    assert res.returncode == 0, res.stderr
    reap_zombies()

    alive = [(name, pid) for name, pid, start in records if _start_time(pid) == start]
    assert alive == []
    assert _cluster_processes() == []
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                            check=True).stdout
    assert [line for line in listed.splitlines() if line.startswith(prefix)] == []
    assert not NETNS_DIR.is_dir() or [n for n in os.listdir(NETNS_DIR) if n.startswith(prefix)] == []
    assert [n for n in os.listdir(RUN_BASE) if n.startswith(prefix)] == []
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    assert [m for m in mounts if prefix in m or str(STATE) in m] == []
    link = subprocess.run(["ip", "link", "show", VETH], capture_output=True, check=False)
    assert link.returncode != 0
    assert not STATE.exists()


def test_a_killed_runs_leftovers_are_cleared_first():
    """What a test run killed mid-cluster leaves (its daemons gone, its
    state directory not) does not stop the next one: it is taken down."""
    need_root()
    with taking_turns():  # (no other test run uses the cluster meanwhile)
        clear_stale()  # (one up by hand: fails in CI, skips elsewhere)
        gone = subprocess.Popen(["true"])
        start = _start_time(gone.pid)
        gone.wait()
        STATE.mkdir(mode=0o755)
        try:
            (STATE / "pids").write_text(f"daemon munged {gone.pid} {start or 1}\n")
            clear_stale()
            assert not STATE.exists()
        finally:
            shutil.rmtree(STATE, ignore_errors=True)
