"""The sans-IO coordinator, driven by many simulated agents in memory."""
from __future__ import annotations

import dataclasses

import pytest

from dmtcp_py.coordinator.recovery import RecoveryPolicy
from dmtcp_py.coordinator.machine import (CoordinatorMachine, GenerationComplete, Notice,
                                          ReplyClient, RoundKind, SendAgent, Shutdown)
from dmtcp_py.listing import proc_lines
from dmtcp_py.protocol import messages
from dmtcp_py.protocol.messages import (
    Barrier,
    CkptRequest,
    Cmd,
    Command,
    Commit,
    GenerationDone,
    Hello,
    ImageInfo,
    Kill,
    Message,
    Peers,
    ProcInfo,
    Progress,
    Published,
    Reached,
    Refused,
    Reply,
    Role,
    Welcome,
)
from dmtcp_py.protocol.states import State, next_state

COMP = "comp-A"
CLIENT = 9001
OTHER_CLIENT = 9002
# the barriers of one checkpoint, in order: (state reported, state released next)
CHECKPOINT_STEPS = [
    (State.SUSPENDED, State.FD_LEADER_ELECTION),
    (State.FD_LEADER_ELECTION, State.DRAINED),
    (State.DRAINED, State.CHECKPOINTED),
    (State.CHECKPOINTED, State.REFILLED),
    (State.REFILLED, State.RUNNING),
]
# the barriers during which a tree that goes away leaves no image behind
UP_TO_THE_DUMP = [State.SUSPENDED, State.FD_LEADER_ELECTION, State.DRAINED, State.CHECKPOINTED]


# ---- helpers -------------------------------------------------------------------

def of_type(actions: list, cls: type) -> list:
    return [a for a in actions if isinstance(a, cls)]


def sent(actions: list, kind: type[Message]) -> list[SendAgent]:
    return [a for a in of_type(actions, SendAgent) if isinstance(a.message, kind)]


def on_the_wire(message: Message) -> Message:
    """What the peer decodes: every message the machine makes must survive it."""
    back = messages.decode(messages.to_wire(message))
    assert back == message
    return back


def image_of(agent_id: int) -> ImageInfo:
    return ImageInfo(path=f"/ckpt/ckpt_prog_t{agent_id}.dmtcp", host=f"host{agent_id % 3}",
                     tree_id=f"t{agent_id}", program="prog", bytes=100 + agent_id)


def assert_barrier(actions: list, state: State, ids, *, generation: int, stop: bool = False):
    """actions release `state` to exactly `ids`, in id order, with one message each."""
    barriers = sent(actions, Barrier)
    assert [a.agent_id for a in barriers] == sorted(ids)
    expected = Barrier(state=state, generation=generation, stop=stop, num_trees=len(ids))
    for action in barriers:
        assert action.message == expected
    # one object for all: the server encodes a broadcast once
    assert len({id(a.message) for a in barriers}) <= 1
    if barriers:
        on_the_wire(barriers[0].message)


def only_reply(log: list, client: int) -> Reply:
    replies = [a for a in of_type(log, ReplyClient) if a.client_id == client]
    assert len(replies) == 1, replies
    assert isinstance(replies[0].message, Reply)
    return on_the_wire(replies[0].message)


class Sim:
    """One machine and the agents connected to it; every action is logged."""

    def __init__(self, agents: int = 0, comp_id: str = COMP, now: float = 0.0, **options):
        self.now = now
        # heartbeats only where a test asks for them (its own policy)
        options.setdefault("policy", RecoveryPolicy(heartbeat=0))
        self.m = CoordinatorMachine(comp_id, now=now, **options)
        self.log: list = []
        self._next_id = 0
        self.join(agents)

    def _record(self, actions: list) -> list:
        self.log += actions
        return actions

    def new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def hello(self, agent_id: int, **fields) -> Hello:
        base = {"host": f"host{agent_id % 3}", "pid": 1000 + agent_id, "program": "prog",
                "tree_id": f"t{agent_id}"}
        return Hello(role=Role.AGENT, token="tok", **{**base, **fields})

    def join_one(self, **fields) -> tuple[int, list]:
        agent_id = self.new_id()
        return agent_id, self._record(
            self.m.agent_joined(agent_id, self.hello(agent_id, **fields), self.now))

    def join(self, n: int = 1, **fields) -> list[int]:
        ids = []
        for _ in range(n):
            agent_id, actions = self.join_one(**fields)
            assert agent_id in self.m.agents, actions
            ids.append(agent_id)
        return ids

    def restart_join(self, comp_id: str = "comp-OLD", generation: int = 4, num_trees: int = 1,
                     **fields) -> tuple[int, list]:
        return self.join_one(restart=True, comp_id=comp_id, generation=generation,
                             num_trees=num_trees, **fields)

    def leave(self, agent_id: int) -> list:
        return self._record(self.m.agent_left(agent_id, self.now))

    def send(self, agent_id: int, msg: Message) -> list:
        return self._record(self.m.agent_message(agent_id, on_the_wire(msg), self.now))

    def report(self, agent_id: int, state: State, ok: bool = True, **extra) -> list:
        return self.send(agent_id, Reached(state=state, ok=ok, **extra))

    def step(self, state: State, ids=None, *, images: bool = True, publish: bool = True) -> list:
        """Every agent in ids (default: the round's participants) reports state;
        returns what the last report caused, after checking the others caused
        nothing.  If that lets the trees run again, the agents then publish
        their images, as real agents do (unless publish=False), and what the
        last publication caused is added."""
        ids = sorted(self.m.round.participants if ids is None else ids)
        results = []
        for agent_id in ids:
            extra = {"image": image_of(agent_id)} \
                if images and state is State.CHECKPOINTED \
                and self.m.round.kind is RoundKind.CHECKPOINT \
                else {}
            results.append(self.report(agent_id, state, **extra))
        assert all(r == [] for r in results[:-1]), "the barrier was released early"
        if publish and self.m.round is not None and self.m.round.resumed:
            return results[-1] + self.publish()
        return results[-1]

    def checkpoint(self, client: int | None = CLIENT, **kw) -> list:
        return self._record(self.m.request_checkpoint(client, self.now, **kw))

    def publish(self, ids=None, ok: bool = True) -> list:
        """Every agent in ids (default: those that reported an image) says
        its images are durable, as a real agent does after the dump;
        returns what the last one caused."""
        rnd = self.m.round
        results = [self.send(a, Published(generation=rnd.generation, ok=ok))
                   for a in sorted(rnd.images if ids is None else ids)]
        return results[-1] if results else []

    def advance_to(self, state: State | None) -> None:
        """Let every participant report, and publish, until the round waits
        on `state` (None: until the round is over)."""
        for _ in range(len(State) + 1):
            if self.m.round is None or self.m.round.state is state:
                break
            if self.m.round.resumed:
                self.publish()
                continue
            self.step(self.m.round.state)
        assert (self.m.round.state if self.m.round else None) is state

    def run_checkpoint(self, client: int | None = None, **kw) -> list:
        """A whole, uneventful checkpoint; returns everything it caused."""
        start = len(self.log)
        self.checkpoint(client, **kw)
        self.advance_to(None)
        return self.log[start:]

    def tick(self, now: float) -> list:
        self.now = now
        return self._record(self.m.tick(now))


# ---- a checkpoint, start to finish --------------------------------------------

@pytest.mark.parametrize("n", [1, 50, 1000])
def test_blocking_checkpoint_through_every_barrier(n):
    sim = Sim(n, now=10.0)
    ids = sorted(sim.m.agents)
    actions = sim.checkpoint(CLIENT, blocking=True)
    assert of_type(actions, ReplyClient) == []
    assert_barrier(actions, State.SUSPENDED, ids, generation=1)
    assert sim.m.status()["state"] == "SUSPENDED"
    assert not sim.m.status()["running"]
    for reported, released in CHECKPOINT_STEPS:
        sim.now += 0.5
        actions = sim.step(reported)
        assert_barrier(actions, released, ids, generation=1)
        assert sim.m.status()["state"] == released.value
        assert {row["state"] for row in sim.m.listing()} == {reported.value}
        # nothing is complete before the images are durable
        assert of_type(actions, GenerationComplete) == []
        assert of_type(actions, ReplyClient) == []
    sim.now = 13.0
    actions = sim.step(State.RUNNING, publish=False)
    # the trees run again; the generation waits for its images to be durable
    assert sent(actions, Barrier) == [] and actions == []
    assert sim.m.round is not None and sim.m.round.resumed
    sim.now = 13.25
    assert sim.publish(ids[:-1]) == [] if n > 1 else True
    actions = sim.publish(ids[-1:])
    done = of_type(actions, GenerationComplete)
    assert done == [GenerationComplete(1, tuple(image_of(a) for a in ids))]
    # the restart script is written before the client hears of it
    assert actions.index(done[0]) < actions.index(of_type(actions, ReplyClient)[0])
    reply = only_reply(sim.log, CLIENT)
    assert reply == Reply(ok=True, body={"kind": "checkpoint", "generation": 1, "duration": 3.25,
                                         "bytes": sum(100 + a for a in ids), "trees": n,
                                         "processes": 0})
    assert sim.m.generation == 1
    assert sim.m.round is None
    assert sim.m.last_checkpoint == {**reply.body, "ok": True, "error": None}
    assert len(of_type(sim.log, GenerationComplete)) == 1
    assert of_type(sim.log, Shutdown) == []
    status = sim.m.status()
    assert status["running"] and status["state"] == "RUNNING" and status["generation"] == 1
    assert {row["state"] for row in sim.m.listing()} == {"RUNNING"}
    assert any("checkpoint 1 done" in a.text for a in of_type(actions, Notice))


@pytest.mark.parametrize("wanting", [1, 3])
def test_a_round_begins_with_a_precopy_when_a_tree_wants_one(wanting):
    """A tree launched with --precopy: every tree of the round is pre-copied
    first (PRECOPIED, the program running), then the round goes on as any
    other; the program's stop, which the auto interval weighs, starts at
    SUSPENDED."""
    sim = Sim(3 - wanting, now=10.0)
    sim.join(wanting, precopy=True)
    ids = sorted(sim.m.agents)
    actions = sim.checkpoint(CLIENT, blocking=True)
    assert_barrier(actions, State.PRECOPIED, ids, generation=1)
    assert sim.m.status()["state"] == "PRECOPIED"
    sim.now = 12.0
    actions = sim.step(State.PRECOPIED)
    assert_barrier(actions, State.SUSPENDED, ids, generation=1)
    assert sim.m.round.suspended_at == 12.0
    sim.now = 12.5
    sim.advance_to(None)
    reply = only_reply(sim.log, CLIENT)
    assert reply.ok and reply.body["duration"] == 2.5
    assert list(sim.m.auto_interval.costs) == [0.5]


@pytest.mark.parametrize("stop", [False, True])
def test_no_precopy_unless_a_tree_wants_one_and_the_program_runs_on(stop):
    sim = Sim(2, now=10.0)
    sim.join(1, precopy=stop)  # (none wants one, or the program ends with its dump)
    actions = sim.checkpoint(CLIENT, blocking=True, stop=stop)
    assert_barrier(actions, State.SUSPENDED, sorted(sim.m.agents), generation=1, stop=stop)
    assert sim.m.round.suspended_at == 10.0


@pytest.mark.parametrize("n", [1, 3])
def test_a_round_where_no_tree_has_sockets_goes_from_suspended_to_the_dump_to_running(n):
    sim = Sim(n, now=10.0)
    ids = sorted(sim.m.agents)
    sim.m.agents[ids[0]].external = ("127.0.0.1:5>127.0.0.1:6",)  # (a previous round's)
    sim.checkpoint(CLIENT, blocking=True)
    for agent_id in ids[:-1]:
        assert sim.report(agent_id, State.SUSPENDED, sockets=False) == []
    actions = sim.report(ids[-1], State.SUSPENDED, sockets=False)
    assert_barrier(actions, State.CHECKPOINTED, ids, generation=1)
    assert sim.m.listing()[0]["external"] == []  # no drain: nothing leads out
    actions = sim.step(State.CHECKPOINTED)
    # the commit first: the agents publish once their tree runs
    assert [type(a.message) for a in of_type(actions, SendAgent)] == [Commit] * n + [Barrier] * n
    assert_barrier(actions, State.RUNNING, ids, generation=1)
    sim.step(State.RUNNING)
    assert sim.m.round is None
    assert only_reply(sim.log, CLIENT).ok and sim.m.generation == 1


@pytest.mark.parametrize("first", [dict(sockets=True), dict(ok=False, sockets=False), {}])
def test_a_round_keeps_every_barrier_if_one_tree_has_sockets_or_cannot_tell(first):
    sim = Sim(3)
    sim.checkpoint(CLIENT, blocking=True)
    sim.report(2, State.SUSPENDED, **first)  # ({}: an agent that does not say)
    sim.report(1, State.SUSPENDED, sockets=False)
    actions = sim.report(3, State.SUSPENDED, sockets=False)
    assert_barrier(actions, State.FD_LEADER_ELECTION, [1, 2, 3], generation=1)
    for reported, released in CHECKPOINT_STEPS[1:]:
        assert_barrier(sim.step(reported), released, [1, 2, 3], generation=1)


@pytest.mark.parametrize("sockets", [(False, False), (False, True)])
def test_a_restart_goes_straight_to_running_where_no_tree_has_sockets(sockets):
    sim = Sim()
    first, _ = sim.restart_join(num_trees=2)
    second, _ = sim.restart_join(num_trees=2, tree_id="t9")
    sim.report(first, State.CHECKPOINTED, sockets=sockets[0])
    actions = sim.report(second, State.CHECKPOINTED, sockets=sockets[1])
    after = State.REFILLED if any(sockets) else State.RUNNING
    assert {a.message.state for a in sent(actions, Barrier)} == {after}
    sim.advance_to(None)
    assert sim.m.generation == 4 and sim.m.status()["running"]


def test_progress_goes_to_the_waiters_that_asked_for_it_summed_over_trees():
    sim = Sim(2)
    a, b = sorted(sim.m.agents)
    sim.checkpoint(CLIENT, blocking=True, progress=True)
    sim.checkpoint(OTHER_CLIENT, blocking=True)  # waits, but asked for no progress
    sim.advance_to(State.CHECKPOINTED)
    note = Progress(generation=1, written=10, expected=100)
    first = sim.send(a, note)
    assert [r.client_id for r in of_type(first, ReplyClient)] == [CLIENT]
    second = sim.send(b, dataclasses.replace(note, written=5, expected=50))
    shown = on_the_wire(of_type(second, ReplyClient)[0].message)
    assert shown == Progress(generation=1, written=15, expected=150, trees=2, reporting=2)
    # a report of another generation, or from no participant, is dropped
    assert sim.send(a, dataclasses.replace(note, generation=7)) == []


def test_generation_increments_per_checkpoint():
    sim = Sim(3)
    for generation in (1, 2, 3):
        assert_barrier(sim.checkpoint(CLIENT, blocking=True), State.SUSPENDED, [1, 2, 3],
                       generation=generation)
        sim.advance_to(None)
        assert [g.generation for g in of_type(sim.log, GenerationComplete)][-1] == generation
        assert sim.m.generation == generation
    assert len(of_type(sim.log, ReplyClient)) == 3


def test_non_blocking_request_is_answered_at_once():
    sim = Sim(4)
    actions = sim.checkpoint(CLIENT)
    replies = of_type(actions, ReplyClient)
    assert len(replies) == 1 and replies[0].client_id == CLIENT
    assert replies[0].message == Reply(ok=True, body={"generation": 1})
    assert actions.index(replies[0]) < actions.index(sent(actions, Barrier)[0])
    sim.advance_to(None)
    assert only_reply(sim.log, CLIENT).body["generation"] == 1  # still just the one
    assert sim.m.generation == 1


@pytest.mark.parametrize("client", [CLIENT, None])
def test_request_without_agents(client):
    sim = Sim(0)
    actions = sim.checkpoint(client, blocking=True)
    assert sim.m.round is None
    assert of_type(actions, SendAgent) == []
    if client is None:
        assert actions == []
    else:
        assert actions == [ReplyClient(client, Reply(ok=False, error="no processes to checkpoint"))]


def test_second_blocking_request_joins_as_waiter():
    sim = Sim(5)
    sim.checkpoint(CLIENT, blocking=True)
    assert sim.checkpoint(OTHER_CLIENT, blocking=True) == []
    sim.advance_to(None)
    first, second = only_reply(sim.log, CLIENT), only_reply(sim.log, OTHER_CLIENT)
    assert first == second and first.ok and first.body["generation"] == 1
    assert len(sent(sim.log, Barrier)) == 5 * 6  # one round, not two
    assert sim.m.generation == 1


def test_second_non_blocking_request_gets_a_note():
    sim = Sim(2)
    sim.checkpoint(CLIENT, blocking=True)
    sim.step(State.SUSPENDED)
    actions = sim.checkpoint(OTHER_CLIENT)
    assert actions == [ReplyClient(OTHER_CLIENT, Reply(
        ok=True, body={"note": "a checkpoint is already in progress"}))]
    assert sim.m.round.state is State.FD_LEADER_ELECTION
    assert sim.checkpoint(None) == []


# ---- failures during a checkpoint ------------------------------------------------

@pytest.mark.parametrize("n", [2, 50])
@pytest.mark.parametrize("during", UP_TO_THE_DUMP)
def test_agent_leaving_mid_barrier_fails_the_checkpoint(n, during):
    sim = Sim(n)
    sim.checkpoint(CLIENT, blocking=True)
    sim.advance_to(during)
    gone = n // 2 + 1
    left = sim.leave(gone)
    assert any("left" in a.text for a in of_type(left, Notice))
    rest = sorted(set(range(1, n + 1)) - {gone})
    while sim.m.round.state is not State.RUNNING:
        actions = sim.step(sim.m.round.state)
        assert_barrier(actions, sim.m.round.state, rest, generation=1)
    sim.step(State.RUNNING)
    assert of_type(sim.log, GenerationComplete) == []
    reply = only_reply(sim.log, CLIENT)
    assert reply.ok is False
    assert "exited during the checkpoint" in reply.error
    assert f"agent pid {1000 + gone}" in reply.error
    assert sim.m.generation == 0
    assert sim.m.last_checkpoint["ok"] is False
    assert sim.m.status()["running"]


def test_leaving_agent_that_was_the_last_one_awaited_releases_the_barrier():
    sim = Sim(10)
    sim.checkpoint(CLIENT, blocking=True)
    for agent_id in range(1, 10):
        assert sim.report(agent_id, State.SUSPENDED) == []
    actions = sim.leave(10)
    assert_barrier(actions, State.FD_LEADER_ELECTION, range(1, 10), generation=1)


def test_agent_leaving_before_its_images_are_durable_fails_the_generation():
    """Dumped is not enough: an agent that goes before saying "published"
    may have left its images half written."""
    sim = Sim(3)
    sim.checkpoint(CLIENT, blocking=True)
    sim.advance_to(State.REFILLED)
    sim.leave(2)
    assert_barrier(sim.step(State.REFILLED), State.RUNNING, [1, 3], generation=1)
    sim.step(State.RUNNING)
    assert of_type(sim.log, GenerationComplete) == []
    reply = only_reply(sim.log, CLIENT)
    assert reply.ok is False and "exited during the checkpoint" in reply.error
    assert sim.m.generation == 0 and sim.m.status()["running"]


def test_a_failed_publication_fails_the_generation():
    sim = Sim(2)
    sim.checkpoint(CLIENT, blocking=True)
    sim.advance_to(State.RUNNING)
    sim.step(State.RUNNING, publish=False)
    sim.publish([1])
    actions = sim.send(2, Published(generation=1, ok=False, error="disk full"))
    assert of_type(actions, GenerationComplete) == []
    reply = only_reply(sim.log, CLIENT)
    assert reply.ok is False and "disk full" in reply.error
    assert sim.m.generation == 0


def test_agent_failing_at_checkpointed():
    sim = Sim(20)
    sim.checkpoint(CLIENT, blocking=True)
    sim.advance_to(State.CHECKPOINTED)
    for agent_id in range(1, 21):
        if agent_id == 7:
            actions = sim.report(7, State.CHECKPOINTED, ok=False, error="criu dump failed")
        else:
            actions = sim.report(agent_id, State.CHECKPOINTED, image=image_of(agent_id))
    assert of_type(actions, GenerationComplete) == []
    assert_barrier(actions, State.REFILLED, range(1, 21), generation=1)
    assert_barrier(sim.step(State.REFILLED), State.RUNNING, range(1, 21), generation=1)
    sim.step(State.RUNNING)
    assert of_type(sim.log, GenerationComplete) == []
    reply = only_reply(sim.log, CLIENT)
    assert reply.ok is False and "criu dump failed" in reply.error
    assert reply.body["trees"] == 19
    assert sim.m.generation == 0
    # the next attempt reuses the generation number
    actions = sim.run_checkpoint()
    assert [g.generation for g in of_type(actions, GenerationComplete)] == [1]
    assert sim.m.generation == 1


def test_failure_without_error_text():
    sim = Sim(2)
    sim.checkpoint(CLIENT, blocking=True)
    sim.step(State.SUSPENDED)
    sim.report(1, State.FD_LEADER_ELECTION, ok=False)
    sim.report(2, State.FD_LEADER_ELECTION)
    sim.advance_to(None)
    assert of_type(sim.log, GenerationComplete) == []
    assert only_reply(sim.log, CLIENT).error.endswith(": failed")


def test_late_joiner_is_not_a_participant():
    sim = Sim(5)
    sim.checkpoint(CLIENT, blocking=True)
    sim.step(State.SUSPENDED)
    late, actions = sim.join_one()
    assert sent(actions, Welcome)[0].message.generation == 0
    assert sent(actions, Barrier) == []
    # it may report whatever it likes: out of turn
    notices = sim.report(late, State.FD_LEADER_ELECTION)
    assert len(notices) == 1 and "out of turn" in notices[0].text
    while sim.m.round is not None:
        actions = sim.step(sim.m.round.state, range(1, 6))
        assert late not in {a.agent_id for a in of_type(actions, SendAgent)}
    reply = only_reply(sim.log, CLIENT)
    assert reply.ok and reply.body["trees"] == 5
    # the next checkpoint includes it
    actions = sim.checkpoint(None)
    assert_barrier(actions, State.SUSPENDED, range(1, 7), generation=2)


@pytest.mark.parametrize("state", [State.RUNNING, State.DRAINED, State.CHECKPOINTED,
                                   State.RESTARTING])
def test_reached_out_of_turn_is_ignored(state):
    sim = Sim(3)
    sim.checkpoint(CLIENT, blocking=True)
    for agent_id in (1, 2):
        sim.report(agent_id, State.SUSPENDED)
    actions = sim.report(3, state)
    assert len(actions) == 1 and "out of turn" in actions[0].text
    assert sim.m.round.reached == {1, 2}
    assert sim.m.round.state is State.SUSPENDED
    assert sim.m.agents[3].state is State.RUNNING
    assert_barrier(sim.report(3, State.SUSPENDED), State.FD_LEADER_ELECTION, [1, 2, 3],
                   generation=1)


def test_reached_without_a_round_is_ignored():
    sim = Sim(1)
    actions = sim.report(1, State.SUSPENDED)
    assert len(actions) == 1 and "out of turn" in actions[0].text
    assert sim.m.round is None


@pytest.mark.parametrize("message", [Command(cmd=Cmd.STATUS), Hello(role=Role.AGENT, token="t"),
                                     Reply(ok=True), Kill(), GenerationDone(generation=1)],
                         ids=lambda m: m.TYPE)
def test_a_message_no_agent_sends_is_ignored(message):
    sim = Sim(1)
    actions = sim.send(1, message)
    assert len(actions) == 1 and f"ignored {message.TYPE!r}" in actions[0].text
    assert sim.m.round is None and sim.m.agents[1].state is State.RUNNING


def test_unknown_agent():
    sim = Sim(1)
    assert sim.send(99, Reached(state=State.SUSPENDED, ok=True)) == []
    assert sim.send(99, CkptRequest()) == []
    assert sim.leave(99) == []


# ---- restart rounds ---------------------------------------------------------------

def test_first_restart_agent_adopts_the_computation():
    sim = Sim(0, comp_id="fresh")
    agent_id, actions = sim.restart_join(comp_id="comp-OLD", generation=4, num_trees=3)
    welcome = sent(actions, Welcome)
    assert [w.agent_id for w in welcome] == [agent_id]
    assert welcome[0].message.comp_id == "comp-OLD"
    assert welcome[0].message.generation == 4
    assert any("restarting" in n.text for n in of_type(actions, Notice))
    assert sim.m.comp_id == "comp-OLD" and sim.m.generation == 4
    assert sim.m.agents[agent_id].state is State.RESTARTING
    assert sim.m.round.kind is RoundKind.RESTART and sim.m.round.state is State.CHECKPOINTED
    assert sim.m.status()["state"] == "CHECKPOINTED"


@pytest.mark.parametrize("n", [1, 3, 50])
@pytest.mark.parametrize("report_early", [True, False])
def test_restart_round_waits_for_every_tree(n, report_early):
    sim = Sim(0, comp_id="fresh", now=100.0)
    ids = []
    for i in range(n):
        agent_id, actions = sim.restart_join(num_trees=n, tree_id=f"tree{i}")
        assert sent(actions, Refused) == []
        ids.append(agent_id)
        if report_early:
            released = sim.report(agent_id, State.CHECKPOINTED)
            if i < n - 1:
                assert released == []
    if not report_early:
        released = sim.step(State.CHECKPOINTED)
    assert_barrier(released, State.REFILLED, ids, generation=4)
    assert_barrier(sim.step(State.REFILLED), State.RUNNING, ids, generation=4)
    sim.now = 101.0
    actions = sim.step(State.RUNNING)
    assert sent(actions, Barrier) == []
    assert any("restart of generation 4 done" in a.text for a in of_type(actions, Notice))
    assert of_type(sim.log, GenerationComplete) == []
    assert of_type(sim.log, ReplyClient) == []
    assert sim.m.round is None and sim.m.generation == 4
    assert sim.m.status()["running"]
    # and the computation checkpoints on from there
    assert [g.generation for g in of_type(sim.run_checkpoint(), GenerationComplete)] == [5]


def test_restart_agent_refused_when_busy_with_another_computation():
    sim = Sim(2)
    agent_id, actions = sim.restart_join()
    assert len(actions) == 1
    refused = sent(actions, Refused)[0]
    assert refused.agent_id == agent_id
    assert "busy with computation comp-A" in refused.message.error
    assert agent_id not in sim.m.agents
    assert sim.m.comp_id == COMP and sim.m.round is None


def test_restart_agent_of_another_computation_refused_during_a_restart():
    sim = Sim(0)
    sim.restart_join(comp_id="comp-OLD", num_trees=2)
    agent_id, actions = sim.restart_join(comp_id="comp-OTHER", num_trees=2)
    assert "busy with computation comp-OLD" in sent(actions, Refused)[0].message.error
    agent_id, actions = sim.restart_join(comp_id="comp-OLD", generation=3, num_trees=2)
    assert sent(actions, Refused), "another generation of the same computation"
    assert len(sim.m.agents) == 1


def test_same_tree_restarted_twice_is_refused():
    sim = Sim(0)
    sim.restart_join(num_trees=2, tree_id="same")
    agent_id, actions = sim.restart_join(num_trees=2, tree_id="same")
    assert "tree same is already being restarted" in sent(actions, Refused)[0].message.error
    assert agent_id not in sim.m.agents
    assert sim.m.round.participants == {1}


def test_restart_agent_refused_once_past_checkpointed():
    sim = Sim(0)
    sim.restart_join(num_trees=1)
    sim.step(State.CHECKPOINTED)
    _, actions = sim.restart_join(num_trees=1, tree_id="late")
    assert sent(actions, Refused)


def test_checkpoint_request_during_restart_is_refused():
    sim = Sim(0)
    sim.restart_join(num_trees=2)
    actions = sim.checkpoint(CLIENT, blocking=True)
    assert actions == [ReplyClient(CLIENT, Reply(ok=False, error="a restart is in progress"))]
    assert sim.m.round.kind is RoundKind.RESTART


def test_restart_agent_failing_aborts_the_restart():
    sim = Sim(0)
    for i in range(3):
        sim.restart_join(num_trees=4, tree_id=f"tree{i}")
    sim.report(1, State.CHECKPOINTED)
    actions = sim.report(2, State.CHECKPOINTED, ok=False, error="criu restore failed")
    assert [(a.agent_id, a.message) for a in of_type(actions, SendAgent)] == \
        [(1, Kill()), (2, Kill()), (3, Kill())]
    notices = [n.text for n in of_type(actions, Notice)]
    assert any("restart of generation 4 FAILED" in t and "criu restore failed" in t
               for t in notices)
    assert sim.m.round is None
    # a straggler of the aborted restart is refused
    _, actions = sim.restart_join(num_trees=4, tree_id="tree3")
    assert sent(actions, Refused)


def test_a_tree_late_for_a_called_off_restart_is_turned_away():
    """The trees of one restart join one by one; the first failed, was
    killed and left before the second joined.  The second must not start a
    new restart round: it would wait for ever for the first."""
    sim = Sim(0, now=10.0)
    first, _ = sim.restart_join(num_trees=3, tree_id="tree0")
    sim.report(first, State.CHECKPOINTED, ok=False, error="pages-2.img is damaged")
    sim.leave(first)
    assert sim.m.round is None and not sim.m.agents
    for late in ("tree1", "tree2"):
        agent_id, actions = sim.restart_join(num_trees=3, tree_id=late)
        refusal = sent(actions, Refused)[0].message.error
        assert "restart of generation 4 was called off" in refusal
        assert "pages-2.img is damaged" in refusal
        assert agent_id not in sim.m.agents and sim.m.round is None
    # every late tree came: the same restart, tried again, is a new one
    _, actions = sim.restart_join(num_trees=3, tree_id="tree1")
    assert sent(actions, Refused) == [] and sim.m.round.participants


def test_a_called_off_restart_tried_again_starts_anew():
    sim = Sim(0, now=10.0)
    first, _ = sim.restart_join(num_trees=2, tree_id="tree0")
    sim.report(first, State.CHECKPOINTED, ok=False, error="boom")
    sim.leave(first)
    # a tree of the failed restart's own comes back first: a new attempt
    again, actions = sim.restart_join(num_trees=2, tree_id="tree0")
    assert sent(actions, Refused) == []
    other, actions = sim.restart_join(num_trees=2, tree_id="tree1")
    assert sent(actions, Refused) == []
    assert sim.m.round.participants == {again, other}


def test_a_called_off_restart_is_forgotten_after_the_restart_timeout():
    sim = Sim(0, now=10.0)
    first, _ = sim.restart_join(num_trees=2, tree_id="tree0")
    sim.report(first, State.CHECKPOINTED, ok=False, error="boom")
    sim.leave(first)
    sim.now = 10.0 + sim.m.policy.restart_timeout + 1
    _, actions = sim.restart_join(num_trees=2, tree_id="tree1")
    assert sent(actions, Refused) == [] and sim.m.round is not None


def test_restart_agent_leaving_aborts_the_restart():
    sim = Sim(0)
    for i in range(3):
        sim.restart_join(num_trees=3, tree_id=f"tree{i}")
    sim.step(State.CHECKPOINTED)
    actions = sim.leave(2)
    assert [a.agent_id for a in sent(actions, Kill)] == [1, 3]
    assert any("exited during restart" in n.text for n in of_type(actions, Notice))
    assert sim.m.round is None


def test_restart_agent_leaving_at_the_last_barrier_is_not_an_abort():
    sim = Sim(0)
    for i in range(2):
        sim.restart_join(num_trees=2, tree_id=f"tree{i}")
    sim.step(State.CHECKPOINTED)
    sim.step(State.REFILLED)
    sim.report(1, State.RUNNING)
    actions = sim.leave(2)
    assert sent(actions, Kill) == []
    assert any("restart of generation 4 done" in n.text for n in of_type(actions, Notice))


# ---- lifetime options ------------------------------------------------------------------

def test_exit_on_last():
    sim = Sim(0, exit_on_last=True)
    assert sim.leave(1) == []
    ids = sim.join(3)
    for agent_id in ids[:-1]:
        assert of_type(sim.leave(agent_id), Shutdown) == []
    assert of_type(sim.leave(ids[-1]), Shutdown) == [Shutdown("last process exited")]


def test_without_exit_on_last_the_coordinator_stays():
    sim = Sim(1)
    assert of_type(sim.leave(1), Shutdown) == []


def test_exit_on_last_when_the_last_agent_leaves_mid_checkpoint():
    sim = Sim(2, exit_on_last=True)
    sim.checkpoint(CLIENT, blocking=True)
    sim.step(State.SUSPENDED)
    sim.leave(1)
    actions = sim.leave(2)
    assert of_type(actions, Shutdown) == [Shutdown("last process exited")]
    assert only_reply(sim.log, CLIENT).ok is False


def test_exit_on_last_when_the_only_restart_agent_leaves():
    sim = Sim(0, exit_on_last=True)
    sim.restart_join(num_trees=2)
    actions = sim.leave(1)
    assert of_type(actions, Shutdown) == [Shutdown("last process exited")]


@pytest.mark.parametrize("n", [1, 50])
def test_exit_after_checkpoint(n):
    sim = Sim(n, exit_after_ckpt=True)
    actions = sim.checkpoint(CLIENT, blocking=True)
    assert_barrier(actions, State.SUSPENDED, range(1, n + 1), generation=1, stop=True)
    for state in UP_TO_THE_DUMP[:-1]:
        assert_barrier(sim.step(state), next_state(state), range(1, n + 1), generation=1,
                       stop=True)
    actions = sim.step(State.CHECKPOINTED)
    assert sent(actions, Barrier) == []  # the trees were stopped by the dump
    assert of_type(actions, GenerationComplete) == [
        GenerationComplete(1, tuple(image_of(a) for a in range(1, n + 1)))]
    assert of_type(actions, Shutdown) == [Shutdown("exit after checkpoint")]
    assert actions.index(of_type(actions, ReplyClient)[0]) < actions.index(Shutdown(
        "exit after checkpoint"))
    assert only_reply(sim.log, CLIENT).ok is True
    assert sim.m.generation == 1 and sim.m.round is None


def test_exit_after_checkpoint_does_not_exit_on_a_failed_one():
    sim = Sim(2, exit_after_ckpt=True)
    sim.checkpoint(CLIENT, blocking=True)
    sim.advance_to(State.CHECKPOINTED)
    sim.report(1, State.CHECKPOINTED, image=image_of(1))
    actions = sim.report(2, State.CHECKPOINTED, ok=False, error="disk full")
    # the agents are told to drop what they dumped, and nobody waits for it
    assert {a.message.ok for a in sent(actions, Commit)} == {False}
    assert of_type(actions, Shutdown) == [] and of_type(actions, GenerationComplete) == []
    assert only_reply(sim.log, CLIENT).ok is False
    assert sim.m.round is None


def test_a_failed_dump_ends_the_round_without_waiting_for_images():
    sim = Sim(2)
    sim.checkpoint(CLIENT, blocking=True)
    sim.advance_to(State.CHECKPOINTED)
    sim.report(1, State.CHECKPOINTED, image=image_of(1))
    sim.report(2, State.CHECKPOINTED, ok=False, error="disk full")
    sim.step(State.REFILLED)
    sim.step(State.RUNNING, publish=False)
    assert sim.m.round is None
    assert only_reply(sim.log, CLIENT).ok is False


def test_commit_comes_once_every_tree_dumped():
    sim = Sim(2)
    sim.checkpoint(CLIENT, blocking=True)
    sim.advance_to(State.CHECKPOINTED)
    assert sent(sim.report(1, State.CHECKPOINTED, image=image_of(1)), Commit) == []
    actions = sim.report(2, State.CHECKPOINTED, image=image_of(2))
    commits = sent(actions, Commit)
    assert sorted(a.agent_id for a in commits) == [1, 2]
    assert {a.message.ok for a in commits} == {True}


def test_stop_request_ends_at_checkpointed_without_exiting():
    sim = Sim(3)
    actions = sim.run_checkpoint(CLIENT, blocking=True, stop=True)
    assert {a.message.stop for a in sent(actions, Barrier)} == {True}
    assert {a.message.state for a in sent(actions, Barrier)} == {
        State.SUSPENDED, State.FD_LEADER_ELECTION, State.DRAINED, State.CHECKPOINTED}
    assert len(of_type(actions, GenerationComplete)) == 1
    assert of_type(actions, Shutdown) == []
    assert only_reply(sim.log, CLIENT).ok is True
    # the stopped trees' agents then go away; that is no error
    for agent_id in (1, 2, 3):
        assert of_type(sim.leave(agent_id), Shutdown) == []
    assert sim.m.last_checkpoint["ok"] is True


def test_stopped_agent_exiting_before_the_others_report():
    """With --stop a tree is gone once dumped, so its agent may exit before
    the slowest tree has reported: the generation is still complete."""
    sim = Sim(3)
    sim.checkpoint(CLIENT, blocking=True, stop=True)
    sim.advance_to(State.CHECKPOINTED)
    sim.report(1, State.CHECKPOINTED, image=image_of(1))
    sim.publish([1])  # a stopped tree's agent publishes, then exits
    sim.leave(1)
    sim.report(2, State.CHECKPOINTED, image=image_of(2))
    sim.report(3, State.CHECKPOINTED, image=image_of(3))
    actions = sim.publish([2, 3])
    assert of_type(actions, GenerationComplete) == [
        GenerationComplete(1, tuple(image_of(a) for a in (1, 2, 3)))]
    reply = only_reply(sim.log, CLIENT)
    assert reply.ok is True and reply.body["trees"] == 3
    assert sim.m.generation == 1


@pytest.mark.parametrize("during", UP_TO_THE_DUMP)
def test_stopped_checkpoint_losing_a_tree_before_its_dump_fails(during):
    sim = Sim(3)
    sim.checkpoint(CLIENT, blocking=True, stop=True)
    sim.advance_to(during)
    sim.leave(2)
    sim.advance_to(None)
    assert of_type(sim.log, GenerationComplete) == []
    reply = only_reply(sim.log, CLIENT)
    assert reply.ok is False and "exited during the checkpoint" in reply.error
    assert sim.m.generation == 0


# ---- commands --------------------------------------------------------------------------

@pytest.mark.parametrize("client", [CLIENT, None])
def test_kill(client):
    sim = Sim(4)
    actions = sim._record(sim.m.kill(client))
    assert [a.agent_id for a in sent(actions, Kill)] == [1, 2, 3, 4]
    assert all(a.message == Kill() for a in sent(actions, Kill))
    if client is None:
        assert of_type(actions, ReplyClient) == []
    else:
        assert only_reply(actions, client) == Reply(ok=True, body={"killed": 4})
    assert of_type(actions, Shutdown) == []
    assert len(sim.m.agents) == 4  # until they actually leave


def test_quit():
    sim = Sim(2)
    actions = sim.m.quit(CLIENT)
    assert [a.agent_id for a in sent(actions, Kill)] == [1, 2]
    assert only_reply(actions, CLIENT).body["killed"] == 2
    assert actions[-1] == Shutdown("quit requested")


def test_quit_without_agents():
    actions = Sim(0).m.quit(None)
    assert actions == [Shutdown("quit requested")]


# ---- interval checkpoints --------------------------------------------------------------

def test_interval_checkpoints_by_tick():
    sim = Sim(3, now=100.0, interval=30.0)
    assert sim.tick(129.9) == []
    actions = sim.tick(130.0)
    assert_barrier(actions, State.SUSPENDED, [1, 2, 3], generation=1)
    assert of_type(actions, ReplyClient) == []
    # due again while the round still runs: skipped, not queued
    assert sim.tick(160.0) == []
    sim.advance_to(None)
    assert sim.m.generation == 1
    assert of_type(sim.log, ReplyClient) == []
    assert sim.tick(189.0) == []
    assert_barrier(sim.tick(190.0), State.SUSPENDED, [1, 2, 3], generation=2)


def test_interval_without_agents_does_nothing():
    sim = Sim(0, interval=5.0)
    assert sim.tick(5.0) == [] and sim.tick(100.0) == []
    assert sim.m.round is None


def test_no_interval_no_ticks():
    sim = Sim(2)
    assert sim.tick(1e9) == []


def test_set_interval():
    sim = Sim(1, now=0.0)
    actions = sim.m.set_interval(CLIENT, 5, now=50.0)
    assert actions == [ReplyClient(CLIENT, Reply(ok=True, body={"interval": 5.0,
                                                                 "interval_auto": False}))]
    assert sim.m.status()["checkpoint_interval"] == 5.0
    assert sim.tick(54.0) == []
    assert sent(sim.tick(55.0), Barrier)
    sim.m.round = None
    assert sim.m.set_interval(None, -3, now=60.0) == []
    assert sim.m.interval == 0.0
    assert sim.tick(1e9) == []


# ---- status and listing -------------------------------------------------------------------

def peers(count: int) -> Peers:
    return Peers(procs=tuple(ProcInfo(pid=i, name="prog") for i in range(count)))


def test_status_counts():
    sim = Sim(0, comp_id="c1")
    assert sim.m.status() == {
        "comp_id": "c1", "num_peers": 0, "num_trees": 0, "running": False,
        "state": "RUNNING", "generation": 0, "checkpoint_interval": 0.0, "interval_auto": False,
        "last_checkpoint": None, "last_migration": None, "auto_restart": False,
        "restarts": 0, "recovering": None,
        "last_failure": None, "time_lost": 0.0, "gave_up": None, "last_exit": None,
        "replicas": 0, "replicated_trees": 0, "rebalance": None}
    sim.join(3)
    assert sim.send(1, peers(3)) == []
    sim.send(2, peers(2))
    status = sim.m.status()
    assert status["num_peers"] == 5 and status["num_trees"] == 3 and status["running"]
    sim.send(1, peers(1))
    assert sim.m.status()["num_peers"] == 3
    sim.leave(2)
    assert sim.m.status()["num_peers"] == 1 and sim.m.status()["num_trees"] == 2
    sim.checkpoint(None)
    assert sim.m.status()["running"] is False
    assert sim.m.status()["state"] == "SUSPENDED"


def test_listing():
    sim = Sim(2)
    sim.send(2, peers(2))
    rows = sim.m.listing()
    assert rows == [
        {"host": "host1", "agent_pid": 1001, "program": "prog", "tree_id": "t1",
         "state": "RUNNING", "peers": 0, "procs": [], "external": []},
        {"host": "host2", "agent_pid": 1002, "program": "prog", "tree_id": "t2",
         "state": "RUNNING", "peers": 2, "procs": [[0, "prog"], [1, "prog"]], "external": []},
    ]


def test_listing_shows_ranks_and_connections_outside_as_plain_json():
    sim = Sim(1)
    sim.send(1, Peers(procs=(ProcInfo(pid=7, name="mpi_solver", rank=0),
                             ProcInfo(pid=8, name="helper"))))
    sim.checkpoint(None)
    sim.step(State.SUSPENDED)
    sim.step(State.FD_LEADER_ELECTION)
    sim.report(1, State.DRAINED, external=("127.0.0.1:5>127.0.0.1:6",))
    row = sim.m.listing()[0]
    assert row["procs"] == [[7, "mpi_solver", 0], [8, "helper"]]
    assert row["external"] == ["127.0.0.1:5>127.0.0.1:6"]
    # a reply's body: it goes on the wire as it is
    on_the_wire(Reply(ok=True, body={"trees": sim.m.listing(), **sim.m.status()}))
    assert proc_lines(row["procs"]) == ["    pid 7  mpi_solver  rank 0", "    pid 8  helper"]


def test_connections_not_drained_are_named_in_every_later_barrier():
    sim = Sim(2)
    sim.checkpoint(CLIENT, blocking=True)
    sim.advance_to(State.DRAINED)
    sim.report(1, State.DRAINED, failed_conns=("b|c",))
    actions = sim.report(2, State.DRAINED, failed_conns=("a|b",))
    assert {a.message.failed_conns for a in sent(actions, Barrier)} == {("a|b", "b|c")}
    assert {a.message.state for a in sent(actions, Barrier)} == {State.CHECKPOINTED}
    actions = sim.step(State.CHECKPOINTED)
    assert {a.message.failed_conns for a in sent(actions, Barrier)} == {("a|b", "b|c")}
    sim.advance_to(None)
    assert only_reply(sim.log, CLIENT).ok
    assert {a.message.failed_conns for a in sent(sim.checkpoint(None), Barrier)} == {()}


def test_a_dump_reported_without_its_image_fails_the_checkpoint():
    sim = Sim(2)
    sim.checkpoint(CLIENT, blocking=True)
    sim.advance_to(State.CHECKPOINTED)
    sim.report(1, State.CHECKPOINTED, image=image_of(1))
    actions = sim.report(2, State.CHECKPOINTED)
    assert {a.message.ok for a in sent(actions, Commit)} == {False}
    sim.advance_to(None)
    reply = only_reply(sim.log, CLIENT)
    assert reply.ok is False and "reported no image" in reply.error
    assert of_type(sim.log, GenerationComplete) == [] and sim.m.generation == 0


def test_the_program_asking_for_a_checkpoint_starts_one_or_joins_it():
    sim = Sim(2)
    actions = sim.send(1, CkptRequest())
    assert any("asked for a checkpoint" in n.text for n in of_type(actions, Notice))
    assert_barrier(actions, State.SUSPENDED, [1, 2], generation=1)
    assert of_type(sim.send(2, CkptRequest()), SendAgent) == []  # the same round
    sim.advance_to(None)
    assert sim.m.generation == 1
    done = sent(sim.log, GenerationDone)
    assert [a.agent_id for a in done] == [1, 2]
    assert {a.message for a in done} == {GenerationDone(generation=1, ok=True)}


def test_the_agents_hear_of_the_generation_before_the_client_that_waits():
    # a client may kill the coordinator as soon as it has its reply; the
    # agents then rejoin the next one with the generation they heard of
    sim = Sim(2)
    sim.checkpoint(CLIENT, blocking=True)
    sim.advance_to(None)
    told = [i for i, a in enumerate(sim.log)
            if isinstance(a, SendAgent) and isinstance(a.message, GenerationDone)]
    replied = [i for i, a in enumerate(sim.log)
               if isinstance(a, ReplyClient) and a.client_id == CLIENT]
    assert len(told) == 2 and len(replied) == 1 and max(told) < replied[0]


def test_join_with_sparse_hello_uses_placeholders():
    m = CoordinatorMachine(COMP)
    actions = m.agent_joined(1, Hello(role=Role.AGENT, token="t"), 0.0)
    welcome = on_the_wire(sent(actions, Welcome)[0].message)
    assert (welcome.comp_id, welcome.agent_id, welcome.generation) == (COMP, 1, 0)
    assert m.listing()[0]["host"] == "?" and m.listing()[0]["agent_pid"] == 0


def test_a_fresh_coordinator_takes_rejoining_agents_back_with_their_generation():
    sim = Sim(0, comp_id="comp-NEW")
    first, actions = sim.join_one(rejoin=True, comp_id="comp-OLD", generation=3)
    assert first in sim.m.agents and sim.m.comp_id == "comp-OLD" and sim.m.generation == 3
    welcome = sent(actions, Welcome)[0].message
    assert welcome.comp_id == "comp-OLD" and welcome.generation == 3
    second, _ = sim.join_one(rejoin=True, comp_id="comp-OLD", generation=3)
    assert second in sim.m.agents
    # another computation's agent is refused; so is anyone once this one ran
    stranger, actions = sim.join_one(rejoin=True, comp_id="comp-OTHER", generation=9)
    assert stranger not in sim.m.agents and sent(actions, Refused)
    assert sim.m.comp_id == "comp-OLD" and sim.m.generation == 3


def test_a_busy_coordinator_refuses_a_rejoin_of_another_computation():
    sim = Sim(1, comp_id="comp-A")
    agent, actions = sim.join_one(rejoin=True, comp_id="comp-B", generation=2)
    assert agent not in sim.m.agents
    assert "busy with computation comp-A" in sent(actions, Refused)[0].message.error
