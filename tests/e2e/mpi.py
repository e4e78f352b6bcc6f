"""What the MPI tests share: the two MPI implementations Debian ships, the
solver built with each one's compiler wrapper, its uninterrupted answer,
and the scratch files a job leaves in /tmp and /dev/shm."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

SOLVER = Path(__file__).parent / "programs" / "mpi_solver.c"
SCRATCH = ("/dev/shm", "/tmp")
# a job's own scratch entries: Open MPI's session directory and vader
# segments, MPICH's and UCX's shared-memory files
_SCRATCH_NAME = re.compile(r"^(ompi\.|vader_segment|ucx_|mpich_|shm-col-space|hwloc)")


@dataclass(frozen=True)
class Mpi:
    name: str
    cc: str
    mpirun: str
    options: tuple[str, ...]   # what mpirun needs here (root, 2 cores)
    env: dict


OPENMPI = Mpi("openmpi", "mpicc.openmpi", "mpirun.openmpi", ("--oversubscribe",),
              {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
               # no InfiniBand here: say so instead of probing for it
               "OMPI_MCA_btl": "self,vader,tcp", "OMPI_MCA_pml": "ob1"})
MPICH = Mpi("mpich", "mpicc.mpich", "mpirun.mpich", (), {})
BOTH = (OPENMPI, MPICH)


def build(mpi: Mpi, out: Path) -> str:
    exe = out / f"mpi_solver_{mpi.name}"
    subprocess.run([mpi.cc, "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(exe), str(SOLVER)],
                   check=True)
    return str(exe)


def reference_checksum(mpi: Mpi, exe: str, ranks: int, iterations: int) -> str:
    """The answer of an uninterrupted run, without dmtcp."""
    res = subprocess.run([mpi.mpirun, *mpi.options, "-np", str(ranks), exe, str(iterations)],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, **mpi.env})
    assert res.returncode == 0, res.stderr
    return checksum(res.stdout)


def checksum(text: str) -> str | None:
    found = re.findall(r"^checksum ([0-9a-f]+)$", text, re.M)
    return found[-1] if found else None


def iterations_seen(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"^iter (\d+)$", text, re.M)]


def scratch_entries() -> set[str]:
    out = set()
    for d in SCRATCH:
        try:
            out.update(os.path.join(d, n) for n in os.listdir(d) if _SCRATCH_NAME.match(n))
        except OSError:
            pass
    return out


def remove_scratch(keep: set[str]) -> list[str]:
    """Remove the jobs' scratch entries made since `keep` was taken, as a
    reboot or another host would; returns what was removed."""
    gone = sorted(scratch_entries() - keep)
    for path in gone:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.unlink(path)
            except OSError:
                pass
    return gone
