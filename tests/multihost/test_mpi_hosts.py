"""`dmtcp-launch mpirun --host h2,h3 ...` on h1, with Open MPI and MPICH:
mpirun starts its remote helpers (orted, hydra_pmi_proxy) with ssh, each
test host runs its own sshd, and the ssh is taken over so that the ranks'
hosts join the computation.  Checkpoint while it runs, kill, restart from
the restart script with the ranks' trees mapped onto two other hosts, and
the solver ends with the uninterrupted run's checksum."""
from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import need_root
from tests.e2e import mpi
from tests.e2e.harness import TIMEOUT, wait_for
from tests.multihost.netns import TestNetwork
from tests.multihost.sshd import SshHosts, ssh_cluster

BIN = Path(sys.executable).parent
COORD_PORT = "7779"
RANKS, ITERATIONS, PAUSE_US = 2, 500, 20000
# how each mpirun is told the hosts; the test hosts have no name service,
# so MPICH is told which interface its hosts reach each other on
HOSTS_OPTION = {"openmpi": ("--host", "h2,h3"), "mpich": ("-iface", "eth0", "-hosts", "h2,h3")}


class Cluster:
    def __init__(self, net: TestNetwork, ssh: SshHosts, root: Path, impl: mpi.Mpi) -> None:
        self.net, self.root, self.impl = net, root, impl
        self.head = net.hosts[0]
        self.ckptdir = root / "ckpt"
        self.ckptdir.mkdir(mode=0o700)
        self.env = ssh.env({**os.environ, **impl.env,
                            "DMTCP_COORD_TOKEN": secrets.token_hex(16),
                            "DMTCP_TMPDIR": str(root / "tmp")})
        self.procs: list[subprocess.Popen] = []
        self.popen("coordinator", [BIN / "dmtcp-coordinator", "--listen", self.head.addr,
                                   "-p", COORD_PORT, "--ckptdir", self.ckptdir, "-q"])
        wait_for(lambda: self.command("-s", check=False).returncode == 0, what="the coordinator")

    def popen(self, label: str, argv: list) -> subprocess.Popen:
        out = self.root / f"{len(self.procs):02d}-{label}.out"
        with open(out, "w") as o, open(out.with_suffix(".err"), "w") as e:
            proc = self.head.popen([str(a) for a in argv], stdin=subprocess.DEVNULL,
                                   stdout=o, stderr=e, env=self.env)
        proc.out, proc.err = out, out.with_suffix(".err")
        self.procs.append(proc)
        return proc

    def command(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        res = self.head.run([str(BIN / "dmtcp-command"), "-h", self.head.addr, "-p", COORD_PORT,
                             *args], capture_output=True, text=True, timeout=TIMEOUT, env=self.env)
        if check:
            assert res.returncode == 0, res.stderr
        return res

    def ranks_by_host(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for tree in json.loads(self.command("-l", "--json").stdout)["trees"]:
            ranks = sum(1 for proc in tree["procs"] if proc[1].startswith("mpi_solver"))
            if ranks:
                out[tree["host"]] = out.get(tree["host"], 0) + ranks
        return out


def _last_iteration(path: Path) -> int:
    seen = mpi.iterations_seen(path.read_text())
    return seen[-1] if seen else 0


@pytest.fixture(scope="module")
def solvers(tmp_path_factory):
    need_root()
    out = tmp_path_factory.mktemp("mpi")
    return {m.name: mpi.build(m, out) for m in mpi.BOTH}


@pytest.fixture
def cluster_for(tmp_path):
    need_root()
    scratch = mpi.scratch_entries()
    with ssh_cluster(5, tmp_path, Cluster) as new:
        yield new
    mpi.remove_scratch(scratch)


@pytest.mark.parametrize("impl", mpi.BOTH, ids=lambda m: m.name)
def test_mpi_job_across_hosts_moves_to_other_hosts(cluster_for, solvers, impl):
    exe = solvers[impl.name]
    expected = mpi.reference_checksum(impl, exe, RANKS, ITERATIONS)
    c = cluster_for(impl)
    job = c.popen("launch", [BIN / "dmtcp-launch", "--join", "-h", c.head.addr, "-p", COORD_PORT,
                             "--ckptdir", c.ckptdir, impl.mpirun, *impl.options,
                             *HOSTS_OPTION[impl.name], "-np", str(RANKS), exe,
                             str(ITERATIONS), str(PAUSE_US)])
    wait_for(lambda: _last_iteration(job.out) >= 100, what="iteration 100")
    before = _last_iteration(job.out)
    c.command("-bc")
    assert c.ranks_by_host() == {"h2": 1, "h3": 1}
    resumed = _last_iteration(job.out)
    wait_for(lambda: _last_iteration(job.out) >= resumed + 50, what="iterations after the checkpoint")
    c.command("-k")
    assert job.wait(timeout=TIMEOUT) != 0
    killed = _last_iteration(job.out)
    assert killed < ITERATIONS, "the job ended before it was killed"
    images = sorted(c.ckptdir.glob("ckpt_*.dmtcp"))
    hosts = sorted(json.loads((i / "manifest.json").read_text())["host"] for i in images)
    assert hosts == ["h1", "h2", "h3"], hosts

    restart = c.popen("restart", [c.ckptdir / "dmtcp_restart_script.sh", "-h", c.head.addr,
                                  "-p", COORD_PORT, "--map", "h2=h4", "--map", "h3=h5"])
    wait_for(lambda: c.ranks_by_host() == {"h4": 1, "h5": 1} or restart.poll() is not None,
             what="the ranks on h4 and h5")
    # what the job computed: it went on from the checkpoint, to the right answer
    wait_for(lambda: mpi.checksum(restart.out.read_text()) or restart.poll() is not None,
             timeout=TIMEOUT * 2, what="the restarted job's answer")
    text = restart.out.read_text()
    seen = mpi.iterations_seen(text)
    assert seen and before < seen[0] <= killed + 50, (before, seen[:3], killed)
    assert mpi.checksum(text) == expected, text[-300:] + restart.err.read_text()
    assert "trees of h2 restart on h4" in restart.err.read_text()
    try:
        code = restart.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        # UCX's race in MPI_Finalize, caught live twice (README, known
        # limits): the ranks' trees are in PID namespaces of their own, so
        # UCX joins them by TCP (natively here: shared memory); at MPI_Finalize
        # each rank closes its endpoint with a remote flush, a zero-length PUT
        # the peer must answer, and a rank whose own close completed first
        # has left for the PMI barrier when the other's PUT comes (found
        # unread in its socket).  The job is done and right; it never exits.
        pytest.xfail("known defect of UCX over TCP: a rank that closed first never "
                     "answers the other's flush at MPI_Finalize")
    assert code == 0, restart.err.read_text()
