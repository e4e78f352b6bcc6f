"""The agent's sans-IO machine, alone and with many agents in memory
against the coordinator's machine."""
from __future__ import annotations

import pytest

from dmtcp_py.agent.machine import RESUME_RESTORED, AgentMachine, Verdict, Work
from dmtcp_py.coordinator.machine import (CoordinatorMachine, GenerationComplete, ReplyClient,
                                          SendAgent)
from dmtcp_py.protocol import messages
from dmtcp_py.protocol.states import State

ORDER = [(State.SUSPENDED, Work.SUSPEND), (State.FD_LEADER_ELECTION, Work.ELECT),
         (State.DRAINED, Work.DRAIN), (State.CHECKPOINTED, Work.DUMP),
         (State.REFILLED, Work.REFILL), (State.RUNNING, Work.RESUME)]


def barrier_msg(state: State, generation: int = 1, stop: bool = False) -> dict:
    return messages.make("barrier", state=state.value, generation=generation, stop=stop,
                         num_trees=1)


def test_a_checkpoint_names_each_barriers_work_in_order():
    m = AgentMachine()
    assert m.state is State.RUNNING and m.running
    for state, work in ORDER:
        barrier, refusal = m.barrier(barrier_msg(state))
        assert refusal is None and barrier.work is work and barrier.generation == 1
        # between SUSPENDED and RUNNING a process that comes back suspended waits
        assert not m.owes_resume(True)
        reached = m.done(barrier)
        assert reached == messages.make("reached", state=state.value, ok=True)
    assert m.state is State.RUNNING and m.running and m.owes_resume(True)
    assert not m.owes_resume(False)


def test_a_barrier_out_of_turn_is_refused_and_changes_nothing():
    m = AgentMachine()
    barrier, refusal = m.barrier(barrier_msg(State.DRAINED))
    assert barrier is None and refusal["ok"] is False
    assert "illegal transition RUNNING -> DRAINED" in refusal["error"]
    barrier, refusal = m.barrier({"state": "BOGUS"})
    assert barrier is None and "unknown state" in refusal["error"]
    assert m.state is State.RUNNING and m.running


def test_failed_work_is_reported_and_the_tree_goes_on():
    m = AgentMachine()
    for state, _ in ORDER[:3]:
        m.done(m.barrier(barrier_msg(state))[0])
    barrier, _ = m.barrier(barrier_msg(State.CHECKPOINTED))
    reached = m.done(barrier, "criu dump failed")
    assert reached["ok"] is False and reached["error"] == "criu dump failed"
    assert m.state is State.CHECKPOINTED and m.pending_generation is None
    assert m.commit(messages.make("commit", generation=1, ok=False)) is None
    for state, _ in ORDER[4:]:
        assert m.done(m.barrier(barrier_msg(state))[0])["ok"]
    assert m.state is State.RUNNING


@pytest.mark.parametrize("ok,verdict", [(True, Verdict.PUBLISH), (False, Verdict.DISCARD)])
def test_images_wait_for_the_commit_of_their_generation(ok, verdict):
    m = AgentMachine()
    for state, _ in ORDER[:4]:
        m.done(m.barrier(barrier_msg(state, generation=7))[0], image={"path": "x"})
    assert m.pending_generation == 7
    assert m.commit(messages.make("commit", generation=6, ok=True)) is None
    assert m.commit(messages.make("commit", generation=7, ok=ok)) is verdict
    assert m.commit(messages.make("commit", generation=7, ok=ok)) is None  # only once


def test_a_stopping_checkpoint_is_remembered():
    m = AgentMachine()
    for state, _ in ORDER[:4]:
        m.done(m.barrier(barrier_msg(state, stop=True))[0])
    assert m.stopped_by_checkpoint


def test_restart_enters_at_checkpointed():
    m = AgentMachine(restarting=True)
    assert m.state is State.RESTARTING and not m.owes_resume(True)
    assert m.barrier(barrier_msg(State.SUSPENDED))[0] is None
    failed = m.restored(error="criu restore failed")
    assert failed["ok"] is False and m.state is State.RESTARTING
    assert m.restored() == messages.make("reached", state="CHECKPOINTED", ok=True)
    for state, work in ORDER[4:]:
        barrier, _ = m.barrier(barrier_msg(state))
        assert barrier.work is work
        m.done(barrier)
    assert m.state is State.RUNNING and m.owes_resume(True)


# ---- many agents against the coordinator ----------------------------------------

class Computation:
    """A coordinator machine and N agent machines, messages carried in memory."""

    def __init__(self, n: int, fail_dump: set[int] = frozenset()) -> None:
        self.coord = CoordinatorMachine("comp")
        self.agents = {i: AgentMachine() for i in range(1, n + 1)}
        self.fail_dump = fail_dump
        self.verdicts: dict[int, Verdict] = {}
        self.replies: list[dict] = []
        self.completed: list[GenerationComplete] = []
        for i in self.agents:
            self.coord.agent_joined(i, {"role": "agent", "token": "t", "host": f"h{i}",
                                        "pid": i, "program": "p", "tree_id": f"t{i}"}, 0.0)

    def carry(self, actions: list) -> None:
        queue = list(actions)
        while queue:
            action = queue.pop(0)
            if isinstance(action, GenerationComplete):
                self.completed.append(action)
            elif isinstance(action, ReplyClient):
                self.replies.append(action.message)
            elif isinstance(action, SendAgent):
                queue += self._deliver(action.agent_id, action.message)

    def _deliver(self, agent_id: int, msg: dict) -> list:
        agent = self.agents[agent_id]
        if msg["type"] == "barrier":
            barrier, refusal = agent.barrier(msg)
            assert refusal is None, refusal
            error = "disk full" if barrier.work is Work.DUMP and agent_id in self.fail_dump else None
            extra = {"image": {"path": f"/c/{agent_id}", "bytes": 1}} \
                if barrier.work is Work.DUMP and error is None else {}
            return self.coord.agent_message(agent_id, agent.done(barrier, error, **extra), 0.0)
        if msg["type"] == "commit":
            verdict = agent.commit(msg)
            if verdict is None:
                return []
            self.verdicts[agent_id] = verdict
            if verdict is Verdict.PUBLISH:
                return self.coord.agent_message(agent_id, messages.make(
                    "published", generation=msg["generation"], ok=True), 0.0)
        return []


def test_two_hundred_agents_checkpoint_and_publish():
    comp = Computation(200)
    comp.carry(comp.coord.request_checkpoint(1, 0.0, blocking=True))
    assert set(comp.verdicts.values()) == {Verdict.PUBLISH} and len(comp.verdicts) == 200
    assert len(comp.completed) == 1 and len(comp.completed[0].images) == 200
    assert comp.replies[-1]["ok"] is True
    assert all(a.state is State.RUNNING and a.running for a in comp.agents.values())


def test_one_failed_dump_makes_every_agent_drop_its_images():
    comp = Computation(50, fail_dump={17})
    comp.carry(comp.coord.request_checkpoint(1, 0.0, blocking=True))
    assert set(comp.verdicts.values()) == {Verdict.DISCARD}
    assert len(comp.verdicts) == 49  # the failed one has nothing to drop
    assert comp.completed == [] and comp.replies[-1]["ok"] is False
    assert all(a.state is State.RUNNING for a in comp.agents.values())
    # and the next checkpoint works
    comp.fail_dump = set()
    comp.verdicts.clear()
    comp.carry(comp.coord.request_checkpoint(1, 0.0, blocking=True))
    assert len(comp.completed) == 1 and set(comp.verdicts.values()) == {Verdict.PUBLISH}


def test_a_connection_one_end_could_not_drain_is_not_refilled_at_either_end():
    coord = CoordinatorMachine("comp")
    for i in (1, 2):
        coord.agent_joined(i, {"role": "agent", "token": "t", "host": "h", "pid": i,
                               "program": "p", "tree_id": f"t{i}"}, 0.0)
    agents = {1: AgentMachine(), 2: AgentMachine()}
    pending = coord.request_checkpoint(None, 0.0)
    seen: dict[int, list] = {1: [], 2: []}
    while pending:
        action = pending.pop(0)
        if not isinstance(action, SendAgent) or action.message["type"] != "barrier":
            continue
        barrier, _ = agents[action.agent_id].barrier(action.message)
        seen[action.agent_id].append(barrier)
        extra = {}
        if barrier.work is Work.DRAIN and action.agent_id == 1:
            extra["failed_conns"] = ["a|b"]
        if barrier.work is Work.DUMP:
            extra["image"] = {"path": "x", "bytes": 1}
        error = "drain failed" if extra.get("failed_conns") else None
        pending += coord.agent_message(action.agent_id,
                                       agents[action.agent_id].done(barrier, error, **extra), 0.0)
    for i in (1, 2):
        refill = next(b for b in seen[i] if b.work is Work.REFILL)
        assert refill.failed_conns == frozenset({"a|b"})


def _barrier(m: AgentMachine, state: State, generation: int):
    barrier, refusal = m.barrier(messages.make("barrier", state=state.value, generation=generation))
    assert refusal is None
    return barrier


def test_the_release_after_a_restart_says_so_once():
    m = AgentMachine(restarting=True)
    m.restored()
    m.done(_barrier(m, State.REFILLED, 4))
    running = _barrier(m, State.RUNNING, 4)
    assert m.resume_arg(running) == 4 | RESUME_RESTORED
    m.done(running)
    assert m.resume_arg() == 4  # a process that comes back late: not restarted again
    for state in (State.SUSPENDED, State.FD_LEADER_ELECTION, State.DRAINED,
                  State.CHECKPOINTED, State.REFILLED):
        m.done(_barrier(m, state, 5))
    assert m.resume_arg(_barrier(m, State.RUNNING, 5)) == 5


def test_a_round_without_its_coordinator_is_abandoned_and_the_tree_runs():
    m = AgentMachine()
    assert not m.abandon()  # nothing under way
    for state in (State.SUSPENDED, State.FD_LEADER_ELECTION, State.DRAINED, State.CHECKPOINTED):
        m.done(_barrier(m, state, 3))
    assert m.pending_generation == 3 and not m.running
    assert m.abandon()
    assert m.running and m.state is State.RUNNING and m.pending_generation is None
    assert m.commit(messages.make("commit", generation=3, ok=True)) is None  # images dropped
    assert m.owes_resume(True)  # a process still suspended is released at once
