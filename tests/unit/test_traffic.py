"""The coordinator's traffic matrix: rates from counters, far ends found
among the trees, decay, traffic out of the computation, groups."""
from __future__ import annotations

import math

import pytest

from dmtcp_py.coordinator.traffic import HALF_LIVES, OUTSIDE, TrafficMatrix, endpoint_key

A, B = "198.18.0.1:5000", "198.18.0.2:40000"


def stream(m: TrafficMatrix, t: float, ab: int, ba: int) -> None:
    """Tree a (h1) and tree b (h2) on one connection; a sent ab bytes in
    all so far, b sent ba."""
    m.report("a", "h1", [(A, B, ab, ba)], t)
    m.report("b", "h2", [(B, A, ba, ab)], t)


def test_a_connection_between_two_trees_is_an_edge_carrying_both_directions():
    m = TrafficMatrix()
    stream(m, 0.0, 1000, 0)          # counters before the first sample count nothing
    assert m.edges(0.0) == []
    stream(m, 10.0, 1000 + 10_000_000, 1_000_000)
    [edge] = m.edges(10.0)
    assert (edge.a, edge.b) == ("a", "b")
    short = edge.rates[0]
    assert short == pytest.approx(11_000_000 * math.log(2) / HALF_LIVES[0])
    # no more bytes: the short scale halves in one of its half-lives
    [later] = m.edges(10.0 + HALF_LIVES[0])
    assert later.rates[0] == pytest.approx(short / 2)
    # the long scale forgets slowly
    assert later.rates[2] == pytest.approx(edge.rates[2] * 0.5 ** (HALF_LIVES[0] / HALF_LIVES[2]))


def test_loopback_ends_are_told_apart_by_host():
    assert endpoint_key("h1", "127.0.0.1:80") == "h1/127.0.0.1:80"
    assert endpoint_key("h1", "198.18.0.1:80") == "198.18.0.1:80"
    m = TrafficMatrix()
    for t, n in ((0.0, 0), (5.0, 50_000)):
        m.report("a", "h1", [("127.0.0.1:7000", "127.0.0.1:7001", n, 0)], t)
        m.report("b", "h1", [("127.0.0.1:7001", "127.0.0.1:7000", 0, n)], t)
        m.report("c", "h2", [("127.0.0.1:7001", "127.0.0.1:9", 0, 0)], t)
    assert [(e.a, e.b) for e in m.edges(5.0)] == [("a", "b")]


def test_bytes_to_no_tree_leave_the_computation():
    m = TrafficMatrix()
    m.report("a", "h1", [(A, "198.18.9.9:443", 0, 0)], 0.0)
    m.report("a", "h1", [(A, "198.18.9.9:443", 4096, 0)], 1.0)
    [edge] = m.edges(1.0)
    assert (edge.a, edge.b) == ("a", OUTSIDE) and edge.rates[0] > 0


def test_closed_connections_and_departed_trees_are_forgotten():
    m = TrafficMatrix()
    stream(m, 0.0, 0, 0)
    stream(m, 1.0, 10_000, 3_000)
    m.report("a", "h1", [], 2.0)  # a closed it
    assert [(e.a, e.b) for e in m.edges(2.0)] == [("b", OUTSIDE)]  # b's end, unmatched now
    m.forget("b")
    assert m.edges(2.0) == [] and set(m.hosts) == {"a"}


def test_a_counter_that_went_back_starts_again():
    m = TrafficMatrix()
    stream(m, 0.0, 5_000, 0)
    stream(m, 1.0, 100, 0)  # another connection on the same addresses
    assert m.edges(1.0) == []


def _ring(m: TrafficMatrix, trees: list[str], t: float, n: int, heavy: set = frozenset(),
          light: int = 0) -> None:
    """Each neighbouring pair (i, i+1) on a connection of its own; pairs in
    heavy carry n bytes, the others light."""
    ends: dict[str, list] = {x: [] for x in trees}
    for i, (x, y) in enumerate(zip(trees, trees[1:])):
        volume = n if (x, y) in heavy or not heavy else light
        ex, ey = f"198.18.1.{i}:1", f"198.18.2.{i}:2"
        ends[x].append((ex, ey, volume, volume))
        ends[y].append((ey, ex, volume, volume))
    for x in trees:
        m.report(x, "h", ends[x], t)


def test_frequent_communicators_form_groups():
    m = TrafficMatrix()
    trees = ["a", "b", "c", "d"]
    heavy = {("a", "b"), ("c", "d")}
    _ring(m, trees, 0.0, 0, heavy)
    _ring(m, trees, 10.0, 50_000_000, heavy, light=10_000)  # b-c only a trickle
    m.report("quiet", "h", [], 10.0)
    assert m.groups(10.0) == [["a", "b"], ["c", "d"], ["quiet"]]
    # everyone talks to their neighbours alike: one group
    m2 = TrafficMatrix()
    _ring(m2, trees, 0.0, 0)
    _ring(m2, trees, 10.0, 1_000_000)
    assert m2.groups(10.0) == [trees]


def test_the_graph_is_plain_json():
    m = TrafficMatrix()
    stream(m, 0.0, 0, 0)
    stream(m, 1.0, 1 << 20, 0)
    g = m.graph(1.0)
    assert g["trees"] == [{"tree_id": "a", "host": "h1"}, {"tree_id": "b", "host": "h2"}]
    assert g["edges"][0]["a"] == "a" and g["edges"][0]["b"] == "b"
    assert g["edges"][0]["bytes_per_s"] > 0 and len(g["edges"][0]["by_scale"]) == 3
    assert g["groups"] == [["a", "b"]]
