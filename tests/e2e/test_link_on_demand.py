"""A process connects to its agent only when a checkpoint needs it: no
checkpoint thread, no connection before (hijack/src/ckpt_thread.c).  Such a
process is checkpointed and restarted like any other, also one caught
while it forks or execs."""
from __future__ import annotations

import os

import psutil
import pytest

from tests.e2e.harness import TIMEOUT, last_tick, ticks, wait_for

LOOP_ROUNDS = 8000


def _chain(rounds: int) -> str:
    """forkexec_loop's hash after that many rounds."""
    h = 1
    for n in range(1, rounds + 1):
        h = (h * 6364136223846793005 + n) % (1 << 64)
    return f"{h:x}"


def _program(launcher: psutil.Process, name: str) -> psutil.Process:
    found = []
    wait_for(lambda: found.extend(p for p in launcher.children(recursive=True)
                                  if p.name() == name) or found, what=f"process {name}")
    return found[0]


def _threads(proc: psutil.Process) -> list[str]:
    names = []
    for tid in os.listdir(f"/proc/{proc.pid}/task"):
        with open(f"/proc/{proc.pid}/task/{tid}/comm") as f:
            names.append(f.read().strip())
    return names


def _sockets(proc: psutil.Process) -> int:
    return sum(1 for fd in os.listdir(f"/proc/{proc.pid}/fd")
               if os.readlink(f"/proc/{proc.pid}/fd/{fd}").startswith("socket:"))


@pytest.mark.parametrize("options", [(), ("--incremental",)], ids=["whole", "incremental"])
def test_a_fork_exec_loop_checkpointed_mid_fork_goes_on_after_restart(comp, programs, options):
    """Incremental: each dump after the first leaves to its parent what the
    loop did not write, while children come and go (and pids are used
    again) between the dumps (agent/tracking.py)."""
    proc, out = comp.launch(*options, *programs["forkexec_loop"], str(LOOP_ROUNDS))
    wait_for(lambda: last_tick(out) >= 100, what="the loop")
    for _ in range(3 if options else 2):
        before = last_tick(out)
        comp.checkpoint()
        wait_for(lambda: last_tick(out) > before + 50, what="the loop after its checkpoint")
    assert not [r for r in ticks(out) if r[0] == "done"], "the loop ended before the kill"
    comp.kill_and_wait(proc)
    restarted, rout = comp.restart()
    assert restarted.wait(timeout=TIMEOUT * 3) == 0, rout.read_text()[-300:]
    rows = ticks(rout)
    assert ["done", str(LOOP_ROUNDS), _chain(LOOP_ROUNDS)] in rows
    first = next(int(r[1]) for r in rows if r[0] == "tick")
    assert first > 100  # it went on from the checkpoint, not from the start


def test_a_process_with_no_thread_is_checkpointed_and_restarted(comp, programs):
    proc, out = comp.launch(*programs["counter_single"], "100000", "20")
    wait_for(lambda: last_tick(out) > 3, what="ticks")
    counter = _program(psutil.Process(proc.pid), "counter_single")
    comp.wait_peers(1)  # listed although it never connected
    assert _threads(counter) == ["counter_single"]
    assert _sockets(counter) == 0
    comp.checkpoint()
    # served from its signal handler: still no thread of ours
    assert _threads(counter) == ["counter_single"]
    before = last_tick(out)
    wait_for(lambda: last_tick(out) > before + 3, what="ticks after the checkpoint")
    comp.kill_and_wait(proc)
    killed = last_tick(out)
    restarted, rout = comp.restart()
    wait_for(lambda: last_tick(rout) > 3, what="the restarted program")
    assert 1 < int(ticks(rout)[0][1]) <= killed + 1
    again = _program(psutil.Process(restarted.pid), "counter_single")
    assert _threads(again) == ["counter_single"]
    comp.checkpoint()  # and once more, restored
    before = last_tick(rout)
    wait_for(lambda: last_tick(rout) > before + 3, what="ticks after the second checkpoint")
    comp.kill_and_wait(restarted)
