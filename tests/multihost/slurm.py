"""The local Slurm test cluster (scripts/slurm-cluster.sh) for the tests
that need one: up for a test or a module, down afterwards, also on failure."""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import need_root, reap_zombies

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "slurm-cluster.sh"
STATE = Path("/run/dmtcp-slurm")  # fixed by the script, documented in README
CONF = STATE / "slurm.conf"


def script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=120, check=False)


@contextlib.contextmanager
def cluster_up(nodes: int, needs: tuple[str, ...] = ()):
    """A cluster of `nodes` compute nodes; the commands in `needs` (and
    Slurm's own) must be installed: in CI a missing one or a cluster
    already up fails the test, elsewhere it skips it."""
    need_root()
    missing = [c for c in ("slurmctld", "slurmd", "srun", "munged", *needs)
               if shutil.which(c) is None]
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"{', '.join(missing)} missing: scripts/setup.sh installs them")
        pytest.skip(f"needs {', '.join(missing)} (scripts/setup.sh installs them)")
    if STATE.exists():
        if os.environ.get("CI"):
            pytest.fail(f"a Slurm test cluster is already up ({STATE})")
        pytest.skip(f"a Slurm test cluster is already up ({STATE}); run down first")
    try:
        res = script("up", str(nodes))
        assert res.returncode == 0, res.stderr
        yield
    finally:
        res = script("down")
        reap_zombies()
        assert res.returncode == 0, res.stderr
