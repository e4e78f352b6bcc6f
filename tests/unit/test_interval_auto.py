"""`--interval auto`: the pure choice of the interval (coordinator/interval.py),
the machine that feeds it and follows it, and the words users type."""
from __future__ import annotations

import math

import click
import pytest

from dmtcp_py.cli.base import AUTO, INTERVAL
from dmtcp_py.coordinator import console
from dmtcp_py.coordinator import interval as iv
from dmtcp_py.coordinator.interval import AutoInterval
from dmtcp_py.coordinator.machine import Notice, ReplyClient
from dmtcp_py.coordinator.recovery import RecoveryPolicy
from dmtcp_py.listing import status_lines
from dmtcp_py.protocol.messages import Barrier, Cmd, Command, Reply
from dmtcp_py.protocol.states import State
from tests.unit.test_machine import CLIENT, Sim, of_type, on_the_wire, sent
from tests.unit.test_recovery import checkpointed, killed_by_signal


def measured(*costs: float, started: float = 0.0, **kw) -> AutoInterval:
    auto = AutoInterval(**kw)
    auto.begin(started)
    for cost in costs:
        auto.checkpointed(cost)
    return auto


# ---- the choice ------------------------------------------------------------------------

def test_before_any_checkpoint_the_start_value_within_the_bounds():
    assert AutoInterval().choose(1e6) == iv.START
    assert AutoInterval(floor=20.0).choose(0.0) == 20.0
    assert AutoInterval(ceiling=4.0).choose(0.0) == 4.0


def test_young_formula_without_failures():
    # no failure in 1000 s: M = 1000, so sqrt(2 x 2 x 1000)
    assert measured(2.0).choose(1000.0) == pytest.approx(math.sqrt(2 * 2.0 * 1000.0))


def test_each_failure_shortens_the_interval():
    auto = measured(2.0)
    chosen = [auto.choose(1000.0)]
    for at in (100.0, 400.0, 700.0):
        assert auto.failed(at)
        chosen.append(auto.choose(1000.0))
    assert chosen == sorted(chosen, reverse=True) and len(set(chosen)) == 4
    # 3 failures in 1000 s: M = 1000 / (3 + 1)
    assert auto.mtbf(1000.0) == 250.0
    assert chosen[-1] == pytest.approx(math.sqrt(2 * 2.0 * 250.0))


def test_while_nothing_fails_the_interval_grows_to_the_ceiling():
    auto = measured(0.5)
    chosen = [auto.choose(t) for t in (10.0, 100.0, 1e4, 1e6, 1e8)]
    assert chosen == sorted(chosen) and chosen[0] < chosen[1] < chosen[2]
    assert chosen[-1] == iv.CEILING


def test_floor_and_cost_floor():
    # cheap checkpoints, little time seen: the floor
    assert measured(0.01).choose(10.0) == iv.FLOOR
    # costly ones: never less than COST_FACTOR times the cost
    assert measured(3.0).choose(1.0) == iv.COST_FACTOR * 3.0
    # the ceiling wins over the cost floor
    assert measured(1000.0).choose(1.0) == iv.CEILING


def test_the_cost_is_the_median_of_the_last_checkpoints():
    auto = measured(1.0, 1.0, 1.0, 1.0, 90.0)  # one slow checkpoint
    assert auto.cost() == 1.0
    for _ in range(iv.COSTS_KEPT // 2 + 1):   # a lasting change shows
        auto.checkpointed(4.0)
    assert auto.cost() == 4.0
    assert len(auto.costs) == iv.COSTS_KEPT
    assert AutoInterval().cost() is None


def test_trees_lost_together_are_one_failure():
    auto = measured(1.0)
    assert auto.failed(50.0)
    assert not auto.failed(50.0) and not auto.failed(50.0 + iv.SAME_FAILURE / 2)
    assert auto.failed(50.0 + iv.SAME_FAILURE)
    assert auto.failures == 2


def test_begin_counts_once_and_a_failure_begins():
    auto = AutoInterval()
    assert auto.begin(5.0) and not auto.begin(9.0) and auto.started == 5.0
    late = AutoInterval()
    late.failed(7.0)
    assert late.started == 7.0


def test_describe_and_bad_bounds():
    assert "no checkpoint measured" in AutoInterval().describe(0.0)
    auto = measured(0.5)
    assert "no failure yet" in auto.describe(100.0)
    auto.failed(50.0)
    assert "1 failure in 100 s" in auto.describe(100.0)
    with pytest.raises(ValueError):
        AutoInterval(floor=10.0, ceiling=5.0)


# ---- the machine -------------------------------------------------------------------------

def checkpoint_at(sim: Sim, start: float, cost: float) -> list:
    """An interval checkpoint the tick starts at `start`; the trees run
    again `cost` seconds later.  Returns what it caused."""
    begin = len(sim.log)
    assert sent(sim.tick(start), Barrier), "no interval checkpoint"
    sim.now = start + cost
    sim.advance_to(None)
    return sim.log[begin:]


def test_auto_from_the_start_then_young():
    sim = Sim(2, now=100.0, interval_auto=True)
    st = sim.m.status()
    assert st["interval_auto"] is True and st["checkpoint_interval"] == iv.START
    # the computation is seen running at 100.5: the first checkpoint a start value later
    assert sim.tick(100.5) == []
    assert sim.tick(110.4) == []
    log = checkpoint_at(sim, 110.5, cost=0.5)
    assert sim.m.generation == 1
    # C = 0.5 s, M = 10.5 s (no failure): sqrt(2 x 0.5 x 10.5)
    chosen = math.sqrt(2 * 0.5 * 10.5)
    assert sim.m.interval == pytest.approx(chosen)
    assert sim.m.status()["checkpoint_interval"] == round(chosen, 3)
    assert any(n.text.startswith("interval (auto): ") for n in of_type(log, Notice))
    # counted from when the trees ran again (111.0)
    assert sim.tick(111.0 + chosen - 0.01) == []
    assert sent(sim.tick(111.0 + chosen), Barrier)


def test_a_failure_shortens_the_interval_at_once():
    sim = Sim(3, now=0.0, interval_auto=True)
    sim.tick(0.0)
    checkpoint_at(sim, 10.0, cost=0.5)
    checkpoint_at(sim, 500.0, cost=0.5)   # (no tick in between: long overdue)
    before = sim.m.interval
    sim.now = 600.0
    killed_by_signal(sim, 2)
    assert sim.m.auto_interval.failures == 1
    assert sim.m.interval == pytest.approx(math.sqrt(2 * 0.5 * 600.0 / 2))
    assert sim.m.interval < before
    assert sim.m._next_interval == pytest.approx(600.0 + sim.m.interval)
    # its neighbour, lost in the same moment, is the same failure
    sim.now = 601.0
    killed_by_signal(sim, 3)
    assert sim.m.auto_interval.failures == 1


def test_trees_lost_during_a_recovery_are_its_failure():
    sim = checkpointed(3, policy=RecoveryPolicy(auto_restart=True, heartbeat=0),
                       interval_auto=True)
    sim.now = 100.0
    killed_by_signal(sim, 1)
    assert sim.m.recovery is not None and sim.m.auto_interval.failures == 1
    sim.now = 200.0          # past SAME_FAILURE, but still the recovery's
    killed_by_signal(sim, 2)
    assert sim.m.auto_interval.failures == 1


def test_measured_in_fixed_mode_too_and_i_auto_uses_it():
    sim = Sim(1, now=0.0, interval=30.0)
    sim.tick(0.0)
    checkpoint_at(sim, 30.0, cost=2.0)
    assert sim.m.interval == 30.0 and sim.m.auto_interval.cost() == 2.0
    actions = sim.m.set_interval(CLIENT, 0, now=1000.0, auto=True)
    chosen = math.sqrt(2 * 2.0 * 1000.0)
    [reply] = of_type(actions, ReplyClient)
    assert on_the_wire(reply.message) == Reply(
        ok=True, body={"interval": round(chosen, 3), "interval_auto": True})
    assert sim.m.interval == pytest.approx(chosen)
    assert sim.m._next_interval == pytest.approx(1000.0 + chosen)


def test_a_number_leaves_auto_mode():
    sim = Sim(1, now=0.0, interval_auto=True)
    sim.m.set_interval(None, 7, now=5.0)
    st = sim.m.status()
    assert st["interval_auto"] is False and st["checkpoint_interval"] == 7.0
    sim.tick(5.0)
    checkpoint_at(sim, 12.0, cost=0.25)
    assert sim.m.interval == 7.0   # measured, but not followed
    assert sim.m.set_interval(None, 0, now=20.0) == []
    assert sim.m.interval == 0.0 and sim.tick(1e9) == []


def test_failed_and_stopping_checkpoints_are_not_costs():
    sim = Sim(2, now=0.0, interval_auto=True)
    sim.tick(0.0)
    sim.tick(10.0)
    sim.now = 11.0
    sim.step(State.SUSPENDED)
    sim.report(1, State.FD_LEADER_ELECTION, ok=False, error="boom")
    sim.advance_to(None)
    assert sim.m.generation == 0 and sim.m.auto_interval.cost() is None
    sim.checkpoint(None, stop=True)
    sim.advance_to(None)
    assert sim.m.generation == 1 and sim.m.auto_interval.cost() is None


# ---- what users type and read ------------------------------------------------------------

def test_the_command_message_carries_auto():
    msg = on_the_wire(Command(cmd=Cmd.INTERVAL, auto=True))
    assert msg.auto and msg.seconds == 0.0
    assert not on_the_wire(Command(cmd=Cmd.INTERVAL, seconds=3)).auto


@pytest.mark.parametrize("text, value", [("auto", AUTO), (" AUTO", AUTO), ("2.5", 2.5),
                                         ("0", 0.0), (3, 3.0)])
def test_interval_option_values(text, value):
    assert INTERVAL.convert(text, None, None) == value


@pytest.mark.parametrize("text", ["banana", "-1", "inf", "nan", ""])
def test_interval_option_refuses(text):
    with pytest.raises(click.BadParameter):
        INTERVAL.convert(text, None, None)


def test_status_line():
    base = {"num_peers": 1, "running": True, "generation": 2, "checkpoint_interval": 6.2847}
    assert "CKPT_INTERVAL=6.3 (auto)" in status_lines({**base, "interval_auto": True})
    assert "CKPT_INTERVAL=6.2847" in status_lines({**base, "interval_auto": False})
    assert "CKPT_INTERVAL=6.2847" in status_lines(base)   # an older coordinator's status


def test_console_i_auto():
    class Server:
        port = 7779

        def __init__(self):
            self.machine = Sim(1, now=0.0).m

        def apply(self, actions):
            pass

    server = Server()
    assert console.handle("i auto", server).startswith("checkpoint interval: auto, ")
    assert server.machine.interval_auto
    assert console.handle("i 4", server) == "checkpoint interval: 4 s"
    assert not server.machine.interval_auto
    assert console.handle("i banana", server) == "usage: i SECONDS|auto"
    assert console.handle("i inf", server) == "usage: i SECONDS|auto"
    assert server.machine.interval == 4.0
