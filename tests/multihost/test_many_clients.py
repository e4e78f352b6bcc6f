"""A server with 200 concurrent client connections from another host, every
byte checked in both directions (programs/net_fanin.py).  The coordinator
has a host of its own (h1), the server tree runs on h2, the client tree (one
process, 200 connections) on h3.  Checkpoint and go on; checkpoint, kill and
restart both trees on the same hosts; checkpoint, kill and restart the
server on a third host (h4, another address); then both run to their end,
and what each side sent is what the other received."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import kill_descendants, need_root
from tests.e2e.harness import TIMEOUT, ticks, wait_for
from tests.multihost.netns import TestNetwork
from tests.multihost.test_ring import BIN, COORD_PORT, Ring, last, no_failure

PROGRAM = Path(__file__).parent.parent / "e2e" / "programs" / "net_fanin.py"
PORT = "5000"
N = 200
TICKS, INTERVAL_MS = 200, 50  # 10 s of running time, most of it after the last restart
SUBNET = "198.18.2.0/24"


def rows(proc) -> list[list[str]]:
    return [r for r in ticks(proc.out) if r[0] == "tick"]


def field(row: list[str], name: str) -> int:
    return int(row[row.index(name) + 1])


def least(proc) -> int:
    r = rows(proc)
    return field(r[-1], "least") if r else 0


def all_active(proc) -> bool:
    r = rows(proc)
    return bool(r) and field(r[-1], "conns") == N and field(r[-1], "active") == N


class FanIn(Ring):
    """Ring's coordinator on h1, its restart and image helpers; launches
    net_fanin.py and explains a failure with the agents' logs."""

    def launch_fanin(self, host, *args: str) -> subprocess.Popen:
        proc = self._popen(host, f"launch-{args[0]}", [
            str(BIN / "dmtcp-launch"), "--join", "-h", self.coord_host.addr, "-p", COORD_PORT,
            "--ckptdir", str(self.ckptdir), sys.executable, str(PROGRAM), *args])
        proc.host_name, proc.role = host.name, args[0]
        return proc

    def diagnosis(self) -> str:
        """The programs' stderr, the notable lines of the agents' and the
        coordinator's logs."""
        out = []
        for proc in self.procs[1:]:
            err = proc.err.read_text().strip().splitlines()[-3:]
            out.append(f"{proc.out.name}: last tick {last(proc)}, stderr {err}")
        words = ("ERROR", "WARNING", "Error", "parked", "checkpoint", "restart", "restored")
        for log in sorted((self.root / "tmp").glob("*/*.log")):
            lines = [ln for ln in log.read_text(errors="replace").splitlines()
                     if any(w in ln for w in words)
                     and "RLIMIT_NOFILE" not in ln]  # CRIU says so every time here
            if lines:
                out.append(f"{log.parent.name}/{log.name}:\n    " + "\n    ".join(lines[-8:]))
        return "\n".join(out)

    def checkpoint(self, *more: str) -> None:
        """A blocking checkpoint, then more commands (-k).  Waits long enough
        for the agents' own drain and refill timeouts (30 s each) to give the
        coordinator their error."""
        for arg in ("-bc", *more):
            try:
                res = self.coord_host.run(
                    [str(BIN / "dmtcp-command"), "-h", self.coord_host.addr, "-p", COORD_PORT,
                     arg], capture_output=True, text=True, timeout=75, env=self.env)
                assert res.returncode == 0, f"dmtcp-command {arg}: {res.stdout}{res.stderr}"
            except (AssertionError, subprocess.TimeoutExpired) as exc:
                exc.add_note(self.diagnosis())
                raise

    def wait(self, predicate, what: str) -> None:
        try:
            wait_for(predicate, what=what)
        except AssertionError as exc:
            exc.add_note(self.diagnosis())
            raise


@pytest.fixture
def fan(tmp_path):
    need_root()
    with TestNetwork(4, subnet=SUBNET) as net:
        f = FanIn(net, tmp_path)
        try:
            yield f
        finally:
            for proc in f.procs:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
            kill_descendants()


def kill_and_restart(fan: FanIn, procs: list, placement: dict[str, object]) -> list:
    """Checkpoint, kill, restart each tree on placement[its host name]."""
    for p in procs:
        assert last(p) < TICKS - 40, "TICKS is too small: the programs would end too soon"
    before = [last(p) for p in procs]
    fan.checkpoint("-k")
    for p in procs:
        assert p.wait(timeout=TIMEOUT) != 0
    no_failure(procs)
    killed = [last(p) for p in procs]
    images = fan.images_by_host()
    assert sorted(images) == sorted(p.host_name for p in procs), images
    restarted = []
    for p in procs:
        host = placement[p.host_name]
        proc = fan.restart(host, images[p.host_name])
        proc.host_name, proc.role = host.name, p.role
        restarted.append(proc)
    # running again, and every connection received more than before the kill
    # (the checkpoint was taken before it), both ways
    start = [least(p) for p in procs]
    fan.wait(lambda: fan.status()["num_peers"] == 2 and fan.status()["running"]
             and all(least(p) > s for p, s in zip(restarted, start)),
             what=f"all {N} connections to carry data again after the restart")
    no_failure(restarted)
    for proc, b, k in zip(restarted, before, killed):
        first = int(rows(proc)[0][1])
        assert b < first <= k + 1, (proc.args, b, first, k)
    return restarted


def test_server_with_200_clients_on_another_host_keeps_every_byte(fan):
    h = fan.net.hosts
    server_host, client_host, spare = h[1], h[2], h[3]
    server = fan.launch_fanin(server_host, "server", server_host.addr, PORT, str(TICKS),
                              str(INTERVAL_MS), str(N))
    fan.wait(lambda: "listening" in server.out.read_text(), what="the server to listen")
    clients = fan.launch_fanin(client_host, "clients", server_host.addr, PORT, str(N),
                               str(TICKS), str(INTERVAL_MS))
    procs = [server, clients]
    fan.wait(lambda: fan.status()["num_peers"] == 2 and all(map(all_active, procs)),
             what=f"all {N} connections to carry data both ways")
    # checkpoint and go on
    fan.checkpoint()
    mark = [least(p) for p in procs]
    fan.wait(lambda: all(least(p) > m for p, m in zip(procs, mark)),
             what=f"all {N} connections to carry data after the checkpoint")
    no_failure(procs)
    # kill, restart on the same hosts
    same = {server_host.name: server_host, client_host.name: client_host}
    procs = kill_and_restart(fan, procs, same)
    # kill, restart the server on another host (another address)
    moved = {server_host.name: spare, client_host.name: client_host}
    procs = kill_and_restart(fan, procs, moved)
    for proc in procs:
        try:
            assert proc.wait(timeout=TIMEOUT) == 0, proc.err.read_text()
        except (AssertionError, subprocess.TimeoutExpired) as exc:
            exc.add_note(fan.diagnosis())
            raise
    no_failure(procs)
    done = {}
    for proc in procs:
        last_row = ticks(proc.out)[-1]
        assert last_row[:3] == ["done", str(TICKS), proc.role], last_row
        done[proc.role] = last_row
    server_done, clients_done = done["server"], done["clients"]
    assert field(server_done, "conns") == field(clients_done, "conns") == N
    # every word one side sent, the other received (the trailers checked it
    # per connection as well)
    assert field(server_done, "received") == field(clients_done, "sent") > 0
    assert field(clients_done, "received") == field(server_done, "sent") > 0
