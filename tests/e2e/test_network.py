"""Network connections between trees survive checkpoint and restart: the
bytes in flight are drained, kept in the images and put back, none lost,
doubled or reordered (net_stream checks every counter it receives)."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import threading

import pytest

from tests.e2e.harness import TIMEOUT, ticks, wait_for
from tests.e2e.test_bad_input import free_port

TICKS, INTERVAL_MS = 300, 10


def side_ticks(out, side: str) -> list[int]:
    return [int(r[1]) for r in ticks(out) if r[0] == "tick" and r[2] == side]


def last(out, side: str) -> int:
    numbers = side_ticks(out, side)
    return numbers[-1] if numbers else 0


def assert_no_failure(*procs) -> None:
    for proc in procs:
        err = proc.err_path.read_text()
        assert "FAIL" not in err, err


@pytest.mark.parametrize("family", ["tcp", "unix"])
def test_stream_between_two_trees(comp, programs, family):
    if family == "tcp":
        where = ["127.0.0.1", str(free_port())]
    else:
        where = [str(comp.root / "stream.sock"), "0"]
    server, sout = comp.launch(*programs["net_stream"], "server", *where,
                               str(TICKS), str(INTERVAL_MS))
    wait_for(lambda: sout.exists() and "listening" in sout.read_text(), what="the server")
    client, cout = comp.launch(*programs["net_stream"], "client", *where,
                               str(TICKS), str(INTERVAL_MS))
    comp.wait_peers(2)
    wait_for(lambda: last(sout, "server") >= 10 and last(cout, "client") >= 10, what="traffic")

    # checkpoint and go on: the original sockets come back, refilled
    comp.checkpoint()
    mark = (last(sout, "server"), last(cout, "client"))
    wait_for(lambda: last(sout, "server") >= mark[0] + 10 and last(cout, "client") >= mark[1] + 10,
             what="traffic after the checkpoint")
    assert_no_failure(server, client)

    # checkpoint, kill, restart both trees from the script: new connections
    before = {"server": last(sout, "server"), "client": last(cout, "client")}
    comp.checkpoint()
    comp.command("-k")
    assert server.wait(timeout=TIMEOUT) != 0 and client.wait(timeout=TIMEOUT) != 0
    killed = {"server": last(sout, "server"), "client": last(cout, "client")}
    assert_no_failure(server, client)
    restarted, rout = comp.restart()
    comp.wait_peers(2)
    assert restarted.wait(timeout=TIMEOUT) == 0, restarted.err_path.read_text()
    assert_no_failure(restarted)
    for side in ("server", "client"):
        numbers = side_ticks(rout, side)
        assert numbers and before[side] < numbers[0] <= killed[side] + 1, (side, numbers[:3])
        assert numbers == list(range(numbers[0], TICKS + 1)), f"{side}: ticks lost or repeated"
    done = [r for r in ticks(rout) if r[0] == "done"]
    assert sorted(r[2] for r in done) == ["client", "server"]


class EchoServer:
    """A line echo server in this test process: not under control."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    @staticmethod
    def _echo(conn: socket.socket) -> None:
        try:
            while data := conn.recv(65536):
                conn.sendall(data)
        except OSError:
            pass

    def close(self) -> None:
        self.listener.close()
        for conn in self.conns:
            conn.close()


def test_connection_to_a_server_not_under_control(comp, programs):
    server = EchoServer()
    try:
        proc, out = comp.launch(*programs["net_outside"], "127.0.0.1", str(server.port),
                                str(TICKS), str(INTERVAL_MS))
        comp.wait_peers(1)
        wait_for(lambda: sum(r[2] == "echo" for r in ticks(out)) >= 5, what="echoes")
        # checkpoint and go on: the same connection goes on working
        comp.checkpoint()
        listing = comp.command("-l").stdout
        assert "outside: 127.0.0.1:" in listing and f"-> 127.0.0.1:{server.port}" in listing
        seen = len(ticks(out))
        wait_for(lambda: len(ticks(out)) >= seen + 5, what="ticks after the checkpoint")
        assert all(r[2] == "echo" for r in ticks(out) if r[0] == "tick"), ticks(out)[-5:]
        comp.command("-k")
        proc.wait(timeout=TIMEOUT)
        image = comp.images()[0]
        rows = json.loads((image / "manifest.json").read_text())["sockets"]
        assert [r["peer"] for r in rows if r.get("external")] == [["127.0.0.1", server.port]]
        # restart: it comes back closed, and the restart says which one
        restarted, rout = comp.restart()
        assert restarted.wait(timeout=TIMEOUT) == 0, restarted.err_path.read_text()
        assert f"-> 127.0.0.1:{server.port} led out of the computation" in \
            restarted.err_path.read_text()
        rows = [r for r in ticks(rout) if r[0] == "tick"]
        assert rows and all(r[2] == "closed" for r in rows), rows[:3]
        assert ticks(rout)[-1][0] == "done"
    finally:
        server.close()


def _queued_datagrams(comp) -> int:
    total = 0
    for image in comp.images():
        for row in json.loads((image / "manifest.json").read_text())["sockets"]:
            total += row.get("datagram_count", 0)
    return total


_RECEIVED = re.compile(r"tick \d+ received (\d+)(?=\n|tick |done )")


def test_udp_datagrams_queued_at_the_checkpoint_are_not_lost(comp, programs):
    rport, sport = str(free_port()), str(free_port())
    receiver, rout = comp.launch(*programs["net_udp"], "receive", "127.0.0.1", rport,
                                 "127.0.0.1", sport, str(TICKS), str(INTERVAL_MS))
    wait_for(lambda: rout.exists() and "bound" in rout.read_text(), what="the receiver")
    sender, sout = comp.launch(*programs["net_udp"], "send", "127.0.0.1", sport,
                               "127.0.0.1", rport, str(TICKS), str(INTERVAL_MS))
    comp.wait_peers(2)
    def received(out) -> int:
        # both trees' restarted output goes to one file, in chunks: a line
        # may be cut by the other tree's, or run into it ("tick 300 sent"
        # then "tick 320 received 300" and only then the sender's newline:
        # seen, the last count missed), so each report is found in the
        # text, whole: up to a newline or the start of the next report
        try:
            text = out.read_text()
        except FileNotFoundError:
            return 0
        return max((int(n) for n in _RECEIVED.findall(text)), default=0)

    wait_for(lambda: received(rout) >= 10, what="datagrams")
    # checkpoints that go on leave the queue as it was; keep checkpointing
    # until one catches datagrams waiting in the receiver's queue
    for _ in range(8):
        comp.checkpoint()
        if _queued_datagrams(comp):
            break
    assert _queued_datagrams(comp) > 0, "no checkpoint caught a queued datagram"
    assert_no_failure(receiver, sender)
    at_checkpoint = received(rout)
    comp.command("-k")
    receiver.wait(timeout=TIMEOUT)
    sender.wait(timeout=TIMEOUT)
    assert_no_failure(receiver, sender)
    restarted, out = comp.restart()
    assert restarted.wait(timeout=TIMEOUT) == 0, restarted.err_path.read_text()
    assert_no_failure(restarted)
    done = [r for r in ticks(out) if r[0] == "done"]
    assert sorted(r[2] for r in done) == ["received", "sent"]
    assert received(out) == TICKS and at_checkpoint < TICKS


def test_a_failed_dump_gives_every_process_its_sockets_back(comp, programs):
    """CRIU fails under one tree (here: a CRIU that cannot run): the
    checkpoint fails with its reason, and both programs go on streaming over
    their own sockets (no placeholder left on a socket's number)."""
    where = ["127.0.0.1", str(free_port())]
    server, sout = comp.launch(*programs["net_stream"], "server", *where,
                               str(TICKS), str(INTERVAL_MS))
    wait_for(lambda: sout.exists() and "listening" in sout.read_text(), what="the server")
    client, cout = comp.launch(*programs["net_stream"], "client", *where,
                               str(TICKS), str(INTERVAL_MS),
                               env={**os.environ, "DMTCP_CRIU": "/bin/false"})
    comp.wait_peers(2)
    wait_for(lambda: last(sout, "server") >= 10 and last(cout, "client") >= 10, what="traffic")
    res = comp.command("-bc", check=False)
    assert res.returncode != 0 and "criu" in res.stderr.lower(), res.stderr
    mark = (last(sout, "server"), last(cout, "client"))
    wait_for(lambda: last(sout, "server") >= mark[0] + 10 and last(cout, "client") >= mark[1] + 10,
             what="traffic after the failed checkpoint")
    assert server.wait(timeout=TIMEOUT) == 0 and client.wait(timeout=TIMEOUT) == 0
    assert_no_failure(server, client)
    assert comp.images() == [], "a failed checkpoint left an image"


def _time_wait_on(port: int) -> int:
    """Connections in TIME_WAIT whose local port is port (ss)."""
    res = subprocess.run(["ss", "-tanH", "state", "time-wait", f"( sport = :{port} )"],
                         capture_output=True, text=True, timeout=TIMEOUT, check=True)
    return len(res.stdout.splitlines())


def test_a_listener_gets_its_port_back_from_the_killed_trees_time_wait(comp, programs):
    """A server without SO_REUSEADDR, killed while it held a connection,
    leaves that connection in TIME_WAIT on its listening port, which a
    plain bind then cannot have (nor raw criu restore): the restart ends
    that connection (agent/time_wait.py) and the listener is back on its
    port, with no warning of another one."""
    proc, out = comp.launch(*programs["listen_self"], "100000", "10")
    wait_for(lambda: "tick" in out.read_text(), what="the server's first tick")
    port = int(out.read_text().split()[1])
    comp.wait_peers(1)
    comp.checkpoint()
    assert comp.kill_and_wait(proc) != 0
    assert _time_wait_on(port) > 0  # (what the restart has to get past)
    restarted, rout = comp.restart()
    try:
        wait_for(lambda: rout.read_text().count("tick") >= 5, what="ticks after the restart")
    finally:
        comp.command("-k")
        restarted.wait(timeout=TIMEOUT)
    err = restarted.err_path.read_text()
    assert "is taken here" not in err, err
    ports = {row[3] for row in ticks(rout) if row[0] == "tick"}
    assert ports == {str(port)}, ports
