"""Self-healing, driven in memory: heartbeats, what a lost tree is, and a
recovery from the loss to RUNNING (coordinator/machine.py, recovery.py)."""
from __future__ import annotations

import pytest

from dmtcp_py.coordinator import recovery
from dmtcp_py.coordinator.machine import CloseAgent, Notice, RestartGeneration, Shutdown
from dmtcp_py.coordinator.recovery import RecoveryPolicy
from dmtcp_py.protocol.messages import Heartbeat, ImageInfo, Kill, KilledProcess, TreeEnded
from dmtcp_py.protocol.states import State
from tests.unit.test_machine import Sim, image_of, of_type, sent

AUTO = RecoveryPolicy(auto_restart=True, heartbeat=0, max_restarts=3)
RANK_KILLED = KilledProcess(pid=1234, signal=9, name="solver")   # the OOM killer's


def checkpointed(n: int = 3, policy: RecoveryPolicy = AUTO, **options) -> Sim:
    """n trees and one complete generation (1)."""
    sim = Sim(n, now=10.0, policy=policy, **options)
    sim.run_checkpoint()
    assert sim.m.complete is not None and sim.m.complete.generation == 1
    return sim


def killed_by_signal(sim: Sim, agent_id: int, code: int = -9) -> list:
    sim.send(agent_id, TreeEnded(code=code))
    return sim.leave(agent_id)


def the_restart(actions: list) -> RestartGeneration:
    restarts = of_type(actions, RestartGeneration)
    assert len(restarts) == 1, actions
    return restarts[0]


def restart_joins(sim: Sim, restart: RestartGeneration) -> list[int]:
    ids = []
    for image in restart.images:
        agent_id, actions = sim.restart_join(comp_id=sim.m.comp_id, generation=restart.generation,
                                             num_trees=len(restart.images),
                                             tree_id=image.tree_id, image=image)
        assert agent_id in sim.m.agents, actions
        ids.append(agent_id)
    return ids


def finish_restart(sim: Sim, ids: list[int]) -> list:
    out = []
    for state in (State.CHECKPOINTED, State.REFILLED, State.RUNNING):
        out += sim.step(state, ids)
    return out


# ---- what is a failure -----------------------------------------------------------------------

@pytest.mark.parametrize("ended, dismissed, silent, lost", [
    (TreeEnded(code=0), False, None, False),
    (TreeEnded(code=3), False, None, False),           # an exit, whatever its status
    (TreeEnded(code=-9), False, None, True),           # SIGKILL
    (TreeEnded(code=-11), False, None, True),          # SIGSEGV, core
    (TreeEnded(code=-9, requested=True), False, None, False),     # dmtcp-command -k
    (TreeEnded(code=-9, checkpointed=True), False, None, False),  # -kc
    (TreeEnded(code=-9), True, None, False),           # we told it to end
    (None, False, None, True),                         # agent gone without a word
    (None, False, "its host h went silent", True),
    (None, True, None, False),
    # a process of the tree killed by a failure signal, then the program ...
    (TreeEnded(code=1, killed=RANK_KILLED), False, None, True),   # ... failed: mpirun
    (TreeEnded(code=-6, killed=RANK_KILLED), False, None, True),  # ... killed too
    (TreeEnded(code=0, killed=RANK_KILLED), False, None, False),  # ... coped with it
    (TreeEnded(code=1, killed=RANK_KILLED, requested=True), False, None, False),   # -k
    (TreeEnded(code=1, killed=RANK_KILLED, checkpointed=True), False, None, False),
    (TreeEnded(code=1, killed=RANK_KILLED), True, None, False),   # a recovery stopped it
])
def test_why_lost(ended, dismissed, silent, lost):
    why = recovery.why_lost(ended, dismissed=dismissed, silent=silent)
    assert (why is not None) == lost
    # an end is a failure or an exit of its own, never both
    if lost:
        assert recovery.own_exit(ended, dismissed=dismissed) is None


def test_why_names_the_killed_process():
    ended = TreeEnded(code=1, killed=RANK_KILLED)
    assert recovery.why_lost(ended, dismissed=False, silent=None) == \
        "its process solver (pid 1234) was killed by SIGKILL"
    cored = TreeEnded(code=-11, killed=KilledProcess(pid=7, signal=3, name="w", core=True))
    assert recovery.why_lost(cored, dismissed=False, silent=None) == \
        "its process w (pid 7) was killed by SIGQUIT (core dumped)"
    assert recovery.own_exit(ended, dismissed=False) is None
    assert recovery.own_exit(TreeEnded(code=0, killed=RANK_KILLED), dismissed=False) == 0


def test_why_names_the_signal_and_the_silence():
    assert "SIGSEGV" in recovery.why_lost(TreeEnded(code=-11), dismissed=False, silent=None)
    assert recovery.why_lost(None, dismissed=False, silent="quiet") == "quiet"
    assert "agent" in recovery.why_lost(None, dismissed=False, silent=None)


# ---- placement ---------------------------------------------------------------------------------

def img(host: str, tree: str) -> ImageInfo:
    return ImageInfo(path=f"/ck/{tree}", host=host, tree_id=tree, program="p")


def test_alive_hosts_keep_their_trees_and_lost_ones_go_to_spares():
    images = (img("a", "1"), img("b", "2"), img("b", "3"), img("c", "4"))
    assert recovery.place(images, {"a", "b", "c"}, ()) == {"a": "a", "b": "b", "c": "c"}
    assert recovery.place(images, {"a", "c"}, ("a", "b", "c", "d")) == {
        "a": "a", "b": "d", "c": "c"}


def test_without_spares_a_lost_hosts_trees_go_to_the_least_loaded_alive_host():
    images = (img("a", "1"), img("a", "2"), img("b", "3"), img("c", "4"))
    assert recovery.place(images, {"a", "b"}, ()) == {"a": "a", "b": "b", "c": "b"}


def test_nowhere_to_go_is_an_error():
    with pytest.raises(ValueError, match="no host"):
        recovery.place((img("a", "1"),), set(), ())


# ---- heartbeats ---------------------------------------------------------------------------------

def test_heartbeats_go_out_and_a_silent_agent_is_closed():
    sim = Sim(2, now=0.0, policy=RecoveryPolicy(heartbeat=1.0, heartbeat_timeout=5.0))
    assert len(sent(sim.tick(0.25), Heartbeat)) == 2
    assert sent(sim.tick(0.5), Heartbeat) == []
    sim.now = 4.0
    sim.send(1, Heartbeat())          # agent 1 speaks, agent 2 does not
    actions = sim.tick(5.5)
    assert of_type(actions, CloseAgent) == [CloseAgent(2)]
    assert [a.agent_id for a in sent(actions, Heartbeat)] == [1]
    assert sim.tick(5.6) == []        # closed once
    sim.leave(2)
    assert "went silent" in sim.m.status()["last_failure"]["why"]


def test_any_message_counts_as_a_heartbeat():
    sim = Sim(1, now=0.0, policy=RecoveryPolicy(heartbeat=1.0, heartbeat_timeout=5.0))
    sim.now = 4.9
    sim.send(1, TreeEnded(code=0))
    assert of_type(sim.tick(9.0), CloseAgent) == []


# ---- without --auto-restart ---------------------------------------------------------------------

def test_without_auto_restart_a_failure_is_only_reported():
    sim = checkpointed(policy=RecoveryPolicy(heartbeat=0))
    actions = killed_by_signal(sim, 2)
    assert of_type(actions, RestartGeneration) == [] and sent(actions, Kill) == []
    assert sim.m.status()["last_failure"]["tree_id"] == "t2"
    assert len(sim.m.agents) == 2


def test_a_program_that_fails_after_its_process_was_killed_is_restarted():
    sim = checkpointed()
    sim.now = 20.0
    sim.send(2, TreeEnded(code=1, killed=RANK_KILLED))   # mpirun exits 1 after its rank
    actions = sim.leave(2)
    assert sorted(a.agent_id for a in sent(actions, Kill)) == [1, 3]
    st = sim.m.status()
    assert st["recovering"] == "stopping" and st["last_exit"] is None
    assert st["last_failure"]["why"] == "its process solver (pid 1234) was killed by SIGKILL"
    assert st["last_failure"]["tree_id"] == "t2"


def test_an_exit_is_reported_and_restarts_nothing():
    sim = checkpointed()
    sim.send(2, TreeEnded(code=3))
    actions = sim.leave(2)
    assert sent(actions, Kill) == [] and sim.m.recovery is None
    st = sim.m.status()
    assert st["last_exit"] == {"tree_id": "t2", "program": "prog", "host": "host2",
                               "exit_code": 3}
    assert st["last_failure"] is None and st["restarts"] == 0


# ---- a recovery ----------------------------------------------------------------------------------

def test_a_lost_tree_stops_the_others_and_restarts_the_generation():
    sim = checkpointed()
    sim.now = 20.0
    actions = killed_by_signal(sim, 2)
    assert sorted(a.agent_id for a in sent(actions, Kill)) == [1, 3]
    assert sim.m.status()["recovering"] == "stopping"
    assert sim.m.status()["running"] is False
    # the others go, as killed trees do
    for agent_id in (1, 3):
        sim.send(agent_id, TreeEnded(code=-9, requested=True))
        actions = sim.leave(agent_id)
    restart = the_restart(actions)
    assert restart.generation == 1 and restart.attempt == 1
    assert [i.tree_id for i in restart.images] == ["t1", "t2", "t3"]
    assert all(old == new for old, new in restart.placement)
    ids = restart_joins(sim, restart)
    sim.now = 23.5
    out = finish_restart(sim, ids)
    assert any("running again" in a.text for a in of_type(out, Notice))
    st = sim.m.status()
    assert st["restarts"] == 1 and st["recovering"] is None and st["running"]
    assert st["time_lost"] == pytest.approx(3.5)
    assert st["last_failure"]["why"] == "its program was killed by SIGKILL"
    assert st["generation"] == 1
    # and generations go on counting
    sim.run_checkpoint()
    assert sim.m.generation == 2 and sim.m.complete.generation == 2


def test_no_checkpoint_requested_while_stopping():
    sim = checkpointed()
    killed_by_signal(sim, 1)
    sim.checkpoint(client=77)
    reply = [a for a in sim.log if getattr(a, "client_id", None) == 77][0].message
    assert not reply.ok and "recovery" in reply.error


def test_a_tree_lost_during_a_checkpoint_fails_it_then_recovery_goes_on():
    sim = checkpointed()
    sim.checkpoint(None)
    sim.step(State.SUSPENDED)
    actions = killed_by_signal(sim, 3)
    assert sorted(a.agent_id for a in sent(actions, Kill)) == [1, 2]
    sim.leave(1)
    actions = sim.leave(2)
    restart = the_restart(actions)
    assert restart.generation == 1                  # the failed generation 2 is not used
    assert sim.m.last_checkpoint["ok"] is False


def test_an_agent_that_vanishes_is_lost_too():
    sim = checkpointed()
    actions = sim.leave(1)                           # no TreeEnded
    assert "agent disappeared" in sim.m.status()["last_failure"]["why"]
    assert sent(actions, Kill)


def test_a_failed_restart_is_tried_again_then_given_up():
    sim = checkpointed(exit_on_last=True)
    killed_by_signal(sim, 1)
    sim.leave(2)
    restart = the_restart(sim.leave(3))
    for attempt in (1, 2, 3):
        assert restart.attempt == attempt
        actions = sim.m.restart_command_ended(attempt, "image damaged", sim.now)
        if attempt < 3:
            assert of_type(actions, RestartGeneration) == []   # not at once
            sim.now += recovery.RETRY_DELAY * attempt
            restart = the_restart(sim.tick(sim.now))
    assert of_type(actions, RestartGeneration) == []
    st = sim.m.status()
    assert "gave up after 3" in st["gave_up"] and st["recovering"] is None
    assert of_type(actions, Shutdown)


def test_a_restart_that_never_finishes_times_out():
    sim = checkpointed(policy=RecoveryPolicy(auto_restart=True, heartbeat=0, restart_timeout=30))
    sim.now = 50.0
    killed_by_signal(sim, 1)
    sim.leave(2)
    restart = the_restart(sim.leave(3))
    restart_joins(sim, RestartGeneration(restart.generation, restart.images[:1],
                                         restart.placement, 1))
    actions = sim.tick(81.0)
    assert sent(actions, Kill)                      # the one that joined goes again
    assert sim.m.recovery.phase is recovery.Phase.STOPPING
    sim.leave(max(sim.m.agents))
    assert the_restart(sim.tick(81.0 + recovery.RETRY_DELAY)).attempt == 2


def test_a_command_that_ends_after_its_trees_joined_changes_nothing():
    sim = checkpointed()
    killed_by_signal(sim, 1)
    sim.leave(2)
    restart = the_restart(sim.leave(3))
    restart_joins(sim, restart)
    assert sim.m.restart_command_ended(1, "exit 3", sim.now) == []
    assert sim.m.restart_command_ended(1, None, sim.now) == []


def test_nothing_to_restart_before_the_first_checkpoint():
    sim = Sim(2, policy=AUTO)
    actions = killed_by_signal(sim, 1)
    assert any("no complete checkpoint" in a.text for a in of_type(actions, Notice))
    assert sent(actions, Kill) == [] and sim.m.recovery is None


def test_kill_during_a_recovery_ends_it():
    sim = checkpointed()
    killed_by_signal(sim, 1)
    sim.m.kill(None)
    assert sim.m.recovery is None and "killed" in sim.m.gave_up
    sim.leave(2)
    assert of_type(sim.leave(3), RestartGeneration) == []


def test_a_silent_host_goes_to_a_spare():
    policy = RecoveryPolicy(auto_restart=True, heartbeat=1.0, heartbeat_timeout=5.0,
                            hosts=("host0", "host1", "host2", "spare"))
    sim = checkpointed(policy=policy)
    for agent_id in (1, 2, 3):
        sim.send(agent_id, Heartbeat())
    sim.now = 12.0
    for agent_id in (1, 3):
        sim.send(agent_id, Heartbeat())
    actions = sim.tick(16.0)
    assert of_type(actions, CloseAgent) == [CloseAgent(2)]
    sim.leave(2)
    sim.leave(1)
    restart = the_restart(sim.leave(3))
    assert dict(restart.placement)[image_of(2).host] == "spare"
    assert dict(restart.placement)["host1"] == "host1"


def test_after_an_agent_vanished_the_restart_waits_for_its_processes_to_end():
    sim = checkpointed()
    sim.now = 30.0
    sim.leave(1)                                  # no TreeEnded: its tree still runs
    sim.leave(2)
    assert of_type(sim.leave(3), RestartGeneration) == []
    assert of_type(sim.tick(30.0 + recovery.AGENT_LOSS_DELAY - 0.1), RestartGeneration) == []
    assert the_restart(sim.tick(30.0 + recovery.AGENT_LOSS_DELAY)).attempt == 1


def test_the_delay_outlasts_the_shims_grace():
    from dmtcp_py.agent import records
    assert recovery.AGENT_LOSS_DELAY > records.FATE_GRACE_MS / 1000


def test_a_kill_that_comes_while_criu_restores_ends_the_restored_tree():
    from dmtcp_py.agent.machine import AgentMachine, Identity, KillTree
    m = AgentMachine(Identity("t1", "p", restart_comp_id="c", restart_generation=1))
    assert m.on_message(Kill()) == [KillTree()]
    assert m.restored(frozenset({5})) == [KillTree()]


def test_the_previous_recoverys_command_ending_is_not_this_ones_failure():
    """The first recovery's restart command lives as long as its trees:
    when one of them is lost, it ends (137) while the second recovery's
    attempt 1 runs; that is no failure of the second."""
    sim = checkpointed()
    killed_by_signal(sim, 1)
    sim.leave(2)
    first = the_restart(sim.leave(3))
    ids = restart_joins(sim, first)
    finish_restart(sim, ids)
    assert sim.m.recovery is None
    killed_by_signal(sim, ids[0])
    start = len(sim.log)
    for agent_id in ids[1:]:
        sim.leave(agent_id)
    second = the_restart(sim.log[start:])
    assert second.attempt == 1 and second.serial != first.serial
    assert sim.m.restart_command_ended(first.serial, "exited with status 137", sim.now) == []
    assert sim.m.recovery is not None and sim.m.recovery.attempt == 1
    assert sim.m.restart_command_ended(second.serial, "image damaged", sim.now)  # this one counts
