"""A ring of three trees on three hosts streams counters to its successor;
every byte is checked.  Checkpoint and go on; kill and restart on the same
hosts; kill and restart each tree on another host (other addresses); kill
and restart all three on one host; then the ring runs to its end.  The
coordinator has a host of its own (h1); the hosts are network namespaces
(netns.py), each with its own hostname."""
from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from dmtcp_py.fault_injection import hold_env
from dmtcp_py.protocol.states import State
from tests.conftest import kill_descendants, need_root, reap_zombies
from tests.e2e.harness import TIMEOUT, ticks, wait_for
from tests.multihost.netns import TestNetwork

BIN = Path(sys.executable).parent
PROGRAM = Path(__file__).parent.parent / "e2e" / "programs" / "net_stream.c"
PORT, COORD_PORT = "5000", "7779"
TICKS, INTERVAL_MS = 400, 10


class Ring:
    """The coordinator on h1, ring members on the other hosts."""

    def __init__(self, net: TestNetwork, root: Path) -> None:
        self.net, self.root = net, root
        self.coord_host = net.hosts[0]
        self.ckptdir = root / "ckpt"
        self.ckptdir.mkdir(mode=0o700)
        self.env = {**os.environ, "DMTCP_COORD_TOKEN": secrets.token_hex(16),
                    "DMTCP_TMPDIR": str(root / "tmp")}
        self.procs: list[subprocess.Popen] = []
        self.coordinator = self._popen(self.coord_host, "coordinator", [
            str(BIN / "dmtcp-coordinator"), "--listen", self.coord_host.addr, "-p", COORD_PORT,
            "--ckptdir", str(self.ckptdir), "-q"])
        wait_for(lambda: self.command("-s", check=False).returncode == 0, what="the coordinator")
        self.runs = 0

    def _popen(self, host, label: str, argv: list[str]) -> subprocess.Popen:
        self.runs = getattr(self, "runs", 0) + 1
        out = self.root / f"{self.runs:02d}-{label}-{host.name}.out"
        with open(out, "w") as o, open(out.with_suffix(".err"), "w") as e:
            proc = host.popen(argv, stdin=subprocess.DEVNULL, stdout=o, stderr=e, env=self.env)
        proc.out, proc.err = out, out.with_suffix(".err")
        self.procs.append(proc)
        return proc

    def command(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        res = self.coord_host.run([str(BIN / "dmtcp-command"), "-h", self.coord_host.addr,
                                   "-p", COORD_PORT, *args], capture_output=True, text=True,
                                  timeout=TIMEOUT, env=self.env)
        if check:
            assert res.returncode == 0, res.stderr
        return res

    def status(self) -> dict:
        return json.loads(self.command("-s", "--json").stdout)

    def launch(self, host, exe: str, nxt) -> subprocess.Popen:
        return self._popen(host, "launch", [
            str(BIN / "dmtcp-launch"), "--join", "-h", self.coord_host.addr, "-p", COORD_PORT,
            "--ckptdir", str(self.ckptdir), exe, "ring", host.addr, PORT, nxt.addr,
            str(TICKS), str(INTERVAL_MS)])

    def restart(self, host, image: Path) -> subprocess.Popen:
        return self._popen(host, "restart", [
            str(BIN / "dmtcp-restart"), "--join", "-h", self.coord_host.addr, "-p", COORD_PORT,
            str(image)])

    def images_by_host(self) -> dict[str, Path]:
        out = {}
        for image in self.ckptdir.glob("ckpt_*.dmtcp"):
            out[json.loads((image / "manifest.json").read_text())["host"]] = image
        return out


def last(proc) -> int:
    rows = [r for r in ticks(proc.out) if r[0] == "tick"]
    return int(rows[-1][1]) if rows else 0


def no_failure(procs) -> None:
    for proc in procs:
        err = proc.err.read_text()
        assert "FAIL" not in err, f"{proc.args}: {err}"


@pytest.fixture
def ring(tmp_path):
    need_root()
    exe = tmp_path / "net_stream"
    subprocess.run(["cc", "-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-pthread",
                    "-o", str(exe), str(PROGRAM)], check=True)
    with TestNetwork(5) as net:
        r = Ring(net, tmp_path)
        r.exe = str(exe)
        try:
            yield r
        finally:
            for proc in r.procs:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
            kill_descendants()


def start_ring(ring: Ring, hosts: list) -> list:
    """One member on each host, each sending to the next; once all tick."""
    members = []
    for i, host in enumerate(hosts):
        proc = ring.launch(host, ring.exe, hosts[(i + 1) % len(hosts)])
        proc.host_name = host.name
        members.append(proc)
    wait_for(lambda: ring.status()["num_peers"] == len(hosts)
             and all(last(p) >= 10 for p in members), what="the ring to run")
    return members


def kill_and_restart(ring: Ring, members: list, placement: dict[str, object]) -> list:
    """Checkpoint, kill, restart each tree on placement[old host name]."""
    before = [last(p) for p in members]
    ring.command("-bc")
    ring.command("-k")
    for p in members:
        assert p.wait(timeout=TIMEOUT) != 0
    no_failure(members)
    killed = [last(p) for p in members]
    images = ring.images_by_host()
    assert len(images) == 3, images
    order = [p.host_name for p in members]
    restarted = []
    for old in order:
        proc = ring.restart(placement[old], images[old])
        proc.host_name = placement[old].name
        restarted.append(proc)
    wait_for(lambda: ring.status()["num_peers"] == 3 and ring.status()["running"]
             and all(last(p) > 0 for p in restarted), what="the ring to run again")
    for proc, b, k in zip(restarted, before, killed):
        first = int(next(r for r in ticks(proc.out) if r[0] == "tick")[1])
        assert b < first <= k + 1, (proc.args, b, first, k)
    return restarted


def test_ring_of_three_hosts_moves_and_keeps_every_byte(ring):
    h = ring.net.hosts
    members_hosts = h[1:4]
    members = start_ring(ring, members_hosts)
    # checkpoint and go on
    ring.command("-bc")
    mark = [last(p) for p in members]
    wait_for(lambda: all(last(p) >= m + 10 for p, m in zip(members, mark)), what="ticks after")
    no_failure(members)
    same = {x.name: x for x in members_hosts}
    members = kill_and_restart(ring, members, same)
    # each tree on the next host: other addresses, other hostnames
    rotated = {x.name: members_hosts[(i + 1) % 3] for i, x in enumerate(members_hosts)}
    members = kill_and_restart(ring, members, {p.host_name: rotated[p.host_name] for p in members})
    # all three on the spare host
    members = kill_and_restart(ring, members, {p.host_name: h[4] for p in members})
    for proc in members:
        assert proc.wait(timeout=TIMEOUT) == 0, proc.err.read_text()
    no_failure(members)
    for proc in members:
        rows = ticks(proc.out)
        assert rows[-1][0] == "done", rows[-3:]


def test_two_trees_of_one_host_spread_to_two_others(ring):
    """A server and its client launched on one host come back each on a
    host of its own: the connection between them is made again."""
    h = ring.net.hosts
    home = h[1]
    args = [home.addr, PORT, str(TICKS), str(INTERVAL_MS)]
    server = ring._popen(home, "launch", [
        str(BIN / "dmtcp-launch"), "--join", "-h", ring.coord_host.addr, "-p", COORD_PORT,
        "--ckptdir", str(ring.ckptdir), ring.exe, "server", *args])
    wait_for(lambda: "listening" in server.out.read_text(), what="the server")
    client = ring._popen(home, "launch", [
        str(BIN / "dmtcp-launch"), "--join", "-h", ring.coord_host.addr, "-p", COORD_PORT,
        "--ckptdir", str(ring.ckptdir), ring.exe, "client", *args])
    wait_for(lambda: ring.status()["num_peers"] == 2 and last(server) >= 10 and last(client) >= 10,
             what="the pair to run")
    before = {"server": last(server), "client": last(client)}
    ring.command("-bc")
    ring.command("-k")
    assert server.wait(timeout=TIMEOUT) != 0 and client.wait(timeout=TIMEOUT) != 0
    no_failure([server, client])
    images = list(ring.ckptdir.glob("ckpt_*.dmtcp"))
    assert len(images) == 2
    by_role = {}
    for image in images:
        argv = json.loads((image / "manifest.json").read_text())["argv"]
        by_role["server" if "server" in argv else "client"] = image
    moved = {"server": ring.restart(h[2], by_role["server"]),
             "client": ring.restart(h[3], by_role["client"])}
    for role, proc in moved.items():
        assert proc.wait(timeout=TIMEOUT) == 0, proc.err.read_text()
        rows = ticks(proc.out)
        first = int(next(r for r in rows if r[0] == "tick")[1])
        assert first > before[role] and rows[-1][0] == "done", (role, rows[:2], rows[-2:])
    no_failure(moved.values())


def test_a_host_killed_mid_checkpoint_the_others_go_on_and_all_restart_elsewhere(ring):
    """A whole host dies in the middle of a checkpoint: the trees on the
    other hosts are released (their neighbour on the dead host is gone, so
    their ring breaks), the failure is reported, and the three trees
    restart from the last good generation, the dead host's on a spare."""
    from tests.multihost import netns
    h = ring.net.hosts
    members_hosts = h[1:4]
    ring.env.update(hold_env(State.DRAINED, 3))  # agents linger in DRAINED
    members = start_ring(ring, members_hosts)
    ring.command("-bc")  # generation 1, the good one
    before = [last(p) for p in members]
    images = ring.images_by_host()
    bc = ring.coord_host.popen([str(BIN / "dmtcp-command"), "-h", ring.coord_host.addr,
                                "-p", COORD_PORT, "-bc"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, env=ring.env)
    wait_for(lambda: ring.status()["state"] == "DRAINED", what="the agents draining")
    dead = members_hosts[1]
    netns._kill_inside({i for i in (netns._ns_id(netns.NETNS_DIR / dead.netns),
                                    netns._ns_id(dead.uts), netns._ns_id(dead.mnt)) if i})
    # the test hosts share one pid space: the dead host's processes must be
    # reaped (we are their subreaper) before their pids can be restored
    members[1].wait(timeout=TIMEOUT)
    wait_for(reap_zombies, what="the dead host's processes to be reaped")
    _, err = bc.communicate(timeout=TIMEOUT * 2)
    assert bc.returncode != 0 and "exited during the checkpoint" in err, err
    # the survivors are released: each tree runs, or has ended on its own
    # because its neighbour on the dead host is gone (a stopped one would
    # still be listed, not RUNNING)
    wait_for(lambda: ring.status()["running"] or ring.status()["num_trees"] == 0,
             timeout=TIMEOUT * 2, what="the round to end")
    trees = json.loads(ring.command("-l", "--json").stdout)["trees"]
    assert all(t["state"] == "RUNNING" and t["host"] != dead.name for t in trees), trees
    assert ring.images_by_host() == images  # generation 1 untouched
    ring.command("-k")
    for p in members:
        p.wait(timeout=TIMEOUT)
    # all three come back from generation 1, the dead host's tree on the spare
    placement = {x.name: (h[4] if x is dead else x) for x in members_hosts}
    restarted = []
    for x in members_hosts:
        proc = ring.restart(placement[x.name], images[x.name])
        proc.host_name = x.name
        restarted.append(proc)
    for proc, b in zip(restarted, before):
        assert proc.wait(timeout=TIMEOUT * 2) == 0, proc.err.read_text()
        rows = ticks(proc.out)
        first = int(next(r for r in rows if r[0] == "tick")[1])
        assert first <= b + 1 and rows[-1][0] == "done", (rows[:2], rows[-2:])
    no_failure(restarted)
