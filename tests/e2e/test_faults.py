"""Faults in the middle of a checkpoint, injected for real: the processes
that survive go on running (never left stopped), with their sockets, and
the previous complete generation still restarts."""
from __future__ import annotations

import os
import signal
import subprocess

import pytest

from dmtcp_py import procfs
from dmtcp_py.fault_injection import hold_env
from dmtcp_py.protocol.states import State
from tests.e2e.harness import TIMEOUT, last_tick, ticks, tool, wait_for
from tests.e2e.test_bad_input import free_port
from tests.e2e.test_network import last


def test_coordinator_killed_mid_checkpoint_the_program_goes_on_with_its_sockets(comp, programs):
    port = str(free_port())
    hold = {**os.environ, **hold_env(State.DRAINED, 3)}  # agents linger with sockets parked
    server, sout = comp.launch(*programs["net_stream"], "server", "127.0.0.1", port, "50", "10",
                               env=hold)
    wait_for(lambda: sout.exists() and "listening" in sout.read_text(), what="the server")
    counter, cout = comp.launch(*programs["counter_single"], "100000", "10", env=hold)
    comp.wait_peers(2)
    comp.checkpoint()  # generation 1: a good one
    first = comp.images()
    with open(comp.root / "bc.err", "w") as err:
        bc = subprocess.Popen([tool("dmtcp-command"), "-p", str(comp.port), "-bc"],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
    wait_for(lambda: comp.status()["state"] == "DRAINED", what="the agents draining")
    comp.coordinator.send_signal(signal.SIGKILL)
    comp.coordinator.wait()

    assert bc.wait(timeout=TIMEOUT) != 0
    assert (comp.root / "bc.err").read_text().count("\n") == 1  # one line, no traceback
    # not left stopped: the counter ticks on
    seen = last_tick(cout)
    wait_for(lambda: last_tick(cout) >= seen + 10, what="the counter to go on")
    # the listening socket is back in its place: a new client is served to the end
    client = subprocess.run([*programs["net_stream"], "client", "127.0.0.1", port, "50", "10"],
                            stdin=subprocess.DEVNULL, capture_output=True, text=True,
                            timeout=TIMEOUT)
    assert client.returncode == 0, client.stderr
    assert server.wait(timeout=TIMEOUT) == 0, server.err_path.read_text()
    assert last(sout, "server") == 50
    # the good generation is still there, untouched by the abandoned one
    assert comp.images() == first
    assert not list(comp.ckptdir.glob(".*partial*"))
    counter.terminate()  # the agent passes it on to its tree
    assert counter.wait(timeout=TIMEOUT) != 0
    # and the good generation restarts, both trees, under a new coordinator
    out, new_port = comp.root / "restarted.out", str(free_port())
    with open(out, "w") as o:
        restarted = subprocess.Popen([tool("dmtcp-restart"), "--new-coordinator", "-p", new_port,
                                      *map(str, first)],
                                     stdin=subprocess.DEVNULL, stdout=o, stderr=subprocess.STDOUT)

    def counter_ticks() -> list[int]:
        return [int(r[1]) for r in ticks(out) if r[0] == "tick" and r[2] != "server"]

    try:
        wait_for(lambda: len(counter_ticks()) >= 5 or restarted.poll() is not None,
                 what="the restarted counter")
        assert restarted.poll() is None, out.read_text()
        assert 0 < counter_ticks()[0] <= seen + 1
    finally:
        subprocess.run([tool("dmtcp-command"), "-p", new_port, "-q"], capture_output=True,
                       timeout=TIMEOUT)
        restarted.wait(timeout=TIMEOUT)


CRIU_KILLER = """#!/bin/sh
# Runs the real CRIU; once armed, SIGKILLs it as soon as it has a page
# image open for writing, in the middle of a dump, and then itself: the
# agent sees the process it started killed, as if it were CRIU.
{criu} "$@" &
pid=$!
if [ -e {armed} ]; then
    while kill -0 $pid 2>/dev/null; do
        if ls -l /proc/$pid/fd 2>/dev/null | grep -q 'pages-.*\\.img'; then
            kill -9 $pid
            wait $pid
            kill -9 $$
        fi
    done
fi
wait $pid
"""

BIG_PROGRAM = """
import sys, time
memory = bytearray(256 << 20)
for i in range(0, len(memory), 4096):
    memory[i] = i % 251 or 1
for tick in range(1, 100000):
    print("tick", tick, sum(memory[::1 << 20]), flush=True)
    time.sleep(0.01)
"""


def test_the_criu_started_with_a_round_goes_with_the_round(comp, programs):
    """CRIU starts as the tree stops, for the dump to come; a round that
    ends without its dump (its coordinator killed) leaves no CRIU behind,
    nor does a checkpoint."""
    from dmtcp_py.agent.tree import children_of

    def criu_children(agent: int) -> list[int]:
        return [pid for pid in children_of(agent)
                if (procfs.read(f"/proc/{pid}/comm") or "").strip() == "criu"]

    hold = {**os.environ, **hold_env(State.SUSPENDED, 3)}
    proc, out = comp.launch(*programs["counter_single"], "100000", "10", env=hold)
    comp.wait_peers(1)
    with open(comp.root / "bc.err", "w") as err:
        bc = subprocess.Popen([tool("dmtcp-command"), "-p", str(comp.port), "-bc"],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
    wait_for(lambda: criu_children(proc.pid), what="the CRIU started for the dump")
    comp.coordinator.send_signal(signal.SIGKILL)
    comp.coordinator.wait()
    assert bc.wait(timeout=TIMEOUT) != 0
    seen = last_tick(out)
    wait_for(lambda: last_tick(out) >= seen + 10, what="the program to go on")
    wait_for(lambda: not criu_children(proc.pid), what="the unused CRIU to end")
    proc.terminate()
    proc.wait(timeout=TIMEOUT)


def test_criu_killed_mid_dump_the_program_goes_on_and_the_last_good_image_stays(comp,
                                                                                    tmp_path):
    from dmtcp_py.paths import criu_binary
    armed = tmp_path / "armed"
    killer = tmp_path / "criu-killer"
    killer.write_text(CRIU_KILLER.format(criu=criu_binary(), armed=armed))
    killer.chmod(0o755)
    program = tmp_path / "big.py"
    program.write_text(BIG_PROGRAM)
    proc, out = comp.launch("python3", str(program), env={**os.environ, "DMTCP_CRIU": str(killer)})
    comp.wait_peers(1)
    wait_for(lambda: last_tick(out) >= 3, what="the program")
    comp.checkpoint()  # generation 1, with the real CRIU
    good = {p.name: p.stat().st_mtime_ns for p in comp.images()[0].iterdir()}

    armed.touch()
    res = comp.command("-bc", check=False)
    assert res.returncode != 0 and "criu was killed by signal 9" in res.stderr, res.stderr
    assert res.stderr.count("\n") == 1
    seen = last_tick(out)
    wait_for(lambda: last_tick(out) >= seen + 10, what="the program to go on")
    status = comp.status()
    assert status["running"] and status["generation"] == 1
    assert {p.name: p.stat().st_mtime_ns for p in comp.images()[0].iterdir()} == good
    assert not list(comp.ckptdir.glob(".*partial*"))
    armed.unlink()
    assert "checkpoint 2 done" in comp.checkpoint()  # the number of the failed one, now good
    assert comp.kill_and_wait(proc) != 0


@pytest.fixture
def small_disk(tmp_path):
    """A 160 MiB tmpfs: room for two generations of a 50 MiB program, not three."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=160m,mode=0700", "dmtcp-test-full", str(mnt)],
                   check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_full_disk_fails_the_checkpoint_and_keeps_the_last_good_one(comp, tmp_path,
                                                                      small_disk):
    program = tmp_path / "fifty.py"
    # every page changes at every tick: generations share no chunk (images.chunks)
    program.write_text(BIG_PROGRAM.replace("256 << 20", "50 << 20").replace(
        '    print("tick"',
        '    memory[::4096] = bytes([tick % 251 + 1]) * len(memory[::4096])\n    print("tick"'))
    proc, out = comp.launch("--ckptdir", str(small_disk), "python3", str(program))
    comp.wait_peers(1)
    wait_for(lambda: last_tick(out) >= 3, what="the program")
    comp.checkpoint()
    comp.checkpoint()  # generations 1 and 2 fill most of the disk
    image = next(small_disk.glob("ckpt_*.dmtcp"))
    good = {p.name: p.stat().st_size for p in image.iterdir()}
    res = comp.command("-bc", check=False)
    assert res.returncode != 0 and "No space left on device" in res.stderr, res.stderr
    assert res.stderr.count("\n") == 1
    seen = last_tick(out)
    wait_for(lambda: last_tick(out) >= seen + 10, what="the program to go on")
    assert {p.name: p.stat().st_size for p in image.iterdir()} == good
    assert not list(small_disk.glob(".*partial*")), "the failed generation's files stayed"
    assert comp.kill_and_wait(proc) != 0
    restarted, rout = comp.restart()  # from generation 2, the last good one
    wait_for(lambda: last_tick(rout) > 0 or restarted.poll() is not None, what="the restart")
    assert restarted.poll() is None, restarted.err_path.read_text()
    assert seen - 100 < last_tick(rout) <= seen + 1
    comp.command("-k")
    restarted.wait(timeout=TIMEOUT)


def test_agents_rejoin_a_coordinator_started_again_on_the_same_port(comp, programs):
    proc, out = comp.launch(*programs["pipe_counter"], "100000", "10")
    comp.wait_peers(2)
    comp.checkpoint()  # generation 1
    comp.coordinator.send_signal(signal.SIGKILL)  # while nothing is being checkpointed
    comp.coordinator.wait()
    seen = last_tick(out)
    wait_for(lambda: last_tick(out) >= seen + 10, what="the program to go on alone")
    # a coordinator started again on the port takes the computation back
    again = subprocess.Popen([tool("dmtcp-coordinator"), "-p", str(comp.port), "--ckptdir",
                              str(comp.ckptdir), "-q"], stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    comp.coordinator = again  # the harness stops it at the end
    wait_for(lambda: comp.command("-s", check=False).returncode == 0 or again.poll() is not None,
             what="the new coordinator")
    assert again.poll() is None, again.stderr.read()
    comp.wait_peers(2)
    status = comp.status()
    assert status["generation"] == 1 and status["num_trees"] == 1, status
    assert "checkpoint 2 done" in comp.checkpoint()
    assert comp.kill_and_wait(proc) != 0


def test_an_agent_killed_mid_checkpoint_no_process_stays_stopped(comp, programs):
    hold = {**os.environ, **hold_env(State.DRAINED, 3)}
    victim, vout = comp.launch(*programs["counter_single"], "100000", "10", env=hold)
    other, oout = comp.launch(*programs["counter_single"], "100000", "10", env=hold)
    comp.wait_peers(2)
    comp.checkpoint()  # generation 1
    first = comp.images()
    with open(comp.root / "bc.err", "w") as err:
        bc = subprocess.Popen([tool("dmtcp-command"), "-p", str(comp.port), "-bc"],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
    wait_for(lambda: comp.status()["state"] == "DRAINED", what="the agents draining")
    victim.send_signal(signal.SIGKILL)  # the agent (dmtcp-launch) of the first tree
    victim.wait()
    assert bc.wait(timeout=TIMEOUT) != 0
    assert "exited during the checkpoint" in (comp.root / "bc.err").read_text()
    # the other tree is released by the coordinator at once
    seen = last_tick(oout)
    wait_for(lambda: last_tick(oout) >= seen + 10, what="the other tree to go on")
    # the orphaned tree frees itself when its agent never comes back (30 s)
    seen = last_tick(vout)
    wait_for(lambda: last_tick(vout) >= seen + 10, timeout=TIMEOUT,
             what="the orphaned tree to go on")
    assert comp.status()["num_trees"] == 1 and comp.images() == first


def test_a_tree_killed_mid_dump_takes_its_own_dumps_criu_and_no_others(tmp_path):
    """Where the agents of several trees share one process (a restart of
    trees in PID namespaces of their own), killing one tree kills the CRIU
    of its dump under way: a `criu swrk`, whose command line does not name
    the tree, so the agent knows it by its log.  Another tree's stays."""
    from dmtcp_py.agent import criu_driver
    from dmtcp_py.agent.tree import _kill_criu

    ours = criu_driver.begin_dump(tmp_path / "criu-dump-aaaa1111.log")
    theirs = criu_driver.begin_dump(tmp_path / "criu-dump-bbbb2222.log")
    try:
        _kill_criu("aaaa1111")
        assert ours.proc.wait(timeout=TIMEOUT) == -signal.SIGKILL
        assert theirs.proc.poll() is None
        assert criu_driver.dump_pids("bbbb2222") == [theirs.proc.pid]
    finally:
        ours.close()
        theirs.close()
    assert criu_driver.dump_pids("aaaa1111") == criu_driver.dump_pids("bbbb2222") == []
