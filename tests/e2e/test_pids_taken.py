"""A restart never fails because a pid is taken (issue 19, "Pids taken").

As root, each tree runs in a PID namespace of its own from its launch, and
CRIU restores it into a fresh one: the program's getpid() is the same
after a restart whatever the host's pids are doing.  So a copy of a
checkpoint restarts beside the still running original (the issue's check:
`dmtcp-restart --new-coordinator -p 0 IMAGE`), and after other processes
took the pids the tree had on the host.  A tree without a namespace (here
DMTCP_PID_NAMESPACE=0, as for a user who is not root or a program on a
terminal) needs its own pids: the restart says in one line which is
taken, and starts nothing.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from dmtcp_py.images import manifest
from tests.e2e.harness import TIMEOUT, Computation, ticks, tool, wait_for

# prints its pid as getpid() says it at every tick
TICKER = """\
import os, time
i = 0
while True:
    i += 1
    print(f"tick {i} {os.getpid()}", flush=True)
    time.sleep(0.05)
"""


def rows(path) -> list[tuple[int, int]]:
    """(tick, getpid()) of every tick line so far."""
    return [(int(r[1]), int(r[2])) for r in ticks(path) if r[0] == "tick" and len(r) == 3]


def launch_ticker(comp: Computation, env: dict | None = None):
    proc, out = comp.launch(sys.executable, "-c", TICKER, env=env)
    comp.wait_peers(1)
    wait_for(lambda: len(rows(out)) >= 3, what="the ticker to tick")
    return proc, out


def checkpointed(comp: Computation) -> tuple[manifest.Manifest, str]:
    comp.checkpoint()
    (image,) = comp.images()
    return manifest.load(image), str(image)


def restart_beside(image: str, tmp_path, label: str, env: dict | None = None):
    """The issue's check: a restart with a coordinator of its own."""
    out, err = tmp_path / f"{label}.out", tmp_path / f"{label}.err"
    with open(out, "w") as o, open(err, "w") as e:
        proc = subprocess.Popen([tool("dmtcp-restart"), "--new-coordinator", "-p", "0", image],
                                stdin=subprocess.DEVNULL, stdout=o, stderr=e,
                                env={**os.environ, **(env or {})})
    return proc, out, err


def end(proc: subprocess.Popen) -> None:
    """A copy ends as a user ends it: SIGTERM to its dmtcp-restart, which
    passes it to the program."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=TIMEOUT)


def hold_pid(pid: int) -> subprocess.Popen | None:
    """A process of ours on that host pid (ns_last_pid: the next fork gets
    the pid after it), or None when another process already has it."""
    for _ in range(200):
        if os.path.exists(f"/proc/{pid}"):
            return None
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(pid - 1))
        proc = subprocess.Popen(["sleep", "600"], stdin=subprocess.DEVNULL)
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
    pytest.fail(f"could not place a process on pid {pid}")


def test_a_copy_restarts_beside_the_running_original(comp, tmp_path):
    launch, out = launch_ticker(comp)
    m, image = checkpointed(comp)
    assert m.pid_namespace
    (tick_then, pid_then), = [r for r in rows(out)][-1:]
    copy, copy_out, copy_err = restart_beside(image, tmp_path, "copy")
    try:
        # the copy goes on from the checkpoint, with the program's own pid ...
        wait_for(lambda: len(rows(copy_out)) >= 5, what="the copy to tick")
        first_tick = rows(copy_out)[0][0]
        assert first_tick > 1 and first_tick <= tick_then + 2
        assert {pid for _, pid in rows(copy_out)} == {pid_then}
        # ... while the original ticks on beside it
        seen = len(rows(out))
        wait_for(lambda: len(rows(out)) > seen + 3 and len(rows(copy_out)) > 8,
                 what="both copies to tick side by side")
        assert launch.poll() is None and copy.poll() is None, copy_err.read_text()
        assert {pid for _, pid in rows(out)} == {pid_then}
        # and each is checkpointed by its own coordinator
        assert "done" in comp.checkpoint()
    finally:
        end(copy)
    assert copy.returncode == 128 + signal.SIGTERM, copy_err.read_text()
    assert launch.poll() is None  # the original's end is its own
    comp.kill_and_wait(launch)
    # the init's working directory, shared by both, went with the last
    assert m.init_dir and not os.path.exists(m.init_dir)


def test_a_restart_after_other_processes_took_the_pids(comp, tmp_path):
    launch, out = launch_ticker(comp)
    m, image = checkpointed(comp)
    pid_then = rows(out)[-1][1]
    comp.kill_and_wait(launch)
    holders = []
    copy = None
    try:
        # every pid the tree had on the host is somebody else's now
        holders = [h for h in (hold_pid(pid) for pid in m.pids) if h is not None]
        assert all(os.path.exists(f"/proc/{pid}") for pid in m.pids)
        copy, copy_out, copy_err = restart_beside(image, tmp_path, "after")
        wait_for(lambda: len(rows(copy_out)) >= 3, what="the restored ticker to tick")
        assert copy.poll() is None, copy_err.read_text()
        assert {pid for _, pid in rows(copy_out)} == {pid_then}
        assert rows(copy_out)[0][0] > 1
    finally:
        if copy is not None:
            end(copy)
        for h in holders:
            h.kill()
            h.wait()
    assert copy.returncode == 128 + signal.SIGTERM


def test_without_a_namespace_a_taken_pid_is_named(comp, tmp_path):
    """As for a user who is not root: the running original holds the pids
    its image needs."""
    env = {**os.environ, "DMTCP_PID_NAMESPACE": "0"}
    launch, out = launch_ticker(comp, env=env)
    m, image = checkpointed(comp)
    assert not m.pid_namespace and not m.ns_pids
    copy, copy_out, copy_err = restart_beside(image, tmp_path, "refused", env=env)
    try:
        assert copy.wait(timeout=TIMEOUT) != 0
    finally:
        end(copy)
    lines = copy_err.read_text().strip().splitlines()
    assert len(lines) == 1, lines
    taken = min(m.pids)
    assert f"pid {taken}, which the image needs, is in use" in lines[0]
    assert "end that process" in lines[0]
    assert not rows(copy_out)
    assert launch.poll() is None  # the original untouched
    comp.kill_and_wait(launch)


def test_a_namespaced_tree_ends_as_its_program_did(comp):
    """The namespace's init, pid 1 there, cannot die of the program's
    signal: the agent hears it instead and ends the same way as without
    a namespace; ^C (SIGINT to dmtcp-launch) reaches the program."""
    killed, _ = comp.launch("sh", "-c", "kill -TERM $$")
    assert killed.wait(timeout=TIMEOUT) == 128 + signal.SIGTERM
    # the coordinator heard of a signal (an end by exit 143 would be the
    # program's own exit, in last_exit)
    st = wait_for(lambda: (s := comp.status())["num_trees"] == 0 and s, what="the end told")
    assert st["last_exit"] is None
    trapped, out = comp.launch("sh", "-c", "trap 'echo interrupted; exit 7' INT; "
                               "echo ready; while :; do sleep 0.05; done")
    wait_for(lambda: "ready" in out.read_text(), what="the trap to be set")
    trapped.send_signal(signal.SIGINT)
    assert trapped.wait(timeout=TIMEOUT) == 7
    assert "interrupted" in out.read_text()
