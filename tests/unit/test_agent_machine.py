"""The agent's sans-IO machine, alone and with many agents in memory
against the coordinator's machine."""
from __future__ import annotations

import signal

import pytest

from dmtcp_py.agent import records
from dmtcp_py.agent.machine import (
    COMMIT_TIMEOUT,
    ROUND_END_TIMEOUT,
    TRAFFIC_EVERY,
    AbandonRestart,
    AgentMachine,
    Discard,
    DoWork,
    DropLink,
    GiveBack,
    Identity,
    KillTree,
    Publish,
    Rejoin,
    ReportPeers,
    SampleLoad,
    SampleTraffic,
    Send,
    SettleExpired,
    Step,
    TellShims,
    ToNetwork,
    WaitForCommit,
    WaitForRoundEnd,
    Work,
    WorkResult,
)
from dmtcp_py.coordinator.machine import CoordinatorMachine, GenerationComplete, ReplyClient, SendAgent
from dmtcp_py.protocol import messages
from dmtcp_py.protocol.states import State

ORDER = [(State.SUSPENDED, Work.SUSPEND), (State.FD_LEADER_ELECTION, Work.ELECT),
         (State.DRAINED, Work.DRAIN), (State.CHECKPOINTED, Work.DUMP),
         (State.REFILLED, Work.REFILL), (State.RUNNING, Work.RESUME)]
ROUND = [state for state, _ in ORDER]
WELCOME = messages.Welcome(comp_id="comp-1", agent_id=1)


def fresh() -> AgentMachine:
    m = AgentMachine(Identity("tree-1", "prog"))
    m.welcomed(WELCOME)
    return m


def restarting(generation: int = 4) -> AgentMachine:
    m = AgentMachine(Identity("tree-1", "prog", restart_comp_id="comp-0",
                              restart_generation=generation, restart_trees=3))
    m.welcomed(WELCOME)
    return m


def barrier(state: State, generation: int = 1, **fields) -> messages.Barrier:
    return messages.Barrier(state=state, generation=generation, **fields)


def step_of(actions: list) -> Step:
    [action] = actions
    assert isinstance(action, DoWork), actions
    return action.step


def reached(actions: list) -> messages.Reached:
    if actions[-1:] == [ReportPeers()]:  # (after the release that ends a restart)
        actions = actions[:-1]
    *before, action = actions
    assert all(isinstance(a, Publish) for a in before), actions  # (a release publishes)
    assert isinstance(action, Send) and isinstance(action.message, messages.Reached), actions
    return action.message


def go(m: AgentMachine, state: State, generation: int = 1, result: WorkResult | None = None,
       **fields) -> messages.Reached:
    """One barrier: the work named, carried out with result, reported."""
    step = step_of(m.on_message(barrier(state, generation, **fields)))
    if result is None:
        result = WorkResult(pending=f"images-{generation}", parked=frozenset({11, 12})) \
            if step.work is Work.DUMP else WorkResult()
    return reached(m.work_done(step, result))


def go_through(m: AgentMachine, states, generation: int = 1, **fields) -> None:
    for state in states:
        assert go(m, state, generation, **fields).ok


# ---- one agent, one round ------------------------------------------------------------

def test_a_checkpoint_names_each_barriers_work_in_order():
    m = fresh()
    assert m.state is State.RUNNING and m.running
    for state, work in ORDER:
        step = step_of(m.on_message(barrier(state)))
        assert step.work is work and step.target is state and step.generation == 1
        assert m.work_done(step, WorkResult()) == [Send(messages.Reached(state=state, ok=True))]
    assert m.state is State.RUNNING and m.running


def test_a_precopy_runs_with_the_program_running_and_the_round_goes_on_from_there():
    """PRECOPIED: its work is the pre-copy, the program running (a process
    that connects then is neither suspended nor released); the hello says
    the tree wants one; a round given up there may begin again."""
    m = AgentMachine(Identity("tree-1", "prog", precopy=True))
    assert m.hello("tok", "host", 7).precopy
    m.welcomed(WELCOME)
    step = step_of(m.on_message(barrier(State.PRECOPIED)))
    assert step.work is Work.PRECOPY and step.target is State.PRECOPIED
    assert m.running and not m.owes_suspend(False) and not m.owes_resume(False)
    assert m.work_done(step, WorkResult()) == [
        Send(messages.Reached(state=State.PRECOPIED, ok=True))]
    assert m.state is State.PRECOPIED and m.running
    # (its coordinator went away there: the next one's round begins anew)
    again = step_of(m.on_message(barrier(State.PRECOPIED, 2)))
    assert again.work is Work.PRECOPY
    m.work_done(again, WorkResult())
    go_through(m, ROUND, 2)
    assert m.state is State.RUNNING and m.running


def test_a_tree_without_sockets_says_so_and_accepts_a_round_that_skips_their_barriers():
    m = fresh()
    step = step_of(m.on_message(barrier(State.SUSPENDED)))
    assert m.work_done(step, WorkResult(sockets=False)) == [
        Send(messages.Reached(state=State.SUSPENDED, ok=True, sockets=False))]
    dump = step_of(m.on_message(barrier(State.CHECKPOINTED)))
    assert dump.work is Work.DUMP
    reached(m.work_done(dump, WorkResult(pending="images-1", parked=frozenset({11, 12}))))
    m.on_message(messages.Commit(generation=1, ok=True))
    release = step_of(m.on_message(barrier(State.RUNNING)))
    assert release.work is Work.RESUME and release.bring_back
    assert release.expect_pids == frozenset({11, 12})
    assert isinstance(m.work_done(release, WorkResult())[0], Publish)  # published once running
    assert m.state is State.RUNNING and m.running


@pytest.mark.parametrize("fields, lets_go", [
    ({}, True),                                  # alone, socketless, goes on
    ({"num_trees": 2}, False),                   # another tree's dump may still be under way
    ({"stop": True}, False),                     # the tree ends with its dump
    ({"move": messages.Move.GO}, False),         # its image is restored elsewhere at once
])
def test_a_dump_lets_the_processes_go_only_when_nothing_waits_for_them(fields, lets_go):
    m = fresh()
    m.work_done(step_of(m.on_message(barrier(State.SUSPENDED))), WorkResult(sockets=False))
    dump = step_of(m.on_message(barrier(State.CHECKPOINTED, **fields)))
    assert dump.work is Work.DUMP and dump.let_go is lets_go


def test_a_tree_with_sockets_is_never_let_go_at_its_dump():
    m = fresh()
    m.work_done(step_of(m.on_message(barrier(State.SUSPENDED))), WorkResult(sockets=True))
    for state in ROUND[1:4]:
        step = step_of(m.on_message(barrier(state)))
        assert not step.let_go
        m.work_done(step, WorkResult())


@pytest.mark.parametrize("result", [WorkResult(), WorkResult(error="stuck", sockets=False)])
def test_a_tree_with_sockets_or_a_failed_suspend_keeps_every_barrier(result):
    m = fresh()
    step = step_of(m.on_message(barrier(State.SUSPENDED)))
    assert reached(m.work_done(step, result)).sockets
    refused = reached(m.on_message(barrier(State.CHECKPOINTED)))
    assert not refused.ok and "illegal transition" in refused.error
    assert m.state is State.SUSPENDED


def test_a_restart_with_sockets_is_never_released_without_its_refill():
    m = restarting()
    assert reached(m.restored(frozenset({5}))).sockets
    refused = reached(m.on_message(barrier(State.RUNNING, 4)))
    assert not refused.ok and m.state is State.CHECKPOINTED


def test_a_restart_without_sockets_may_be_released_after_its_restore():
    m = restarting()
    assert not reached(m.restored(frozenset({5}), sockets=False)).sockets
    release = step_of(m.on_message(barrier(State.RUNNING, 4)))
    assert release.work is Work.RESUME and release.bring_back
    assert release.expect_pids == frozenset({5})
    assert release.resume_arg == 4 | records.RESUME_RESTORED


def test_a_process_back_while_suspended_waits_inside_a_round_and_is_released_outside():
    m = fresh()
    assert m.owes_resume(True) and not m.owes_resume(False)
    for state in ROUND[:-1]:
        go(m, state)
        assert not m.owes_resume(True)
    go(m, State.RUNNING)
    assert m.owes_resume(True)


def test_a_process_that_joins_running_during_a_round_is_suspended_first():
    m = fresh()
    assert not m.owes_suspend(False) and not m.owes_suspend(True)
    for state in ROUND[:-1]:
        go(m, state)
        assert m.owes_suspend(False) and not m.owes_suspend(True)
    # once the RESUME went out, one that connects running stays running
    step = step_of(m.on_message(barrier(State.RUNNING)))
    assert not m.owes_suspend(False)
    m.work_done(step, WorkResult())
    assert not m.owes_suspend(False)


@pytest.mark.parametrize("state", [State.FD_LEADER_ELECTION, State.DRAINED, State.CHECKPOINTED,
                                   State.REFILLED, State.RUNNING])
def test_a_barrier_out_of_turn_is_refused_and_changes_nothing(state):
    m = fresh()
    refusal = reached(m.on_message(barrier(state)))
    assert refusal.ok is False and refusal.state is state
    assert f"illegal transition RUNNING -> {state.value}" in refusal.error
    assert m.state is State.RUNNING and m.running


def test_the_same_barrier_twice_is_refused():
    m = fresh()
    go(m, State.SUSPENDED)
    assert reached(m.on_message(barrier(State.SUSPENDED))).ok is False
    assert m.state is State.SUSPENDED


@pytest.mark.parametrize("failing", ROUND)
def test_a_failure_at_any_step_is_reported_and_the_tree_goes_on(failing):
    m = fresh()
    for state in ROUND:
        result = WorkResult(error=f"{state.value} broke") if state is failing else None
        answer = go(m, state, result=result)
        assert answer.ok is (state is not failing)
        if state is failing:
            assert answer.error == f"{state.value} broke"
    assert m.state is State.RUNNING and m.running
    assert (m.pending is None) is (failing is State.CHECKPOINTED)


def test_a_dump_reports_its_image_and_nothing_else_does():
    m = fresh()
    go_through(m, ROUND[:3])
    image = messages.ImageInfo(path="/c/x", host="h", tree_id="tree-1", program="prog", bytes=5)
    answer = go(m, State.CHECKPOINTED, result=WorkResult(image=image, pending="p"))
    assert answer.image == image
    # an image given with another step is not sent
    step = step_of(m.on_message(barrier(State.REFILLED)))
    assert reached(m.work_done(step, WorkResult(image=image))).image is None


def test_a_drain_reports_the_connections_leading_out_and_those_it_could_not_drain():
    m = fresh()
    go_through(m, ROUND[:2])
    answer = go(m, State.DRAINED, result=WorkResult(external=("a -> b",), failed_conns=("x|y",)))
    assert answer.external == ("a -> b",) and answer.failed_conns == ("x|y",)


def test_a_step_carries_what_its_work_needs():
    m = fresh()
    go_through(m, ROUND[:3], generation=9)
    dump = step_of(m.on_message(barrier(State.CHECKPOINTED, 9, stop=True, num_trees=4)))
    assert (dump.generation, dump.stop, dump.num_trees, dump.comp_id) == (9, True, 4, "comp-1")
    m.work_done(dump, WorkResult(pending="p", parked=frozenset({5, 6})))
    refill = step_of(m.on_message(barrier(State.REFILLED, 9, failed_conns=("a|b",))))
    assert refill.failed_conns == frozenset({"a|b"}) and refill.expect_pids == frozenset({5, 6})


def test_a_failed_dump_still_waits_for_the_processes_that_detached():
    m = fresh()
    go_through(m, ROUND[:3])
    go(m, State.CHECKPOINTED, result=WorkResult(error="criu failed", parked=frozenset({7})))
    assert m.pending is None
    assert step_of(m.on_message(barrier(State.REFILLED))).expect_pids == frozenset({7})


# ---- images and the commit -------------------------------------------------------------

def test_images_are_dropped_at_once_when_their_commit_says_so():
    m = fresh()
    go_through(m, ROUND[:4], generation=7)
    assert m.pending is not None and m.pending.generation == 7
    assert m.on_message(messages.Commit(generation=6, ok=True)) == []
    assert m.on_message(messages.Commit(generation=7, ok=False)) == [Discard(7, "images-7")]
    assert m.on_message(messages.Commit(generation=7, ok=False)) == []  # only once
    assert m.pending is None


def test_committed_images_are_published_once_the_tree_runs_again():
    """The commit comes while the tree is still stopped: hashing and
    writing its images back waits until the release, not to slow it."""
    m = fresh()
    go_through(m, ROUND[:4], generation=7)
    assert m.on_message(messages.Commit(generation=6, ok=True)) == []
    assert m.on_message(messages.Commit(generation=7, ok=True)) == []
    assert m.pending is None
    refill = step_of(m.on_message(barrier(State.REFILLED, 7)))
    assert m.work_done(refill, WorkResult()) == [
        Send(messages.Reached(state=State.REFILLED, ok=True))]
    resume = step_of(m.on_message(barrier(State.RUNNING, 7)))
    assert m.work_done(resume, WorkResult()) == [
        Publish(7, "images-7"), Send(messages.Reached(state=State.RUNNING, ok=True))]
    # only once
    go_through(m, ROUND, generation=8)
    assert Publish(7, "images-7") not in m.on_message(messages.Commit(generation=7, ok=True))


def test_a_tree_that_its_checkpoint_stopped_publishes_at_the_commit():
    m = fresh()
    go_through(m, ROUND[:3], generation=7)
    go(m, State.CHECKPOINTED, 7, stop=True)
    assert m.on_message(messages.Commit(generation=7, ok=True)) == [Publish(7, "images-7")]


@pytest.mark.parametrize("then", ["coordinator lost", "kill"])
def test_committed_images_are_published_also_without_a_release(then):
    m = fresh()
    go_through(m, ROUND[:4], generation=7)
    assert m.on_message(messages.Commit(generation=7, ok=True)) == []
    actions = m.coordinator_lost() if then == "coordinator lost" \
        else m.on_message(messages.Kill())
    assert actions.count(Publish(7, "images-7")) == 1


def test_a_commit_without_images_is_ignored():
    m = fresh()
    assert m.on_message(messages.Commit(generation=1, ok=True)) == []


def test_publishing_is_reported_with_its_outcome():
    m = fresh()
    assert m.published(3) == [Send(messages.Published(generation=3, ok=True))]
    assert m.published(3, "disk full") == [
        Send(messages.Published(generation=3, ok=False, error="disk full"))]


def test_generation_done_tells_the_processes_and_remembers_the_generation():
    m = fresh()
    assert m.on_message(messages.GenerationDone(generation=2, ok=True)) == [
        TellShims(records.DONE, 2), SettleExpired(2, True)]
    assert m.published_generation == 2
    assert m.on_message(messages.GenerationDone(generation=3, ok=False)) == [
        TellShims(records.DONE, 3 | records.DONE_FAILED), SettleExpired(3, False)]
    assert m.published_generation == 2


def test_an_agent_whose_tree_ended_waits_for_the_end_of_the_round_it_published_in():
    m = fresh()
    assert m.ending() == []  # nothing published
    m.published(4)
    m.published(5, error="disk full")  # (not published: nothing to settle)
    assert m.unsettled == {4}
    m.tree_exited(0)
    assert m.ending() == [WaitForRoundEnd(ROUND_END_TIMEOUT)]
    # a round started meanwhile does not reach the ended tree
    refused = m.on_message(messages.Barrier(state=State.SUSPENDED, generation=6))
    assert [type(a.message) for a in refused] == [messages.Reached]
    assert refused[0].message.ok is False
    m.on_message(messages.GenerationDone(generation=4, ok=True))
    assert m.unsettled == set() and m.ending() == []


def test_no_round_end_is_waited_for_without_a_coordinator():
    m = fresh()
    m.published(4)
    m.coordinator_lost()
    assert m.ending() == []
    # nor, after a rejoin, for the round the lost coordinator never ended
    m.welcomed(messages.Welcome(comp_id="c", agent_id=2))
    assert m.linked and m.ending() == []


def test_a_stopping_checkpoint_ends_the_agent_with_success():
    m = fresh()
    go_through(m, ROUND[:4], stop=True)
    assert m.stopped_by_checkpoint and m.exit_code(-9) == 0


def test_the_agent_exits_with_the_programs_status_otherwise():
    m = fresh()
    go_through(m, ROUND)
    assert m.exit_code(3) == 3 and m.exit_code(None) == 0


def test_a_tree_that_ends_with_images_waiting_waits_for_the_commit_a_while():
    m = fresh()
    go_through(m, ROUND[:4], stop=True)
    ended = Send(messages.TreeEnded(code=-9, checkpointed=True))
    assert m.tree_exited(-9) == [ended, WaitForCommit(COMMIT_TIMEOUT)]
    assert m.commit_timed_out() == [Discard(1, "images-1")]
    assert m.exit_code(-9) == -9  # (the program was in those images only)
    assert m.commit_timed_out() == []


def test_a_stopped_tree_whose_coordinator_goes_after_the_commit_ended_well():
    # --exit-after-ckpt: the coordinator ends right after the round (seen in CI:
    # the launch exited 137 when the link's end came before the agent's own)
    m = fresh()
    go_through(m, ROUND[:4], stop=True)
    assert m.on_message(messages.Commit(generation=1, ok=True)) == [Publish(1, "images-1")]
    m.tree_exited(-9)
    assert m.coordinator_lost() == [Rejoin()]  # (nothing to give back to a dead tree)
    assert m.exit_code(-9) == 0 and m.stop_lost is None


@pytest.mark.parametrize("then", ["coordinator lost", "failed commit"])
def test_a_stopped_tree_whose_images_are_dropped_did_not_end_well(then):
    m = fresh()
    go_through(m, ROUND[:4], stop=True)
    actions = m.coordinator_lost() if then == "coordinator lost" \
        else m.on_message(messages.Commit(generation=1, ok=False))
    assert Discard(1, "images-1") in actions
    assert not [a for a in actions if isinstance(a, GiveBack)]
    assert m.exit_code(-9) == -9
    assert m.stop_lost and "generation 1" in m.stop_lost


def test_a_tree_that_ends_after_its_commit_has_nothing_to_wait_for():
    m = fresh()
    go_through(m, ROUND[:4], stop=True)
    m.on_message(messages.Commit(generation=1, ok=True))
    assert m.tree_exited(-9) == [Send(messages.TreeEnded(code=-9, checkpointed=True))]


# ---- restart --------------------------------------------------------------------------------

def test_a_restart_enters_at_checkpointed():
    m = restarting()
    assert m.state is State.RESTARTING and not m.owes_resume(True)
    assert reached(m.on_message(barrier(State.SUSPENDED))).ok is False
    assert m.restored(frozenset({3, 4})) == [
        Send(messages.Reached(state=State.CHECKPOINTED, ok=True))]
    refill = step_of(m.on_message(barrier(State.REFILLED, 4)))
    assert refill.expect_pids == frozenset({3, 4})
    m.work_done(refill, WorkResult())
    go(m, State.RUNNING, 4)
    assert m.state is State.RUNNING and m.owes_resume(True)


def test_a_failed_restore_is_reported_and_stays_restarting():
    m = restarting()
    failed = reached(m.restored(error="criu restore failed"))
    assert failed.ok is False and failed.error == "criu restore failed"
    assert m.state is State.RESTARTING


def test_the_release_after_a_restart_says_so_once():
    m = restarting(generation=4)
    m.restored()
    go(m, State.REFILLED, 4)
    assert m.resume_arg() == 4 | records.RESUME_RESTORED
    release = step_of(m.on_message(barrier(State.RUNNING, 4)))
    assert release.resume_arg == 4 | records.RESUME_RESTORED
    # the restored processes are listed as soon as they run again
    assert m.work_done(release, WorkResult()) == [
        Send(messages.Reached(state=State.RUNNING, ok=True)), ReportPeers()]
    assert m.resume_arg() == 4  # a process that comes back late: not restarted again
    go_through(m, ROUND[:-1], generation=5)
    release = step_of(m.on_message(barrier(State.RUNNING, 5)))
    assert release.resume_arg == 5
    assert ReportPeers() not in m.work_done(release, WorkResult())  # (the same processes)


def test_hello_says_launch_restart_or_rejoin():
    launched = AgentMachine(Identity("t", "p"))
    hello = launched.hello("tok", "h", 42)
    assert (hello.role, hello.token, hello.host, hello.pid, hello.tree_id) == (
        messages.Role.AGENT, "tok", "h", 42, "t")
    assert not hello.restart and not hello.rejoin
    back = AgentMachine(Identity("t", "p", restart_comp_id="c0", restart_generation=4,
                                 restart_trees=3)).hello("tok", "h", 42)
    assert back.restart and (back.comp_id, back.generation, back.num_trees) == ("c0", 4, 3)


# ---- the coordinator lost -------------------------------------------------------------------

def test_losing_the_coordinator_outside_a_round_only_tries_again():
    m = fresh()
    assert m.coordinator_lost() == [Rejoin()]
    assert m.running and m.state is State.RUNNING


@pytest.mark.parametrize("reached_so_far", range(1, 6))
def test_a_round_without_its_coordinator_is_abandoned_and_the_tree_runs(reached_so_far):
    m = fresh()
    go_through(m, ROUND[:reached_so_far], generation=3)
    dumped = reached_so_far >= 4
    actions = m.coordinator_lost()
    expected = [Discard(3, "images-3")] if dumped else []
    pids = frozenset({11, 12}) if dumped else frozenset()
    assert actions == expected + [GiveBack(pids, 0), Rejoin()]
    assert m.running and m.state is State.RUNNING and m.pending is None
    assert m.on_message(messages.Commit(generation=3, ok=True)) == []  # images dropped
    assert m.owes_resume(True)  # a process still suspended is released at once


@pytest.mark.parametrize("reached_so_far", [0, 1, 2])  # restored, waiting, refilled
def test_a_restart_not_yet_released_is_given_up_without_its_coordinator(reached_so_far):
    """Its tree is killed, never given back to run half-restored, nor
    rejoined; the agent ends with the one line the machine says."""
    m = restarting(generation=4)
    if reached_so_far:
        m.restored(frozenset({3}))
    if reached_so_far > 1:
        go(m, State.REFILLED, 4)
    [abandon] = m.coordinator_lost()
    assert isinstance(abandon, AbandonRestart) and abandon.why == m.abandoned
    assert "generation 4" in m.abandoned and "intact" in m.abandoned
    assert not m.running and not m.linked
    if not reached_so_far:  # CRIU was still restoring: what it brings back is killed
        assert m.restored(frozenset({3})) == [AbandonRestart(m.abandoned)]


def test_a_restart_released_or_killed_is_not_given_up():
    released = restarting(generation=4)
    released.restored(frozenset({3}))
    go_through(released, ROUND[4:], generation=4)
    assert released.coordinator_lost() == [Rejoin()] and released.abandoned is None
    killed = restarting(generation=4)  # a Kill, then the coordinator goes (quit)
    killed.restored(frozenset({3}))
    assert killed.on_message(messages.Kill()) == [KillTree()]
    assert not [a for a in killed.coordinator_lost() if isinstance(a, AbandonRestart)]
    assert killed.abandoned is None


def test_a_rejoin_says_the_computation_and_the_last_published_generation():
    m = fresh()
    go_through(m, ROUND[:4], generation=1)
    m.on_message(messages.Commit(generation=1, ok=True))
    go_through(m, ROUND[4:])
    m.on_message(messages.GenerationDone(generation=1, ok=True))
    m.coordinator_lost()
    hello = m.hello("tok", "h", 1)
    assert hello.rejoin and not hello.restart
    assert (hello.comp_id, hello.generation) == ("comp-1", 1)
    # the new coordinator hears of the processes, and the next round works
    assert m.welcomed(messages.Welcome(comp_id="comp-1", agent_id=8)) == [ReportPeers()]
    go_through(m, ROUND, generation=2)
    assert m.state is State.RUNNING


def test_a_restarted_tree_rejoins_as_its_computation():
    m = restarting(generation=4)
    m.restored()
    go_through(m, ROUND[4:], generation=4)
    m.coordinator_lost()
    hello = m.hello("tok", "h", 1)
    assert hello.rejoin and (hello.comp_id, hello.generation) == ("comp-1", 4)


def test_images_of_a_tree_that_ended_without_a_coordinator_are_dropped_at_once():
    m = fresh()
    go_through(m, ROUND[:4], stop=True)
    m.linked = False  # the link broke while the stopped tree was ending
    assert m.tree_exited(-9) == [Discard(1, "images-1")]


# ---- other messages ------------------------------------------------------------------------------

def test_kill_kills_the_tree():
    assert fresh().on_message(messages.Kill()) == [KillTree()]


@pytest.mark.parametrize("msg", [
    messages.Matched(generation=1, peers={"a>b": messages.ConnMatch("a|b", "a")}),
    messages.Found(key="k", value="198.18.0.1:5"),
    messages.Relay(conn="a|b", data="AAAA")])
def test_connection_messages_go_to_the_network_side(msg):
    assert fresh().on_message(msg) == [ToNetwork(msg)]


def test_a_program_asking_for_a_checkpoint_is_passed_on_while_linked():
    m = fresh()
    assert m.ckpt_requested() == [Send(messages.CkptRequest())]
    m.coordinator_lost()
    assert m.ckpt_requested() == []


# ---- many agents against the coordinator ----------------------------------------------------

def hello(i: int) -> messages.Hello:
    return messages.Hello(role=messages.Role.AGENT, token="t", host=f"h{i}", pid=i,
                          program="p", tree_id=f"t{i}")


class Computation:
    """A coordinator machine and N agent machines, messages carried in memory,
    the work of each step done at once (a dump fails where told)."""

    def __init__(self, n: int, fail_dump: set[int] = frozenset(),
                 fail_drain: dict[int, tuple[str, ...]] | None = None,
                 with_sockets: set[int] | None = None) -> None:
        self.coord = CoordinatorMachine("comp")
        self.agents = {i: fresh() for i in range(1, n + 1)}
        self.fail_dump = fail_dump
        # the trees that have sockets to hand over (None: all of them)
        self.with_sockets = set(self.agents) if with_sockets is None else with_sockets
        self.fail_drain = fail_drain or {}
        self.verdicts: dict[int, type] = {}
        self.steps: dict[int, list[Step]] = {i: [] for i in self.agents}
        self.replies: list = []
        self.completed: list[GenerationComplete] = []
        for i in self.agents:
            self.coord.agent_joined(i, hello(i), 0.0)

    def carry(self, actions: list) -> None:
        queue = list(actions)
        while queue:
            action = queue.pop(0)
            if isinstance(action, GenerationComplete):
                self.completed.append(action)
            elif isinstance(action, ReplyClient):
                self.replies.append(action.message)
            elif isinstance(action, SendAgent):
                for done in self.agents[action.agent_id].on_message(action.message):
                    queue += self._agent_action(action.agent_id, done)

    def _agent_action(self, i: int, action) -> list:
        agent = self.agents[i]
        if isinstance(action, Send):
            return self.coord.agent_message(i, action.message, 0.0)
        if isinstance(action, DoWork):
            self.steps[i].append(action.step)
            out = []
            for done in agent.work_done(action.step, self._work(i, action.step)):
                out += self._agent_action(i, done)
            return out
        if isinstance(action, (Publish, Discard)):
            self.verdicts[i] = type(action)
            if isinstance(action, Publish):
                return [a for done in agent.published(action.generation)
                        for a in self._agent_action(i, done)]
        return []

    def _work(self, i: int, step: Step) -> WorkResult:
        if step.work is Work.DRAIN and i in self.fail_drain:
            return WorkResult(error="drain failed", failed_conns=self.fail_drain[i])
        if step.work is Work.SUSPEND:
            return WorkResult(sockets=i in self.with_sockets)
        if step.work is not Work.DUMP:
            return WorkResult()
        if i in self.fail_dump:
            return WorkResult(error="disk full")
        image = messages.ImageInfo(path=f"/c/{i}", host=f"h{i}", tree_id=f"t{i}",
                                   program="p", bytes=1)
        return WorkResult(image=image, pending=f"images-{i}", parked=frozenset({i * 10}))


def test_a_tree_alone_without_sockets_runs_again_at_its_dump_through_the_coordinator():
    comp = Computation(1, with_sockets=set())
    comp.carry(comp.coord.request_checkpoint(1, 0.0, blocking=True))
    [steps] = comp.steps.values()
    assert [(s.work, s.let_go) for s in steps] == [
        (Work.SUSPEND, False), (Work.DUMP, True), (Work.RESUME, False)]
    comp.with_sockets = {1}
    steps.clear()
    comp.carry(comp.coord.request_checkpoint(1, 0.0, blocking=True))
    assert not any(s.let_go for s in steps) and len(steps) == len(ORDER)


def test_two_hundred_agents_checkpoint_and_publish():
    comp = Computation(200)
    comp.carry(comp.coord.request_checkpoint(1, 0.0, blocking=True))
    assert set(comp.verdicts.values()) == {Publish} and len(comp.verdicts) == 200
    assert len(comp.completed) == 1 and len(comp.completed[0].images) == 200
    assert comp.replies[-1].ok is True
    assert all(a.state is State.RUNNING and a.running for a in comp.agents.values())


def test_a_round_where_no_tree_has_sockets_skips_election_drain_and_refill():
    comp = Computation(5, with_sockets=set())
    comp.carry(comp.coord.request_checkpoint(1, 0.0, blocking=True))
    for i, steps in comp.steps.items():
        assert [s.work for s in steps] == [Work.SUSPEND, Work.DUMP, Work.RESUME]
        # no REFILL waited for the processes the dump detached: the release does
        assert steps[-1].bring_back and steps[-1].expect_pids == frozenset({i * 10})
        # (five trees: each waits for the others' dumps)
        assert not steps[1].let_go
    assert len(comp.completed) == 1 and comp.replies[-1].ok is True
    assert set(comp.verdicts.values()) == {Publish} and len(comp.verdicts) == 5
    assert all(a.state is State.RUNNING and a.running for a in comp.agents.values())
    # the next round asks again: now one tree has a socket, and every tree drains
    comp.with_sockets = {3}
    for steps in comp.steps.values():
        steps.clear()
    comp.carry(comp.coord.request_checkpoint(1, 0.0, blocking=True))
    assert comp.replies[-1].ok is True
    for steps in comp.steps.values():
        assert [s.work for s in steps] == [w for _, w in ORDER]
        assert not any(s.bring_back for s in steps)


def test_one_failed_dump_makes_every_agent_drop_its_images():
    comp = Computation(50, fail_dump={17})
    comp.carry(comp.coord.request_checkpoint(1, 0.0, blocking=True))
    assert set(comp.verdicts.values()) == {Discard}
    assert len(comp.verdicts) == 49  # the failed one has nothing to drop
    assert comp.completed == [] and comp.replies[-1].ok is False
    assert all(a.state is State.RUNNING for a in comp.agents.values())
    # and the next checkpoint works
    comp.fail_dump = set()
    comp.verdicts.clear()
    comp.carry(comp.coord.request_checkpoint(1, 0.0, blocking=True))
    assert len(comp.completed) == 1 and set(comp.verdicts.values()) == {Publish}


def test_a_connection_one_end_could_not_drain_is_not_refilled_at_either_end():
    comp = Computation(2, fail_drain={1: ("a|b",)})
    comp.carry(comp.coord.request_checkpoint(None, 0.0))
    for i in (1, 2):
        refill = next(s for s in comp.steps[i] if s.work is Work.REFILL)
        assert refill.failed_conns == frozenset({"a|b"})


def test_every_agent_of_a_round_whose_coordinator_died_runs_again():
    comp = Computation(20)
    actions = comp.coord.request_checkpoint(None, 0.0)
    # the coordinator dies once SUSPENDED is reached everywhere: the
    # barriers it would have sent next never arrive
    for action in actions:
        if isinstance(action, SendAgent):
            agent = comp.agents[action.agent_id]
            for done in agent.on_message(action.message):
                agent.work_done(done.step, WorkResult())
    for agent in comp.agents.values():
        assert agent.state is State.SUSPENDED and not agent.running
        assert agent.coordinator_lost() == [GiveBack(frozenset(), 0), Rejoin()]
        assert agent.running


# ---- how the tree ended; heartbeats ------------------------------------------------------------

@pytest.mark.parametrize("code", [0, 3, -9, -11])
def test_the_coordinator_hears_how_the_tree_ended(code):
    m = fresh()
    assert m.tree_exited(code) == [Send(messages.TreeEnded(code=code))]


def test_a_tree_killed_on_the_coordinators_word_says_so():
    m = fresh()
    assert m.on_message(messages.Kill()) == [KillTree()]
    assert m.tree_exited(-15) == [Send(messages.TreeEnded(code=-15, requested=True))]


def test_the_first_process_a_failure_signal_killed_goes_with_the_trees_end():
    m = fresh()
    assert m.process_killed(41, 13) == []          # SIGPIPE: how pipelines end
    assert m.process_killed(42, 15, name="w") == []  # SIGTERM: someone ended it
    assert m.process_killed(43, 9, name="solver") == []
    assert m.process_killed(44, 11, core=True, name="other") == []  # not the first
    killed = messages.KilledProcess(pid=43, signal=9, name="solver")
    assert m.tree_exited(1) == [Send(messages.TreeEnded(code=1, killed=killed))]


@pytest.mark.parametrize("signum, core, failure", [
    *[(s, False, True) for s in (signal.SIGKILL, signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT,
                                 signal.SIGILL, signal.SIGFPE, signal.SIGSYS)],
    *[(s, False, False) for s in (signal.SIGPIPE, signal.SIGTERM, signal.SIGINT, signal.SIGHUP,
                                  signal.SIGUSR1, signal.SIGQUIT)],
    (signal.SIGQUIT, True, True),  # any signal that dumped core
])
def test_which_signals_are_failures(signum, core, failure):
    m = fresh()
    m.process_killed(7, signum, core=core)
    assert (m.killed is not None) == failure
    assert records.failure_signal(signum, core) == failure


def test_a_kill_record_carries_pid_signal_and_core():
    arg = records.killed_arg(123456, 11, core=True)
    assert records.killed_of(arg) == (123456, 11, True)
    assert records.killed_of(records.killed_arg(5, 9)) == (5, 9, False)


def test_heartbeats_go_out_as_the_welcome_asks():
    m = AgentMachine(Identity("t1", "prog"))
    m.welcomed(messages.Welcome(comp_id="c", agent_id=1, heartbeat=1.0, heartbeat_timeout=5.0))
    assert _sends(m.tick(100.0, last_heard=100.0)) == [Send(messages.Heartbeat())]
    assert _sends(m.tick(100.5, last_heard=100.0)) == []
    assert _sends(m.tick(101.0, last_heard=100.2)) == [Send(messages.Heartbeat())]


def _sends(actions: list) -> list:
    return [a for a in actions if isinstance(a, Send)]


def test_a_silent_coordinator_is_dropped():
    m = AgentMachine(Identity("t1", "prog"))
    m.welcomed(messages.Welcome(comp_id="c", agent_id=1, heartbeat=1.0, heartbeat_timeout=5.0))
    actions = m.tick(106.0, last_heard=100.0)
    assert len(actions) == 1 and isinstance(actions[0], DropLink)
    assert "silent for 6.0 s" in actions[0].why


def test_no_heartbeats_without_a_coordinator_or_when_it_asks_for_none():
    m = AgentMachine(Identity("t1", "prog"))
    assert m.tick(100.0, last_heard=0.0) == []            # not linked
    m.welcomed(messages.Welcome(comp_id="c", agent_id=1))  # heartbeat 0
    assert _sends(m.tick(100.0, last_heard=0.0)) == []


def test_traffic_and_load_are_sampled_every_few_seconds_while_the_tree_runs():
    m = AgentMachine(Identity("t1", "prog"))
    assert m.tick(100.0, last_heard=0.0) == []  # not linked: nobody to tell
    m.welcomed(messages.Welcome(comp_id="c", agent_id=1))
    assert m.tick(100.0, last_heard=100.0) == [SampleTraffic(), SampleLoad()]
    assert m.tick(100.0 + TRAFFIC_EVERY / 2, last_heard=100.0) == []
    assert m.tick(100.0 + TRAFFIC_EVERY, last_heard=100.0) == [SampleTraffic(), SampleLoad()]
    m.running = False  # a round: the tree is stopped
    assert m.tick(100.0 + 3 * TRAFFIC_EVERY, last_heard=100.0) == []


def test_auto_restart_makes_the_processes_die_with_their_agent():
    m = AgentMachine(Identity("t1", "prog"))
    assert m.welcomed(messages.Welcome(comp_id="c", agent_id=1, auto_restart=True)) == [
        TellShims(records.FATE, 1)]
    assert m.die_with_agent
    m.coordinator_lost()
    # a coordinator without it: the processes run on if we go
    assert m.welcomed(messages.Welcome(comp_id="c", agent_id=2)) == [
        TellShims(records.FATE, 0), ReportPeers()]


def test_a_restarting_agent_names_its_image_in_hello():
    image = messages.ImageInfo(path="/ck/ckpt_p_t1.dmtcp", host="h", tree_id="t1", program="p")
    m = AgentMachine(Identity("t1", "p", restart_comp_id="comp-1", restart_generation=2,
                              restart_image=image))
    assert m.hello("tok", "h", 1).image == image


# ---- replicas (--replicas) ---------------------------------------------------------------

def test_replicas_the_agent_serves_once_and_tells_every_coordinator_where():
    from dmtcp_py.agent.machine import CopyImage, ServeReplicas
    m = AgentMachine(Identity("tree-1", "prog"))
    assert ServeReplicas() in m.welcomed(messages.Welcome(comp_id="c", agent_id=1, replicas=1))
    told = m.replica_service_started("198.18.0.2", 4000)
    assert told == [Send(messages.ReplicaService(address="198.18.0.2", port=4000))]
    m.coordinator_lost()
    again = m.welcomed(messages.Welcome(comp_id="c", agent_id=2, replicas=1))
    assert told[0] in again and ServeReplicas() not in again
    no_replicas = AgentMachine(Identity("tree-2", "prog"))
    assert not [a for a in no_replicas.welcomed(messages.Welcome(comp_id="c", agent_id=3))
                if isinstance(a, ServeReplicas)]
    target = messages.ReplicaTarget(host="h3", address="198.18.0.3", port=4001)
    order = messages.Replicate(generation=2, path="/ck/i.dmtcp", targets=(target,))
    assert m.on_message(order) == [CopyImage(2, "/ck/i.dmtcp", (target,))]
    assert m.replica_copied(2, "h3", error="disk full") == [Send(messages.Replicated(
        generation=2, host="h3", ok=False, error="disk full"))]


def test_a_tree_that_lost_a_process_is_not_checkpointed_again():
    """Its parent reaped a rank a SIGKILL took and is on its way out: an
    image of that would fail at every restart.  The dump's images are
    dropped and the checkpoint fails; the generation before stays."""
    from dmtcp_py.agent.machine import Discard
    m = fresh()
    go_through(m, ROUND[:3])   # up to DRAINED
    m.process_killed(4242, 9, name="solver")
    step = step_of(m.on_message(barrier(State.CHECKPOINTED)))
    actions = m.work_done(step, WorkResult(pending="images-1", parked=frozenset({11})))
    assert Discard(1, "images-1") in actions
    report = actions[-1].message
    assert not report.ok and report.image is None
    assert "solver (pid 4242) was killed by SIGKILL" in report.error
    assert m.pending is None


def test_a_zombie_a_signal_killed_is_told_from_one_that_exited(tmp_path):
    """tree.killed_zombie reads the wait status of an unreaped child."""
    import os
    import signal
    import time

    from dmtcp_py.agent.tree import killed_zombie
    killed, exited = os.fork(), None
    if killed == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    exited = os.fork()
    if exited == 0:
        os._exit(3)
    try:
        for pid in (killed, exited):  # zombies once /proc says Z
            deadline = time.monotonic() + 10
            while open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
                assert time.monotonic() < deadline
                time.sleep(0.01)
        name, signum, core = killed_zombie(killed)
        assert signum == signal.SIGKILL and not core and name
        assert killed_zombie(exited) is None
        assert killed_zombie(os.getpid()) is None   # alive
    finally:
        for pid in (killed, exited):
            os.waitpid(pid, 0)
    assert killed_zombie(killed) is None            # gone


def test_the_kills_of_a_dump_that_ends_the_tree_are_no_failure():
    """--stop (-kc, --exit-after-ckpt): CRIU SIGKILLs the tree after the
    dump, and its init reports them: that generation is kept, nothing lost."""
    m = fresh()
    go_through(m, ROUND[:3])
    step = step_of(m.on_message(barrier(State.CHECKPOINTED, stop=True)))
    m.process_killed(4242, 9, name="counter")       # while CRIU ends the tree
    report = reached(m.work_done(step, WorkResult(pending="images-1", parked=frozenset())))
    assert report.ok and m.pending is not None
    m.process_killed(4243, 9, name="counter")       # reaped after the dump
    assert m.killed is None
