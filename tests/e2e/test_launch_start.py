"""dmtcp-launch starts the program at once; its agent loads and joins the
coordinator beside it (agent/early.py).  What the program does meanwhile
is not lost: its own checkpoint request waits for the agent, a signal
sent to dmtcp-launch waits for the agent's handlers, and a program that
ends before the agent has loaded gives its status as under the agent."""
from __future__ import annotations

import os
import re
import signal
import subprocess

import psutil
import pytest

from tests.e2e.harness import TIMEOUT, tool, wait_for
from tests.e2e.test_bad_input import free_port, listening


def _launch(comp, *argv: str, env: dict | None = None, **kw) -> subprocess.Popen:
    """dmtcp-launch --join, without waiting for the tree to join."""
    return subprocess.Popen([tool("dmtcp-launch"), "--join", "-p", str(comp.port),
                             "--ckptdir", str(comp.ckptdir), *argv],
                            stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})}, **kw)


def test_a_checkpoint_the_program_asks_for_at_once_is_taken(comp, programs, tmp_path):
    out = tmp_path / "out"
    with open(out, "w") as o:
        # the 5th tick asks: no wait between ticks, so before the agent has loaded
        proc = _launch(comp, *programs["api_user_py"], "6", "0", stdout=o,
                       stderr=subprocess.PIPE)
    _, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, err
    text = out.read_text()
    assert re.findall(r"^returned .*$", text, re.M) == [
        "returned 1 gen 1 ckpts 1 restarts 0 hooks 1 1 0"], text
    assert len(comp.images()) == 1
    assert comp.status()["generation"] == 1


# the agent waits this long before it joins (fault_injection: at RUNNING)
JOINS_LATE = {"DMTCP_TEST_HOLD_RUNNING": "1.5"}


def test_a_checkpoint_asked_for_before_the_agent_joined_waits_for_the_tree(comp):
    """The launch announced its tree in its hello (coordinator/launching.py):
    a checkpoint asked for while the program runs but its agent has not
    joined yet takes the tree in, rather than finding no process."""
    proc = _launch(comp, "sh", "-c", "echo up; exec sleep 60", stdout=subprocess.PIPE,
                   env=JOINS_LATE)
    try:
        assert proc.stdout.readline() == b"up\n"
        assert comp.status()["num_peers"] == 0  # not joined yet
        out = comp.checkpoint()
        assert "1 trees" in out, out
        assert len(comp.images()) == 1
    finally:
        comp.kill_and_wait(proc)
        proc.stdout.close()


def test_a_launch_killed_before_its_agent_joined_holds_no_checkpoint(comp, programs):
    """The announcement ends with the launch's connection: the checkpoint
    waiting for it goes on at once, with the trees there are (not after
    launching.JOIN_WAIT)."""
    first, _ = comp.launch(*programs["counter_single"])
    late = _launch(comp, "sh", "-c", "echo up; exec sleep 60", stdout=subprocess.PIPE,
                   env={"DMTCP_TEST_HOLD_RUNNING": "60"})
    try:
        assert late.stdout.readline() == b"up\n"
        waiting = subprocess.Popen([tool("dmtcp-command"), "-p", str(comp.port), "-bc"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for(lambda: _notice_seen(comp, "being launched"), what="the checkpoint to wait")
        late.kill()
        out, err = waiting.communicate(timeout=TIMEOUT)
        assert waiting.returncode == 0, err
        assert "1 trees" in out, out
        assert not _notice_seen(comp, "did not join within")
    finally:
        late.kill()
        late.wait()
        late.stdout.close()
        comp.kill_and_wait(first)


def test_a_program_launched_during_a_checkpoint_starts_once_it_is_over(comp, programs):
    """As DMTCP's launch waits for a checkpoint under way: a program that
    ran while the others were stopped would be in no image of that
    generation.  The launch's welcome waits for the round's end."""
    held = {**os.environ, "DMTCP_TEST_HOLD_SUSPENDED": "4"}
    first, _ = comp.launch(*programs["counter_single"], env=held)
    checkpoint = subprocess.Popen([tool("dmtcp-command"), "-p", str(comp.port), "-bc"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    late = None
    try:
        wait_for(lambda: comp.status()["state"] != "RUNNING", what="the checkpoint to start")
        late = _launch(comp, "sh", "-c", "echo up; exec sleep 60", stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE)
        assert late.stdout.readline() == b"up\n"
        assert comp.status()["generation"] == 1  # the checkpoint was over when it started
        assert b"busy with a checkpoint" in late.stderr.readline()  # (said after 2 s)
        out, err = checkpoint.communicate(timeout=TIMEOUT)
        assert checkpoint.returncode == 0 and "1 trees" in out, err
    finally:
        checkpoint.kill()
        checkpoint.wait()
        if late is not None:
            late.kill()
            late.wait()
            late.stdout.close()
            late.stderr.close()
        comp.kill_and_wait(first)


def _notice_seen(comp, text: str) -> bool:
    """The coordinator's log (in $DMTCP_TMPDIR, as the tests run) says text."""
    from dmtcp_py.paths import run_dir_name
    log = os.path.join(run_dir_name(), f"coordinator-{comp.port}.log")
    try:
        with open(log) as f:
            return text in f.read()
    except OSError:
        return False


@pytest.mark.parametrize("namespace", ["1", "0"])
def test_a_signal_sent_while_the_agent_loads_reaches_the_program(comp, namespace):
    proc = _launch(comp, "sh", "-c", "echo up; exec sleep 60", stdout=subprocess.PIPE,
                   env={"DMTCP_PID_NAMESPACE": namespace})
    assert proc.stdout.readline() == b"up\n"  # the program runs: send at once
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=TIMEOUT) == 128 + signal.SIGTERM
    proc.stdout.close()
    wait_for(lambda: comp.status()["num_peers"] == 0, what="the tree to be gone")


@pytest.mark.parametrize("namespace", ["1", "0"])
@pytest.mark.parametrize("script, code", [("true", 0), ("exit 7", 7),
                                          ("kill -USR1 $$", 128 + signal.SIGUSR1)])
def test_a_program_that_ends_at_once_gives_its_status(comp, namespace, script, code):
    proc = _launch(comp, "sh", "-c", script, env={"DMTCP_PID_NAMESPACE": namespace},
                   stderr=subprocess.PIPE)
    _, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == code, err
    assert err == b""
    assert comp.status()["num_peers"] == 0


BEFORE_THE_PROGRAM = """
import sys
from dmtcp_py.agent import early
from dmtcp_py.cli import fastargs, launcher

def instead_of_loading(started, module, may_leave):
    print(" ".join(sorted(sys.modules)))  # all that ran before the program started
    early.abandon(started)
    return 0

launcher.early.load_beside = instead_of_loading
sys.exit(launcher.launch(fastargs.launch_args(sys.argv[1:])))
"""


def test_nothing_heavy_runs_before_the_program(comp):
    """What dmtcp-launch runs before the program starts (the checks, the
    hello to the coordinator, the spawn) loads none of the agent's heavy
    modules (tests/unit/test_light_imports.py names them)."""
    from tests.unit.test_light_imports import HEAVY
    res = subprocess.run([os.path.join(os.path.dirname(tool("dmtcp-launch")), "python"), "-c",
                          BEFORE_THE_PROGRAM, "--join", "-p", str(comp.port), "sleep", "30"],
                         capture_output=True, text=True, timeout=TIMEOUT)
    assert res.returncode == 0, res.stderr
    loaded = set(res.stdout.split())
    assert "dmtcp_py.agent.early" in loaded
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))


def _end_listener(port: int) -> None:
    """The process listening on port, if any is left, killed by its pid."""
    for conn in psutil.net_connections("tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid:
            os.kill(conn.pid, signal.SIGKILL)


@pytest.mark.parametrize("script, code", [("true", 0), ("exit 7", 7)])
def test_a_program_that_ends_at_once_under_its_own_coordinator_gives_its_status(
        tmp_path, no_strays, script, code):
    """A launch that starts its coordinator forks it as the program starts,
    beside the agent's load: a program that ends before either is up still
    gives its status, and that coordinator exits with it."""
    port = free_port()
    try:
        res = subprocess.run([tool("dmtcp-launch"), "-p", str(port), "--ckptdir", str(tmp_path),
                              "sh", "-c", script], stdin=subprocess.DEVNULL,
                             capture_output=True, timeout=TIMEOUT)
        assert res.returncode == code, res.stderr
        assert res.stderr == b""
        wait_for(lambda: not listening(port), what="the coordinator to exit")
    finally:
        _end_listener(port)


def test_the_coordinator_a_launch_starts_listens_before_the_program_runs(tmp_path, no_strays):
    """Its port is bound, and its token file written, before the program
    starts (cli/coordinators.py Starting.bind): a command given as soon as
    the program runs reaches it, and a checkpoint waits for the tree."""
    port = free_port()
    proc = subprocess.Popen([tool("dmtcp-launch"), "-p", str(port), "--ckptdir", str(tmp_path),
                             "sh", "-c", "echo up; exec sleep 60"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, env={**os.environ, **JOINS_LATE})
    try:
        assert proc.stdout.readline() == b"up\n"
        res = subprocess.run([tool("dmtcp-command"), "-p", str(port), "-bc"],
                             capture_output=True, text=True, timeout=TIMEOUT)
        assert res.returncode == 0 and "1 trees" in res.stdout, res.stderr
        subprocess.run([tool("dmtcp-command"), "-p", str(port), "-k"], capture_output=True,
                       timeout=TIMEOUT, check=True)
        assert proc.wait(timeout=TIMEOUT) != 0
        wait_for(lambda: not listening(port), what="the coordinator to exit")
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        _end_listener(port)


def test_a_daemon_coordinator_listens_in_a_session_of_its_own_holding_none_of_our_files(
        no_strays):
    """`dmtcp-coordinator --daemon` returns once it listens (one fork: the
    daemon is its own session's leader, with /dev/null for its standard
    files, and keeps none of the caller's pipes: the run below ends)."""
    port = free_port()
    try:
        res = subprocess.run([tool("dmtcp-coordinator"), "--daemon", "--exit-on-last", "-q",
                              "--coord-port", str(port)], stdin=subprocess.DEVNULL,
                             capture_output=True, timeout=TIMEOUT)
        assert res.returncode == 0 and res.stderr == b"", res.stderr
        assert listening(port)
        [pid] = [c.pid for c in psutil.net_connections("tcp")
                 if c.status == psutil.CONN_LISTEN and c.laddr.port == port]
        assert os.getsid(pid) == pid
        assert {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in (0, 1, 2)} == {"/dev/null"}
        subprocess.run([tool("dmtcp-command"), "-p", str(port), "-q"], capture_output=True,
                       timeout=TIMEOUT, check=True)
        wait_for(lambda: not listening(port), what="the coordinator to exit")
    finally:
        _end_listener(port)
