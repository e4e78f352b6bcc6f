"""Self-healing across hosts (README, "Computations that heal themselves"):
the coordinator has a host of its own (h1) and is started with
--auto-restart, interval checkpoints and --hosts h2,h3,h4,h5 (h5 runs
nothing: the spare).  Every host has sshd, so the recovery's restart
reaches the other hosts over ssh as the restart script does, and private
checkpoint storage (netns.py: a tmpfs of its own at the same path), so each
tree's images are on its own host only.

A ring of three trees on h2, h3, h4 whose program on h3 is SIGKILLed comes
back by itself and runs to its end with every byte exactly once; an Open
MPI job across h2, h3, h4 whose mpirun is SIGKILLed comes back and ends
with the uninterrupted run's answer; a whole host killed with its storage
needs copies of the images elsewhere (--replicas)."""
from __future__ import annotations

import getpass
import json
import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.conftest import need_root, reap_zombies
from tests.e2e import mpi
from tests.e2e.harness import TIMEOUT, ticks, wait_for
from tests.multihost.netns import TestNetwork
from tests.multihost.sshd import SshHosts, ssh_cluster

BIN = Path(sys.executable).parent
PROGRAM = Path(__file__).parent.parent / "e2e" / "programs" / "net_stream.c"
COORD_PORT, RING_PORT = "7779", "5000"
TICKS, TICK_MS = 400, 50       # ~20 s of ring: longer than a checkpoint and a recovery
RANKS, ITERATIONS, PAUSE_US = 3, 1000, 20000
HEAL_TIMEOUT = 120.0


class Healing:
    """The coordinator on h1 with --auto-restart; every host's checkpoint
    directory on its private storage, at the same path."""

    def __init__(self, net: TestNetwork, ssh: SshHosts, root: Path, *options: str,
                 env: dict | None = None) -> None:
        self.net, self.root = net, root
        self.head = net.hosts[0]
        self.ckptdir = net.storage / "ckpt"
        for host in net.hosts:
            host.run(["mkdir", "-m", "0700", str(self.ckptdir)], check=True, timeout=TIMEOUT)
        tmp = root / "tmp"
        self.env = ssh.env({**os.environ, **(env or {}),
                            "DMTCP_COORD_TOKEN": secrets.token_hex(16), "DMTCP_TMPDIR": str(tmp)})
        self.run_dir = tmp / f"dmtcp-{getpass.getuser()}@{self.head.name}"
        self.procs: list[subprocess.Popen] = []
        self.coordinator = self.popen(self.head, "coordinator", [
            BIN / "dmtcp-coordinator", "--listen", self.head.addr, "-p", COORD_PORT,
            "--ckptdir", self.ckptdir, *self.policy(net), "-q", *options])
        wait_for(lambda: self.command("-s", check=False).returncode == 0, what="the coordinator")

    @staticmethod
    def policy(net: TestNetwork) -> list[str]:
        """The coordinator's options for healing (h1 has the coordinator)."""
        return ["--auto-restart", "--interval", "2",
                "--hosts", ",".join(h.name for h in net.hosts[1:])]

    def popen(self, host, label: str, argv: list) -> subprocess.Popen:
        out = self.root / f"{len(self.procs):02d}-{label}-{host.name}.out"
        with open(out, "w") as o, open(out.with_suffix(".err"), "w") as e:
            proc = host.popen([str(a) for a in argv], stdin=subprocess.DEVNULL,
                              stdout=o, stderr=e, env=self.env)
        proc.out, proc.err, proc.host_name = out, out.with_suffix(".err"), host.name
        self.procs.append(proc)
        return proc

    def launch(self, host, label: str, *argv) -> subprocess.Popen:
        return self.popen(host, label, [BIN / "dmtcp-launch", "--join", "-h", self.head.addr,
                                        "-p", COORD_PORT, "--ckptdir", self.ckptdir, *argv])

    def command(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        res = self.head.run([str(BIN / "dmtcp-command"), "-h", self.head.addr, "-p", COORD_PORT,
                             *args], capture_output=True, text=True, timeout=TIMEOUT, env=self.env)
        if check:
            assert res.returncode == 0, res.stderr
        return res

    def status(self) -> dict:
        return json.loads(self.command("-s", "--json").stdout)

    def trees(self) -> list[dict]:
        return json.loads(self.command("-l", "--json").stdout)["trees"]

    def log(self) -> str:
        return (self.run_dir / f"coordinator-{COORD_PORT}.log").read_text(errors="replace")

    @property
    def recovery_out(self) -> Path:
        """Where the recovery's restart command, and the programs it
        restores, write (on the coordinator's host)."""
        return self.run_dir / f"recovery-{COORD_PORT}.out"

    def images(self, host) -> list[str]:
        """The image directories in host's own checkpoint directory."""
        res = host.run(["ls", "-A", str(self.ckptdir)], capture_output=True, text=True,
                       timeout=TIMEOUT)
        return sorted(n for n in res.stdout.split() if n.startswith("ckpt_"))

    def checkpointed_all(self, trees: int) -> dict | None:
        """Status once a checkpoint of `trees` trees has completed and no
        round runs (interval checkpoints come and go)."""
        st = self.status()
        done = st["last_checkpoint"]
        return st if done and done["ok"] and done["trees"] == trees and st["running"] else None

    def stop_interval_checkpoints(self) -> None:
        """No more checkpoints: the ring streams hundreds of MB between two,
        and one that meets a program's shutdown(SHUT_WR) with bytes in
        flight fails (README, known limits)."""
        self.command("-i", "0")
        wait_for(lambda: self.status()["running"], what="the checkpoint under way to end")

    def healed(self, restarts: int, peers: int | None = None) -> dict:
        """Status once `restarts` recoveries ended RUNNING (and, given
        peers, the computation runs with that many processes)."""
        def done():
            st = self.status()
            if st["restarts"] < restarts or st["recovering"] is not None:
                return None
            return st if peers is None or (st["running"] and st["num_peers"] == peers) else None
        return wait_for(done, timeout=HEAL_TIMEOUT, what=f"{restarts} automatic restart(s)")


def pid_of(trees: list[dict], host: str, names: tuple[str, ...]) -> int:
    """The pid of the one process called one of names on host, from the
    coordinator's listing (checked against the live process)."""
    found = [row[0] for t in trees if t["host"] == host for row in t["procs"]
             if row[1] in names]
    assert len(found) == 1, (host, names, trees)
    assert psutil.Process(found[0]).name() in names
    return found[0]


def five_hosts(tmp_path: Path, make: type[Healing]):
    """new(*coordinator options, env=...) -> make(...), on five hosts with
    sshd and private storage; MPI's scratch files it leaves are removed."""
    need_root()
    storage = tmp_path / "storage"
    storage.mkdir()
    scratch = mpi.scratch_entries()
    with ssh_cluster(5, tmp_path, make, storage=storage) as new:
        yield new
    mpi.remove_scratch(scratch)


@pytest.fixture
def healing(tmp_path):
    """healing(*coordinator options, env=...) -> Healing, on five hosts."""
    yield from five_hosts(tmp_path, Healing)


@pytest.fixture(scope="module")
def net_stream(tmp_path_factory) -> str:
    need_root()
    exe = tmp_path_factory.mktemp("ring") / "net_stream"
    subprocess.run(["cc", "-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-pthread",
                    "-o", str(exe), str(PROGRAM)], check=True)
    return str(exe)


def start_ring(h: Healing, exe: str, hosts: list) -> list[subprocess.Popen]:
    members = []
    for i, host in enumerate(hosts):
        nxt = hosts[(i + 1) % len(hosts)]
        members.append(h.launch(host, "ring", exe, "ring", host.addr, RING_PORT, nxt.addr,
                                str(TICKS), str(TICK_MS)))
    wait_for(lambda: h.status()["num_peers"] == len(hosts)
             and all(last(p.out) >= 10 for p in members), what="the ring to run")
    return members


def last(path: Path) -> int:
    rows = [r for r in ticks(path) if r[0] == "tick"]
    return int(rows[-1][1]) if rows else 0


def assert_ring_finished(h: Healing, resumed_after: int) -> None:
    """The three restored programs ran to their end, each finding every
    counter in sequence (a FAIL line, and exit 3, otherwise), from where
    the checkpoint left them (not from the start)."""
    out = h.recovery_out
    done = wait_for(lambda: len([r for r in ticks(out) if r[0] == "done"]) == 3 and
                    [r for r in ticks(out) if r[0] == "done"], timeout=HEAL_TIMEOUT,
                    what="the end of the restored ring")
    text = out.read_text(errors="replace")
    assert "FAIL" not in text, text[-2000:]
    assert all(r[:3] == ["done", str(TICKS), "ring"] for r in done), done
    restored = [int(r[1]) for r in ticks(out) if r[0] == "tick"]
    assert restored and min(restored) > resumed_after, (resumed_after, restored[:5])


def no_wrong_bytes(procs) -> None:
    """No counter out of sequence in what the original programs received
    (one whose neighbour was killed may fail on the broken connection
    before its own agent kills it: that is no wrong byte)."""
    for proc in procs:
        err = proc.err.read_text(errors="replace")
        assert "got counter" not in err, err


def test_a_ring_across_hosts_heals_itself(healing, net_stream):
    h = healing()
    hosts = h.net.hosts
    members = start_ring(h, net_stream, hosts[1:4])
    first = min(last(p.out) for p in members)
    wait_for(lambda: h.checkpointed_all(3), what="an interval checkpoint of the three trees")
    h.stop_interval_checkpoints()
    for host in hosts[1:4]:
        assert len(h.images(host)) == 1, host.name  # its own tree's, on its own storage
    assert h.images(hosts[4]) == []
    victim = pid_of(h.trees(), "h3", ("net_stream",))
    os.kill(victim, signal.SIGKILL)
    st = h.healed(1, 3)
    assert st["last_failure"]["host"] == "h3" and "SIGKILL" in st["last_failure"]["why"], st
    assert st["gave_up"] is None and st["time_lost"] > 0
    assert sorted(t["host"] for t in h.trees()) == ["h2", "h3", "h4"]
    for proc in members:
        proc.wait(timeout=TIMEOUT)
    no_wrong_bytes(members)
    assert_ring_finished(h, first)
    log = h.log()
    assert "recovery: lost net_stream@h3" in log and "recovery: running again" in log, log
    text = h.recovery_out.read_text(errors="replace")
    for name in ("h2", "h3", "h4"):  # each over ssh, as the restart script does
        assert f"trees of {name} restart on {name}" in text, text[-2000:]


@pytest.fixture(scope="module")
def solver(tmp_path_factory) -> str:
    need_root()
    return mpi.build(mpi.OPENMPI, tmp_path_factory.mktemp("mpi"))


def test_an_mpi_job_across_hosts_heals_itself(healing, solver):
    """mpirun on h2 (with rank 0), orted and a rank on h3 and on h4, each a
    tree.  mpirun SIGKILLed: the orteds end by themselves (an exit, no
    failure), mpirun's tree is lost, and all three trees come back from the
    checkpoint, each on its host, over ssh."""
    impl = mpi.OPENMPI
    expected = mpi.reference_checksum(impl, solver, RANKS, ITERATIONS)
    h = healing(env=impl.env)
    head = h.net.hosts[1]
    job = h.launch(head, "mpirun", impl.mpirun, *impl.options, "--host", "h2,h3,h4",
                   "-np", str(RANKS), solver, str(ITERATIONS), str(PAUSE_US))

    def iteration() -> int:
        seen = mpi.iterations_seen(job.out.read_text())
        return seen[-1] if seen else 0

    wait_for(lambda: iteration() >= 50, what="iteration 50")
    # a checkpoint from after iteration 50: the restored job goes on from there
    after = h.status()["generation"] + 1
    wait_for(lambda: (st := h.checkpointed_all(3)) and st["generation"] > after,
             what="an interval checkpoint of the three trees")
    h.stop_interval_checkpoints()
    ranks = {t["host"]: sum(1 for p in t["procs"] if p[1].startswith("mpi_solver"))
             for t in h.trees()}
    assert ranks == {"h2": 1, "h3": 1, "h4": 1}, ranks
    victim = pid_of(h.trees(), "h2", ("mpirun.openmpi", "mpirun", "orterun"))
    os.kill(victim, signal.SIGKILL)
    assert job.wait(timeout=TIMEOUT) != 0
    killed = iteration()
    assert killed < ITERATIONS, "the job ended before it was killed"
    st = h.healed(1)  # (the job may have ended already)
    assert st["last_failure"]["host"] == "h2" and "SIGKILL" in st["last_failure"]["why"], st
    assert st["gave_up"] is None
    answer = wait_for(lambda: mpi.checksum(h.recovery_out.read_text(errors="replace")),
                      timeout=HEAL_TIMEOUT, what="the restarted job's answer")
    text = h.recovery_out.read_text(errors="replace")
    seen = mpi.iterations_seen(text)
    assert seen and 50 < seen[0] <= killed + 50, (seen[:3], killed)
    assert answer == expected, text[-2000:]


def test_a_host_killed_with_its_storage_the_ring_finishes_on_the_spare(healing, net_stream):
    """All of h3 dies, its images with it: the coordinator hears nothing
    more from it, and restarts the ring from the newest generation with a
    surviving copy of every tree: h3's from its replica, on the spare h5."""
    h = healing("--replicas", "1", "--heartbeat", "0.5", "--heartbeat-timeout", "3")
    hosts = h.net.hosts
    dead, spare = hosts[2], hosts[4]
    members = start_ring(h, net_stream, hosts[1:4])
    first = min(last(p.out) for p in members)
    wait_for(lambda: h.checkpointed_all(3), what="an interval checkpoint of the three trees")
    h.stop_interval_checkpoints()
    assert h.images(dead), "no image of h3's tree on h3"
    dead.kill()  # every process, its link, its storage
    assert h.images(dead) == []
    # the hosts share one pid space: the dead host's processes are reaped
    # (we are their subreaper) before the spare restores their pids
    members[1].wait(timeout=TIMEOUT)
    wait_for(reap_zombies, what="the dead host's processes to be reaped")
    st = h.healed(1, 3)
    assert st["last_failure"]["host"] == "h3" and "silent" in st["last_failure"]["why"], st
    assert st["gave_up"] is None
    assert sorted(t["host"] for t in h.trees()) == ["h2", "h4", "h5"]
    for proc in (members[0], members[2]):
        proc.wait(timeout=TIMEOUT)
    no_wrong_bytes([members[0], members[2]])
    assert_ring_finished(h, first)
    assert f"trees of h3 restart on {spare.name}" in h.recovery_out.read_text(errors="replace")


def test_a_host_killed_with_its_storage_the_mpi_job_finishes_on_the_spare(healing, solver):
    """The Open MPI job of three trees (mpirun on h2; an orted and a rank on
    h3 and on h4): all of h3 dies with its images.  The job comes back
    from the newest generation with a copy of every tree, h3's orted and
    rank on the spare h5 from the replica on h4, and ends with the answer
    of an uninterrupted run."""
    impl = mpi.OPENMPI
    expected = mpi.reference_checksum(impl, solver, RANKS, ITERATIONS)
    h = healing("--replicas", "1", "--heartbeat", "0.5", "--heartbeat-timeout", "3",
                env=impl.env)
    hosts = h.net.hosts
    dead = hosts[2]
    job = h.launch(hosts[1], "mpirun", impl.mpirun, *impl.options, "--host", "h2,h3,h4",
                   "-np", str(RANKS), solver, str(ITERATIONS), str(PAUSE_US))
    wait_for(lambda: (seen := mpi.iterations_seen(job.out.read_text())) and seen[-1] >= 50,
             what="iteration 50")
    after = h.status()["generation"] + 1
    wait_for(lambda: (st := h.checkpointed_all(3)) and st["generation"] > after
             and st["replicated_trees"] == 3, what="a copied checkpoint of the three trees")
    h.stop_interval_checkpoints()
    assert h.images(dead), "no image of h3's tree on h3"
    dead.kill()  # every process, its link, its storage
    assert h.images(dead) == []
    wait_for(reap_zombies, what="the dead host's processes to be reaped")
    st = h.healed(1)
    assert st["last_failure"]["host"] == "h3" and "silent" in st["last_failure"]["why"], st
    assert st["gave_up"] is None
    answer = wait_for(lambda: mpi.checksum(h.recovery_out.read_text(errors="replace")),
                      timeout=HEAL_TIMEOUT, what="the restarted job's answer")
    assert answer == expected, h.recovery_out.read_text(errors="replace")[-2000:]
    assert "trees of h3 restart on h5" in h.recovery_out.read_text(errors="replace")
