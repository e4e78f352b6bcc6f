"""`dmtcp-command --migrate`: one tree of a TCP ring moves while the two
others keep running and keep their processes; every byte once and in order
(net_stream checks every counter it receives and exits 3 otherwise)
(issue 16, part 1)."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from dmtcp_py.coordinator import restarter
from dmtcp_py.fault_injection import hold_env
from dmtcp_py.protocol.states import State
from tests.e2e.harness import TIMEOUT, last_tick, ticks, tool, wait_for
from tests.e2e.test_bad_input import free_port
from tests.e2e.test_network import last

TICKS, INTERVAL_MS = 600, 10
NODES = ("127.0.0.1", "127.0.0.2", "127.0.0.3")


@pytest.fixture
def moved_output(comp):
    out = restarter.output_path(comp.port, "migration")
    yield out
    out.unlink(missing_ok=True)


def _ring(comp, programs, port: int) -> list:
    """Three ring members on loopback addresses, each sending to the next."""
    nodes = []
    for i, here in enumerate(NODES):
        nxt = NODES[(i + 1) % len(NODES)]
        nodes.append(comp.launch(*programs["net_stream"], "ring", here, str(port), nxt,
                                 str(TICKS), str(INTERVAL_MS)))
    return nodes


def _trees(comp) -> dict[str, dict]:
    """tree_id -> what -l --json shows of it (one per tree id)."""
    return {t["tree_id"]: t for t in json.loads(comp.command("-l", "--json").stdout)["trees"]}


def _tree_of(trees: dict[str, dict], launch_pid: int) -> str:
    return next(t for t, v in trees.items() if v["agent_pid"] == launch_pid)


def test_one_ring_member_moves_while_the_others_stream(comp, programs, moved_output):
    nodes = _ring(comp, programs, free_port())
    comp.wait_peers(3)
    wait_for(lambda: all(last(out, "ring") >= 20 for _, out in nodes), what="the ring streaming")
    before = _trees(comp)
    assert len(before) == 3
    middle = _tree_of(before, nodes[1][0].pid)
    host = before[middle]["host"]

    res = comp.command("--migrate", middle, "--to", host, "--json")
    body = json.loads(res.stdout)
    assert body["moved"] == [middle] and body["to"] == [host], body

    # the launch that ran the moved tree ends (its program runs on elsewhere)
    moved_launch, _ = nodes[1]
    assert moved_launch.wait(timeout=TIMEOUT) == 0, moved_launch.err_path.read_text()
    assert "moved to" in moved_launch.err_path.read_text()
    after = _trees(comp)
    assert set(after) == set(before)
    for tree_id in set(before) - {middle}:  # the others: the same agents, the same processes
        assert after[tree_id]["agent_pid"] == before[tree_id]["agent_pid"]
        assert after[tree_id]["procs"] == before[tree_id]["procs"]
    assert after[middle]["agent_pid"] != before[middle]["agent_pid"]
    record = comp.status()["last_migration"]
    assert record["ok"] and record["moved"] == [middle], record
    assert f"LAST_MIGRATION={middle} to {host} ok" in comp.command("-s").stdout

    # every member streams on to its end: no byte lost, doubled or reordered
    for proc, out in (nodes[0], nodes[2]):
        assert proc.wait(timeout=TIMEOUT) == 0, proc.err_path.read_text()
        assert "done" in out.read_text()
    wait_for(lambda: "done 600 ring" in moved_output.read_text(), what="the moved member's end")
    ticks_after = [int(line.split()[1]) for line in moved_output.read_text().splitlines()
                   if line.startswith("tick ")]
    assert ticks_after and ticks_after == sorted(ticks_after)


def test_a_migration_that_cannot_restore_leaves_everything_running(comp, programs, tmp_path):
    """The target host does not exist: the restart fails, the old copy was
    never let go, the ring goes on where it was."""
    nodes = _ring(comp, programs, free_port())
    comp.wait_peers(3)
    wait_for(lambda: all(last(out, "ring") >= 10 for _, out in nodes), what="the ring streaming")
    before = _trees(comp)
    middle = _tree_of(before, nodes[1][0].pid)
    res = comp.command("--migrate", middle, "--to", "no-such-host.invalid", check=False)
    assert res.returncode != 0
    assert res.stderr.startswith("dmtcp-command: error: migration failed:"), res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    after = _trees(comp)
    assert {t: v["agent_pid"] for t, v in after.items()} == \
        {t: v["agent_pid"] for t, v in before.items()}
    for proc, out in nodes:
        assert proc.wait(timeout=TIMEOUT) == 0, proc.err_path.read_text()
        assert "done" in out.read_text()


def test_bad_migrations_are_one_line_errors(comp, programs):
    proc, _ = comp.launch(*programs["counter_single"], "100000", "50")
    comp.wait_peers(1)
    for args, words in ((["--migrate", "nope"], "no tree 'nope'"),
                        (["--vacate", "no-host"], "no tree runs on 'no-host'"),
                        (["--migrate", "x", "-s"], "go alone"),
                        (["-s", "--to", "h"], "--to and --with-group go with")):
        res = comp.command(*args, check=False)
        assert res.returncode != 0 and words in res.stderr, (args, res.stderr)
        assert len(res.stderr.strip().splitlines()) == 1
    comp.kill_and_wait(proc)


def test_a_tree_moves_with_its_group(comp, programs, moved_output):
    """--with-group: the client of a streaming pair moves with its server
    (their edge in --graph); the quiet tree stays."""
    where = ["127.0.0.1", str(free_port())]
    server, sout = comp.launch(*programs["net_stream"], "server", *where, "2500", "10")
    wait_for(lambda: sout.exists() and "listening" in sout.read_text(), what="the server")
    client, cout = comp.launch(*programs["net_stream"], "client", *where, "2500", "10")
    quiet, _ = comp.launch(*programs["counter_single"], "100000", "50")
    comp.wait_peers(3)
    trees = _trees(comp)
    wait_for(lambda: any(len(g) == 2 for g in json.loads(comp.command(
        "--graph", "--json").stdout)["groups"]), timeout=60, what="the pair's group")
    res = comp.command("--migrate", _tree_of(trees, client.pid), "--with-group", "--json")
    body = json.loads(res.stdout)
    pair = sorted([_tree_of(trees, server.pid), _tree_of(trees, client.pid)])
    assert body["moved"] == pair, body
    for proc in (server, client):
        assert proc.wait(timeout=TIMEOUT) == 0, proc.err_path.read_text()
    quiet_id = _tree_of(trees, quiet.pid)
    assert _trees(comp)[quiet_id]["agent_pid"] == quiet.pid
    wait_for(lambda: moved_output.read_text().count("done 2500") == 2, timeout=120,
             what="both moved ends to finish")
    assert "FAIL" not in moved_output.read_text()
    comp.kill_and_wait(quiet)


def test_a_udp_receiver_moves_and_its_sender_stays(comp, programs, moved_output):
    """Each connected to the other: the moved receiver finds the staying
    sender's address again, the sender finds the receiver's new place;
    no datagram lost, doubled or changed (net_udp checks every one)."""
    rport, sport = str(free_port()), str(free_port())
    receiver, rout = comp.launch(*programs["net_udp"], "receive", "127.0.0.1", rport,
                                 "127.0.0.1", sport, "1500", "10")
    wait_for(lambda: rout.exists() and "bound" in rout.read_text(), what="the receiver")
    sender, _ = comp.launch(*programs["net_udp"], "send", "127.0.0.1", sport,
                            "127.0.0.1", rport, "1500", "10")
    comp.wait_peers(2)
    wait_for(lambda: "received" in rout.read_text(), what="datagrams")
    trees = _trees(comp)
    moving = _tree_of(trees, receiver.pid)
    comp.command("--migrate", moving, "--to", trees[moving]["host"])
    assert receiver.wait(timeout=TIMEOUT) == 0, receiver.err_path.read_text()
    assert sender.wait(timeout=TIMEOUT) == 0, sender.err_path.read_text()
    wait_for(lambda: "done 1500" in moved_output.read_text(), what="the moved receiver's end")
    assert "FAIL" not in moved_output.read_text() + sender.err_path.read_text()


def test_the_staying_members_run_on_while_their_peer_moves(coordinator, programs):
    """The moved member's new copy lingers 3 s before it reports (fault
    injection): meanwhile the two staying members, holding their
    connections to it, keep ticking; then every byte still arrives once
    and in order."""
    comp = coordinator(env=hold_env(State.RESTARTING, 3))
    out = restarter.output_path(comp.port, "migration")
    try:
        nodes = _ring(comp, programs, free_port())
        comp.wait_peers(3)
        wait_for(lambda: all(last(o, "ring") >= 20 for _, o in nodes), what="the ring streaming")
        trees = _trees(comp)
        middle = _tree_of(trees, nodes[1][0].pid)
        moving = subprocess.Popen([tool("dmtcp-command"), "-p", str(comp.port), "--migrate",
                                   middle], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)
        try:
            wait_for(lambda: not comp.status()["running"], what="the migration to begin")
            during = {i: last(nodes[i][1], "ring") for i in (0, 2)}
            wait_for(lambda: all(last(nodes[i][1], "ring") >= during[i] + 20 for i in (0, 2)),
                     what="the staying members to tick on")
            assert not comp.status()["running"], "the migration ended before they ticked on"
            _, err = moving.communicate(timeout=TIMEOUT)
            assert moving.returncode == 0, err
        finally:
            if moving.poll() is None:
                moving.kill()
                moving.communicate()
        for proc, o in (nodes[0], nodes[2]):
            assert proc.wait(timeout=TIMEOUT) == 0, proc.err_path.read_text()
            assert "done" in o.read_text()
        wait_for(lambda: "done 600 ring" in out.read_text(), what="the moved member's end")
        assert "FAIL" not in out.read_text()
    finally:
        out.unlink(missing_ok=True)


def test_a_unix_socket_client_moves_and_its_server_stays(comp, programs, moved_output):
    name = f"@dmtcp-test-migrate-{free_port()}"
    server, sout = comp.launch(*programs["net_stream"], "server", name, "0", "800", "10")
    wait_for(lambda: sout.exists() and "listening" in sout.read_text(), what="the server")
    client, _ = comp.launch(*programs["net_stream"], "client", name, "0", "800", "10")
    comp.wait_peers(2)
    wait_for(lambda: last(sout, "server") >= 20, what="the pair streaming")
    trees = _trees(comp)
    moving = _tree_of(trees, client.pid)
    comp.command("--migrate", moving)
    assert client.wait(timeout=TIMEOUT) == 0, client.err_path.read_text()
    assert server.wait(timeout=TIMEOUT) == 0, server.err_path.read_text()
    assert "done 800 server" in sout.read_text()
    wait_for(lambda: "done 800 client" in moved_output.read_text(), what="the moved client's end")
    assert "FAIL" not in moved_output.read_text()


def test_a_lone_program_goes_on_from_where_it_was(comp, programs, moved_output):
    proc, out = comp.launch(*programs["counter_single"], "100000", "20")
    comp.wait_peers(1)
    wait_for(lambda: last_tick(out) >= 5, what="the program")
    [tree] = _trees(comp)
    comp.command("--migrate", tree)
    assert proc.wait(timeout=TIMEOUT) == 0
    before = last_tick(out)
    wait_for(lambda: last_tick(moved_output) > before + 3, what="the moved program")
    first = int(next(line for line in moved_output.read_text().splitlines()
                     if line.startswith("tick")).split()[1])
    assert first == before + 1  # nothing ran between the dump and the end of the old copy
    comp.kill_and_wait(proc)


def test_a_tree_without_a_pid_namespace_cannot_move_beside_itself(comp, programs):
    """Its copy would need the pids the original holds: the restore fails,
    the migration is called off in one line, the original goes on."""
    env = {**os.environ, "DMTCP_PID_NAMESPACE": "0"}
    proc, out = comp.launch(*programs["counter_single"], "100000", "20", env=env)
    comp.wait_peers(1)
    wait_for(lambda: last_tick(out) >= 5, what="the program")
    [tree] = _trees(comp)
    res = comp.command("--migrate", tree, check=False)
    assert res.returncode != 0 and "migration failed:" in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    after = last_tick(out)
    wait_for(lambda: last_tick(out) > after + 3, what="the original to go on")
    assert _trees(comp)[tree]["agent_pid"] == proc.pid
    comp.kill_and_wait(proc)


def test_a_moved_tree_moves_again_and_checkpoints_into_the_checkpoint_directory(
        comp, programs, moved_output):
    """A tree a migration restored goes on with the computation's checkpoint
    directory, not with the directory of the image it was moved with (gone
    once it is restored): it moves again, and its checkpoint lands there."""
    launch, out = comp.launch(*programs["counter_single"], "100000", "20")
    comp.wait_peers(1)
    wait_for(lambda: len(ticks(out)) >= 10, what="the counter to tick")
    [(tree, info)] = _trees(comp).items()
    for _ in range(2):
        body = json.loads(comp.command("--migrate", tree, "--to", info["host"], "--json").stdout)
        assert body["moved"] == [tree], body
    assert launch.wait(timeout=TIMEOUT) == 0, launch.err_path.read_text()
    comp.command("-bc")
    images = [p.name for p in comp.ckptdir.iterdir() if p.name.startswith("ckpt_")]
    assert len(images) == 1, sorted(comp.ckptdir.iterdir())
    assert not list(comp.ckptdir.rglob(".dmtcp-migration/*/.dmtcp-migration"))
    seen = len(ticks(moved_output))
    wait_for(lambda: len(ticks(moved_output)) > seen + 5, what="the moved counter to tick on")
    rows = [int(r[1]) for r in ticks(moved_output) if r[0] == "tick"]
    first = int(ticks(out)[-1][1])
    assert rows[0] == first + 1 and rows == list(range(rows[0], rows[0] + len(rows))), rows[:5]
    comp.command("-k")
