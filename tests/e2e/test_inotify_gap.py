"""inotify events queued when the checkpoint comes are read after it.

CRIU saves an inotify instance's watches but not its queued events: a
checkpoint between a file's close() and the program's read of the
IN_CLOSE_WRITE lost that event after a restart (res_epoll failed so, about
once in twenty runs).  The program (programs/res_inotify_gap.c) queues two
events and stops reading until the test lets it go: the test checkpoints at
exactly that point, and the program must then read both, in order, before
a newer one; after a checkpoint it survives, after a restart, and in a
round without a checkpoint.  The ways of waiting for the fd: epoll (level
and edge), poll then a blocking read (which must not block for nothing),
a read buffer that holds one event at a time, a forked child reading the
instance its parent holds too, a reading parent whose forked child holds
the instance and never reads it, 500 events kept; and the same in Python
with the instance made through ctypes, as Python's inotify modules do."""
from __future__ import annotations

import pytest

from tests.e2e.harness import TIMEOUT, wait_for


def lines(out) -> list[str]:
    try:
        return out.read_text().splitlines()
    except FileNotFoundError:
        return []


def wait_line(proc, out, line: str) -> None:
    """Wait for the line; a run that ends first fails at once."""
    wait_for(lambda: line in lines(out) or proc.poll() is not None, what=line)
    assert line in lines(out), f"ended with {proc.poll()}: {proc.err_path.read_text()}"


# the C program's ways of waiting; "python": programs/inotify_gap.py, whose
# instance is made through ctypes.CDLL("libc.so.6"), out of the shim's
# sight (it is kept because the process reads it)
@pytest.mark.parametrize("mode", ["epoll", "edge", "blocking", "small", "forked", "many",
                                  "reader", "python"])
def test_queued_events_survive_checkpoint_and_restart(comp, programs, tmp_path, mode):
    watched = tmp_path / "watched"
    watched.mkdir()
    argv = ([*programs["inotify_gap_py"], str(watched), "3"] if mode == "python"
            else [*programs["res_inotify_gap"], str(watched), "3", mode])
    proc, out = comp.launch(*argv)
    comp.wait_peers(1)

    # round 1: a checkpoint the program goes on from
    wait_line(proc, out, "closed 1")
    comp.checkpoint()
    (watched / "go.1").mkdir()  # a directory: no IN_CLOSE_WRITE of its own
    wait_line(proc, out, "event 1")
    peers = 1
    if mode == "reader":  # and a child that holds the instance, never reading it
        wait_line(proc, out, "forked")
        peers = 2
        comp.wait_peers(peers)

    # round 2: checkpoint, kill, restart
    wait_line(proc, out, "closed 2")
    comp.checkpoint()
    assert comp.kill_and_wait(proc) != 0
    proc, out = comp.restart()
    comp.wait_peers(peers)
    (watched / "go.2").mkdir()
    wait_line(proc, out, "event 2")

    # round 3: no checkpoint; nothing of ours is left on the fd
    wait_line(proc, out, "closed 3")
    (watched / "go.3").mkdir()
    assert proc.wait(timeout=TIMEOUT) == 0, proc.err_path.read_text()
    assert lines(out)[-2:] == ["event 3", "done 3"], lines(out)
    assert "FAIL" not in proc.err_path.read_text()
