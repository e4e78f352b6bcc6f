"""`dmtcp-command --graph`: the agents sample their trees' TCP
connections, the coordinator turns the counters into bytes per second
between trees (issue 16, part 3)."""
from __future__ import annotations

import json

from tests.e2e.harness import wait_for
from tests.e2e.test_bad_input import free_port
from tests.e2e.test_network import last

TICKS, INTERVAL_MS = 100000, 20


def test_two_streaming_trees_are_an_edge_and_a_group(comp, programs, tmp_path):
    where = ["127.0.0.1", str(free_port())]
    server, sout = comp.launch(*programs["net_stream"], "server", *where,
                               str(TICKS), str(INTERVAL_MS))
    wait_for(lambda: sout.exists() and "listening" in sout.read_text(), what="the server")
    client, cout = comp.launch(*programs["net_stream"], "client", *where,
                               str(TICKS), str(INTERVAL_MS))
    quiet, _ = comp.launch(*programs["counter_single"], "100000", "50")
    comp.wait_peers(3)
    wait_for(lambda: last(sout, "server") >= 5 and last(cout, "client") >= 5, what="traffic")
    listed = json.loads(comp.command("-l", "--json").stdout)["trees"]
    quiet_id = next(t["tree_id"] for t in listed if t["program"] == "counter_single")

    def graph() -> dict:
        return json.loads(comp.command("--graph", "--json").stdout)

    # two samples of each agent (every few seconds) make a rate
    g = wait_for(lambda: (g := graph())["edges"] and g, timeout=30, what="an edge")
    [edge] = [e for e in g["edges"] if e["b"]]
    streams = {t["tree_id"] for t in g["trees"] if t["program"] == "net_stream"}
    assert {edge["a"], edge["b"]} == streams and edge["bytes_per_s"] > 0, g
    assert len(g["trees"]) == 3
    assert sorted(map(sorted, g["groups"])) == sorted([sorted(streams), [quiet_id]]), g
    text = comp.command("--graph").stdout
    assert "net_stream" in text and "<->" in text and "groups: [" in text
    dot = comp.command("--dot").stdout
    assert dot.startswith("graph dmtcp {") and " -- " in dot
    picture = tmp_path / "graph.png"
    res = comp.command("--graph", "--png", str(picture))
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", res.stdout
    comp.kill_and_wait(server)
    for proc in (client, quiet):
        proc.wait(timeout=60)


def test_dot_without_graph_is_the_graph_and_png_needs_a_file(comp):
    res = comp.command("--dot")
    assert res.stdout.startswith("graph dmtcp {")
    res = comp.command("-s", "--png", "x.png", check=False)
    assert res.returncode != 0 and "--dot and --png go with --graph" in res.stderr
