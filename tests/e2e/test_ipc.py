"""Blocking IPC across checkpoints (tests/e2e/programs/res_ipc.c): System V
semaphores and message queues, POSIX message queues, and sockets with
SO_RCVTIMEO/SO_SNDTIMEO, whose blocking calls Linux does not restart after
the checkpoint signal's handler; and POSIX message queues, which CRIU does
not save, keeping their messages, attributes and fds.

The program checks itself: any failed call (EINTR included) or wrong
message is a "FAIL" line on stderr and exit 3."""
from __future__ import annotations

from tests.e2e.harness import TIMEOUT, last_tick, ticks
from tests.e2e.test_cycle import assert_continues, checkpoint_and_kill
from tests.e2e.test_resources_a import assert_no_failure, wait_alive

PEERS = 2  # parent and child
INTERVAL_MS = 10

# res_ipc.c's queue mode: (text, priority) in the order sent
QUEUE_A = [("a0", 0), ("a1", 5), ("a2", 2), ("a3", 5), ("a4", 0), ("a5", 9)]
QUEUE_B = [("b0", 1), ("b1", 3), ("b2", 1), ("b3", 3)]
NOTIFY_VALUE = 4242


def received(name: str, sent: list[tuple[str, int]]) -> str:
    """What mq_receive gives back: highest priority first, then in the order sent."""
    order = sorted(sent, key=lambda m: -m[1])  # stable: the order within a priority stays
    return f"queue {name} " + " ".join(f"{text}:{prio}" for text, prio in order)


def test_blocking_ipc_survives_checkpoints_and_restart(comp, programs):
    total = 1500  # ticks: still running after six checkpoints on a busy machine
    proc, out = comp.launch(*programs["res_ipc"], str(total), str(INTERVAL_MS))
    runs = [proc]
    wait_alive(comp, proc, out, peers=PEERS, tick=10)
    for n in range(5):
        comp.checkpoint()  # -bc: the program keeps running
        wait_alive(comp, proc, out, peers=PEERS, tick=last_tick(out) + 5)
        assert comp.status()["generation"] == n + 1
    assert_no_failure(runs)
    before, killed = checkpoint_and_kill(comp, proc, out, after=last_tick(out))
    assert_no_failure(runs)
    proc, out = comp.restart()
    runs.append(proc)
    assert proc.wait(timeout=TIMEOUT) == 0, proc.err_path.read_text()
    assert_no_failure(runs)
    assert_continues(out, before, killed, "res_ipc")
    assert ticks(out)[-1][:2] == ["done", str(total)]


def test_posix_queues_keep_their_messages(comp, programs):
    total = 400
    proc, out = comp.launch(*programs["res_ipc"], str(total), str(INTERVAL_MS), "queue")
    runs = [proc]
    wait_alive(comp, proc, out, peers=PEERS, tick=5)
    comp.checkpoint()  # the queues go back where they were, the program goes on
    wait_alive(comp, proc, out, peers=PEERS, tick=last_tick(out) + 5)
    before, killed = checkpoint_and_kill(comp, proc, out, after=last_tick(out))
    proc, out = comp.restart()
    runs.append(proc)
    assert proc.wait(timeout=TIMEOUT) == 0, proc.err_path.read_text()
    assert_no_failure(runs)
    assert_continues(out, before, killed, "res_ipc")
    lines = out.read_text().splitlines()
    assert received("a", QUEUE_A) in lines, lines[-5:]
    assert received("b", QUEUE_B) in lines, lines[-5:]
    assert f"notified {NOTIFY_VALUE}" in lines, lines[-5:]
    assert lines[-1] == f"done {total}"
