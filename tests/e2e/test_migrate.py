"""`dmtcp-command --migrate`: one tree of a TCP ring moves while the two
others keep running and keep their processes; every byte once and in order
(net_stream checks every counter it receives and exits 3 otherwise)
(issue 16, part 1)."""
from __future__ import annotations

import json

import pytest

from dmtcp_py.coordinator import restarter
from tests.e2e.harness import TIMEOUT, ticks, wait_for
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
