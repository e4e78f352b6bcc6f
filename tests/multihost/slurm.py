"""The local Slurm test cluster (scripts/slurm-cluster.sh) for the tests
that need one: up for a test or a module, down afterwards, also on failure."""
from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import need_root, reap_zombies

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "slurm-cluster.sh"
STATE = Path("/run/dmtcp-slurm")  # fixed by the script, documented in README
CONF = STATE / "slurm.conf"
# Held by a test for as long as it uses the cluster: STATE is one per
# machine, so test runs from two clones take turns instead of failing.
USE_LOCK = Path("/run/lock/dmtcp-slurm-tests.lock")
USE_LOCK_WAIT = 900.0  # seconds; another run's Slurm tests take a few minutes


def script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=120, check=False)


@contextlib.contextmanager
def taking_turns():
    """The machine's Slurm test cluster for this test alone, once no other
    test run uses it."""
    USE_LOCK.parent.mkdir(mode=0o755, exist_ok=True)
    fd = os.open(USE_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        deadline = time.monotonic() + USE_LOCK_WAIT
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    pytest.fail(f"another test run held the Slurm test cluster ({USE_LOCK}) "
                                f"for {USE_LOCK_WAIT:.0f}s")
                time.sleep(0.5)
        yield
    finally:
        os.close(fd)  # releases the lock; the empty file stays, as lock files do


def clear_stale() -> None:
    """A cluster left by a run that was killed (nothing it recorded runs
    any more) is taken down; one whose daemons still run is someone's."""
    if not STATE.exists():
        return
    status = script("status")
    if " running (pid " not in status.stdout:
        res = script("down")
        assert res.returncode == 0, f"a stale Slurm test cluster would not go: {res.stderr}"
        return
    if os.environ.get("CI"):
        pytest.fail(f"a Slurm test cluster is already up ({STATE})")
    pytest.skip(f"a Slurm test cluster is already up ({STATE}); run down first")


@contextlib.contextmanager
def cluster_up(nodes: int, needs: tuple[str, ...] = ()):
    """A cluster of `nodes` compute nodes; the commands in `needs` (and
    Slurm's own) must be installed: in CI a missing one or a cluster up by
    hand fails the test, elsewhere it skips it."""
    need_root()
    missing = [c for c in ("slurmctld", "slurmd", "srun", "munged", *needs)
               if shutil.which(c) is None]
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"{', '.join(missing)} missing: scripts/setup.sh installs them")
        pytest.skip(f"needs {', '.join(missing)} (scripts/setup.sh installs them)")
    with taking_turns():
        clear_stale()
        try:
            res = script("up", str(nodes))
            assert res.returncode == 0, res.stderr
            yield
        finally:
            res = script("down")
            reap_zombies()
            assert res.returncode == 0, res.stderr
