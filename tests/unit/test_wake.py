"""The agent's wake-up of unconnected processes: which signal, and who is
sent it (a process that does not catch it would die of it)."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess

from dmtcp_py.agent import wake


def test_the_reserved_signal_is_the_shims():
    assert wake.reserved_signal({}) == signal.SIGRTMAX - 2
    assert wake.reserved_signal({"DMTCP_SIGCKPT": "40"}) == 40
    for bad in ("", "abc", "0", "-3", str(signal.NSIG)):
        assert wake.reserved_signal({"DMTCP_SIGCKPT": bad}) == signal.SIGRTMAX - 2


def test_a_process_that_catches_the_signal_is_told_from_one_that_does_not():
    # Python catches SIGINT; nobody here catches this real-time signal
    sig = signal.SIGRTMAX - 5
    assert wake.handles(os.getpid(), signal.SIGINT)
    assert not wake.handles(os.getpid(), sig)
    assert not wake.handles(2 ** 22 + 12345, signal.SIGINT)  # no such process


def test_a_blocked_uncaught_signal_reads_as_an_exec_under_way():
    sig = signal.SIGRTMAX - 5
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {sig})
    try:
        assert wake.in_exec(os.getpid(), sig)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    assert not wake.in_exec(os.getpid(), sig)


def test_a_process_without_the_handler_is_never_sent_the_signal():
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert wake.wake([child.pid], signal.SIGRTMAX - 2) == []
        assert child.poll() is None  # alive: its default action would have ended it
    finally:
        child.kill()
        child.wait()


@contextlib.contextmanager
def _python_child(setup: str):
    """A python3 child that runs setup, says it is ready, and sleeps; gone
    at the end."""
    code = ("import signal, sys, threading, time\n"
            f"{setup}print('ready', flush=True)\ntime.sleep(30)\n")
    child = subprocess.Popen(["python3", "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        yield child
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()


def test_a_process_with_the_handler_is_woken():
    sig = signal.SIGRTMAX - 2
    with _python_child(f"signal.signal({sig}, lambda *a: sys.exit(7))\n") as child:
        assert wake.wake([child.pid], sig) == [child.pid]
        assert child.wait(timeout=10) == 7


def _pending(pid: int, field: str) -> int:
    """A signal mask line of /proc/pid/task/pid/status (the main thread)."""
    for line in open(f"/proc/{pid}/task/{pid}/status"):
        if line.startswith(field):
            return int(line.split()[1], 16)
    raise AssertionError(f"no {field} line")


def test_the_wake_up_goes_to_the_main_thread_not_to_the_process():
    """A process-directed signal may wake one thread and be taken by
    another: the first one's epoll_wait then fails with EINTR and no
    handler ran.  Both threads block the signal here, so that it stays
    pending where it was sent: on the main thread, or on the process."""
    sig = signal.SIGRTMAX - 2
    setup = (f"signal.signal({sig}, lambda *a: None)\n"
             f"signal.pthread_sigmask(signal.SIG_BLOCK, {{{sig}}})\n"
             "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n")
    with _python_child(setup) as child:
        bit = 1 << (sig - 1)
        assert wake.wake([child.pid], sig) == [child.pid]
        assert _pending(child.pid, "SigPnd:") & bit  # the main thread's own
        assert not _pending(child.pid, "ShdPnd:") & bit  # not the process's
        # an older shim's process, unconnected for a while: to the process
        assert wake.wake([child.pid], sig, whole_process=True) == [child.pid]
        assert _pending(child.pid, "ShdPnd:") & bit


def test_a_zombie_is_neither_woken_nor_waited_for():
    """It keeps its signal masks in /proc, but it will never connect."""
    sig = signal.SIGRTMAX - 2
    pid = os.fork()
    if pid == 0:  # catches the signal and blocks another, as the shim's processes may
        signal.signal(sig, lambda *a: None)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGRTMAX - 5})
        os._exit(0)
    try:
        while "\nState:\tZ" not in (open(f"/proc/{pid}/status").read()):
            pass
        assert not wake.handles(pid, sig)
        assert not wake.in_exec(pid, signal.SIGRTMAX - 5)
        assert wake.wake([pid], sig) == []
    finally:
        os.waitpid(pid, 0)
