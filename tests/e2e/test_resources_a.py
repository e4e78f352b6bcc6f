"""Kernel resources a program holds survive two checkpoint/restart cycles:
timers, signals and children, fork+exec and popen, pipes between three
processes, epoll over eventfd, timerfd, signalfd and inotify, and the calls
Linux never restarts after a signal handler (sleeps, poll and friends,
signal waits), which must not see the checkpoint signal.

Each program (tests/e2e/programs/res_*.c) checks its own invariants and
exits 3 with a "FAIL: ..." line on stderr when one breaks.  Each is
checkpointed while running (and keeps running), killed, restarted from the
script, checkpointed again, killed, restarted again, and must then run to
its end: exit 0, "done", ticks consecutive."""
from __future__ import annotations

import os

import pytest

from tests.e2e.harness import TIMEOUT, last_tick, ticks, tree_report, wait_for
from tests.e2e.test_cycle import assert_continues, checkpoint_and_kill

TICKS, INTERVAL_MS = 300, 10  # about 3 s of ticks per run

# program -> processes it always has (its short-lived children not counted)
PEERS = {
    "res_timers": 2,   # itimer, POSIX timer; a child using alarm()
    "res_sigchld": 1,  # forks children, SIGCHLD handler, waitpid statuses; 2 zombies
    "res_exec": 1,     # popen("echo N"), fork + execv /bin/true, /bin/false
    "res_chain": 3,    # parent -> child -> grandchild -> parent over pipes
    "res_epoll": 1,    # epoll: timerfd, eventfd (thread), signalfd, inotify
    "res_waits": 1,    # sleeps, poll/select/epoll, signal waits in 4 threads: no EINTR
    "res_closeall": 1,  # closes every fd it did not open, every way there is
}


def wait_alive(comp, proc, out, *, peers: int, tick: int) -> None:
    """Wait for `peers` processes under control and for tick `tick`; a run
    that ends first fails at once, with what it said."""
    def ready() -> bool:
        if proc.poll() is not None:
            return True
        status = comp.status()
        return status["num_peers"] >= peers and status["running"] and last_tick(out) >= tick

    wait_for(ready, what=f"{peers} processes under control and tick {tick}",
             explain=lambda: tree_report(proc))
    assert proc.poll() is None, tree_report(proc)


def assert_no_failure(procs) -> None:
    """No run, not even one killed later, saw a broken invariant."""
    for proc in procs:
        err = proc.err_path.read_text()
        assert "FAIL" not in err, err


# Not strict: it runs and reports XPASS when it passes.  (res_timers was
# here too: its alarm() child's SIGALRM, expiring while CRIU dumped it, was
# lost from the image; hijack/src/timers.c, test_lost_alarm.py.)
FLAKY = {# seen once in about fifteen runs: after a restart the program's own
         # pipe survived its closing everything (which way is now printed)
         "res_closeall": "a pipe may survive closing everything after a restart "
                         "(under investigation)"}


@pytest.mark.parametrize("program", [
    pytest.param(p, marks=[pytest.mark.xfail(reason=FLAKY[p], strict=False)] if p in FLAKY else [])
    for p in PEERS])
def test_resources_survive_two_restarts(comp, programs, program):
    # res_epoll's temporary directory goes with the test's
    proc, out = comp.launch(*programs[program], str(TICKS), str(INTERVAL_MS),
                            env={**os.environ, "TMPDIR": str(comp.root)})
    runs = [proc]
    for cycle in range(2):
        wait_alive(comp, proc, out, peers=PEERS[program], tick=last_tick(out) + 10)
        before, killed = checkpoint_and_kill(comp, proc, out, after=last_tick(out))
        assert_no_failure(runs)
        proc, out = comp.restart()
        runs.append(proc)
        wait_alive(comp, proc, out, peers=PEERS[program], tick=1)
        assert_continues(out, before, killed, program, finished=False)
        assert comp.status()["generation"] == cycle + 1
    assert proc.wait(timeout=TIMEOUT) == 0, proc.err_path.read_text()
    assert_no_failure(runs)
    assert_continues(out, before, killed, program)
    assert ticks(out)[-1][:2] == ["done", str(TICKS)]
