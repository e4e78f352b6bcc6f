"""Checkpoint while running, kill, restart: the program continues exactly
where it was.  Real CRIU, real processes; the programs check themselves."""
from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import psutil
import pytest

from tests.e2e.harness import (TIMEOUT, last_tick, ticks, tree_report, wait_for,
                               wait_until_running)
from tests.e2e.test_bad_input import free_port

TICKS, INTERVAL_MS = 400, 10  # 4 s: room for a slow checkpoint on a busy machine


def _single_hash(n: int) -> str:
    h = 1
    for i in range(1, n + 1):
        h = (h * 6364136223846793005 + i) % (1 << 64)
    return f"{h:x}"


def _py_hash(n: int) -> str:
    chain = b""
    for i in range(1, n + 1):
        chain = hashlib.sha256(chain + str(i).encode()).digest()
    return chain.hex()[:16]


# what the third column of "tick N X" must be, per program
STATE_CHECK = {"counter_single": _single_hash, "counter_py": _py_hash}


def checkpoint_and_kill(comp, proc, out, *, after: int = 10) -> tuple[int, int]:
    """Checkpoint a running program, see it keep running, then kill it.
    Returns (last tick before the checkpoint, last tick before the kill)."""
    wait_for(lambda: last_tick(out) >= after, what=f"tick {after}")
    before = last_tick(out)
    comp.checkpoint()
    resumed = last_tick(out)
    wait_for(lambda: last_tick(out) >= resumed + 3,
             what=f"ticks after the checkpoint (tick {resumed})", explain=lambda: tree_report(proc))
    assert comp.kill_and_wait(proc) != 0
    return before, last_tick(out)


def assert_continues(out, before: int, killed: int, program: str, *, finished: bool = True):
    rows = ticks(out)
    assert rows, f"no output from the restarted program in {out}"
    first = int(rows[0][1])
    # the checkpointed counter is between the two; restarting from zero fails
    assert before < first <= killed + 1, (before, first, killed)
    numbers = [int(r[1]) for r in rows if r[0] == "tick"]
    assert numbers == list(range(first, first + len(numbers))), "ticks lost or repeated"
    check = STATE_CHECK.get(program)
    if check:
        for row in rows[:3] + rows[-3:]:
            assert row[2] == check(int(row[1])), f"state differs at {row}"
    if finished:
        assert rows[-1][0] == "done"


@pytest.mark.parametrize("program", ["counter_single", "counter_threads", "counter_py"])
def test_checkpoint_kill_restart_continues(comp, programs, program):
    proc, out = comp.launch(*programs[program], str(TICKS), str(INTERVAL_MS))
    comp.wait_peers(1)
    before, killed = checkpoint_and_kill(comp, proc, out)
    assert len(comp.images()) == 1
    restarted, rout = comp.restart()
    assert restarted.wait(timeout=TIMEOUT) == 0, restarted.err_path.read_text()
    assert_continues(rout, before, killed, program)


def test_three_cycles_of_a_multiprocess_program(comp, programs):
    proc, out = comp.launch(*programs["pipe_counter"], "400", str(INTERVAL_MS))
    comp.wait_peers(2)
    for cycle in range(3):
        before, killed = checkpoint_and_kill(comp, proc, out, after=last_tick(out) + 5)
        proc, out = comp.restart()
        comp.wait_peers(2)  # parent and child are counted again
        wait_for(lambda out=out: ticks(out), what=f"output after restart {cycle + 1}")
        assert_continues(out, before, killed, "pipe_counter", finished=False)
        assert comp.status()["generation"] == cycle + 1
    assert proc.wait(timeout=TIMEOUT) == 0, proc.err_path.read_text()
    assert ticks(out)[-1] == ["done", "400"]


def test_restart_same_images_twice(comp, programs):
    proc, out = comp.launch(*programs["counter_single"], str(TICKS), str(INTERVAL_MS))
    comp.wait_peers(1)
    before, killed = checkpoint_and_kill(comp, proc, out)
    runs = []
    for _ in range(2):
        restarted, rout = comp.restart()
        assert restarted.wait(timeout=TIMEOUT) == 0, restarted.err_path.read_text()
        assert_continues(rout, before, killed, "counter_single")
        runs.append(ticks(rout))
    assert runs[0] == runs[1]  # same images, same continuation


def test_output_through_pipes(comp, programs):
    """The restored program writes into the restarting command's pipe."""
    cmd = [*programs["counter_single"], str(TICKS), str(INTERVAL_MS)]
    proc = subprocess.Popen([comp_tool("dmtcp-launch"), "--join", "-p", str(comp.port),
                             "--ckptdir", str(comp.ckptdir), *cmd],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    comp.wait_peers(1)
    comp.checkpoint()
    assert comp.kill_and_wait(proc) != 0
    launched = proc.stdout.read().splitlines()
    proc.stdout.close()
    restarted = subprocess.run([str(comp.ckptdir / "dmtcp_restart_script.sh"), "-p", str(comp.port)],
                               stdin=subprocess.DEVNULL, capture_output=True, text=True,
                               timeout=TIMEOUT)
    assert restarted.returncode == 0, restarted.stderr
    lines = restarted.stdout.splitlines()
    assert lines[-1].startswith(f"done {TICKS}")
    first = int(lines[0].split()[1])
    assert 1 < first <= int(launched[-1].split()[1]) + 1


@pytest.mark.parametrize("into", ["pipe", "devnull"])
def test_output_to_a_file_restarts_into_a_pipe_or_dev_null(comp, programs, tmp_path, into):
    """Checkpointed writing to a file (mode 0640), restarted with its output
    into a pipe, or thrown away: the agent relays what CRIU cannot take."""
    cmd = [*programs["counter_single"], str(TICKS), str(INTERVAL_MS)]
    log = tmp_path / "first.log"
    with open(log, "w") as f:
        os.fchmod(f.fileno(), 0o640)
        proc = subprocess.Popen([comp_tool("dmtcp-launch"), "--join", "-p", str(comp.port),
                                 "--ckptdir", str(comp.ckptdir), *cmd],
                                stdin=subprocess.DEVNULL, stdout=f)
    comp.wait_peers(1)
    before, killed = checkpoint_and_kill(comp, proc, log)
    out = subprocess.PIPE if into == "pipe" else subprocess.DEVNULL
    restarted = subprocess.run([str(comp.ckptdir / "dmtcp_restart_script.sh"), "-p", str(comp.port)],
                               stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.PIPE,
                               text=True, timeout=TIMEOUT)
    assert restarted.returncode == 0, restarted.stderr
    if into == "pipe":
        lines = restarted.stdout.splitlines()
        assert lines[-1].startswith(f"done {TICKS}")
        assert before < int(lines[0].split()[1]) <= killed + 1


def comp_tool(name: str) -> str:
    from tests.e2e.harness import tool
    return tool(name)


def _under_terminal(argv: list[str]) -> list[str]:
    """Run argv with a pseudo-terminal as its stdin/stdout/stderr."""
    import shlex
    return ["script", "-qfec", shlex.join(argv), "/dev/null"]


def test_terminal_program_restarts_on_a_new_terminal(comp, programs, tmp_path):
    from tests.e2e.harness import tool
    out = tmp_path / "tty1.out"
    with open(out, "w") as o:
        proc = subprocess.Popen(_under_terminal(
            [tool("dmtcp-launch"), "--join", "-p", str(comp.port), *programs["counter_single"],
             str(TICKS), str(INTERVAL_MS)]), stdin=subprocess.DEVNULL, stdout=o, stderr=subprocess.STDOUT)
    comp.wait_peers(1)
    before, killed = checkpoint_and_kill(comp, proc, out)
    script = str(comp.ckptdir / "dmtcp_restart_script.sh")
    # without a terminal: refused up front, in one line
    refused = subprocess.run([script, "-p", str(comp.port)], stdin=subprocess.DEVNULL,
                             capture_output=True, text=True, timeout=TIMEOUT)
    assert refused.returncode != 0 and "restart it from a terminal" in refused.stderr
    rout = tmp_path / "tty2.out"
    with open(rout, "w") as o:
        restarted = subprocess.run(_under_terminal([script, "-p", str(comp.port)]),
                                   stdin=subprocess.DEVNULL, stdout=o, stderr=subprocess.STDOUT,
                                   timeout=TIMEOUT)
    assert restarted.returncode == 0, rout.read_text()
    rout.write_text(rout.read_text().replace("\r\n", "\n"))
    assert_continues(rout, before, killed, "counter_single")


def test_two_trees_checkpoint_and_restart_together(comp, programs):
    single, sout = comp.launch(*programs["counter_single"], str(TICKS), str(INTERVAL_MS))
    pair, pout = comp.launch(*programs["pipe_counter"], str(TICKS), str(INTERVAL_MS))
    comp.wait_peers(3)
    wait_for(lambda: last_tick(sout) >= 10 and last_tick(pout) >= 10, what="both programs")
    before = {sout: last_tick(sout), pout: last_tick(pout)}
    assert "2 trees" in comp.checkpoint()
    assert len(comp.images()) == 2
    comp.command("-k")
    assert single.wait(timeout=TIMEOUT) != 0 and pair.wait(timeout=TIMEOUT) != 0
    killed = {sout: last_tick(sout), pout: last_tick(pout)}
    restarted, rout = comp.restart()  # one script, both trees
    comp.wait_peers(3)
    assert comp.status()["num_trees"] == 2
    assert restarted.wait(timeout=TIMEOUT) == 0, restarted.err_path.read_text()
    # both programs write into the restart's output; split them by line shape
    text = rout.read_text().splitlines()
    for source, is_pair in ((sout, False), (pout, True)):
        mine = [ln for ln in text if ("child" in ln) == is_pair and ln.startswith("tick")]
        first = int(mine[0].split()[1])
        assert before[source] < first <= killed[source] + 1
        numbers = [int(ln.split()[1]) for ln in mine]
        assert numbers == list(range(first, TICKS + 1))


def test_a_coordinator_the_restart_starts_keeps_none_of_its_files(comp, programs):
    """dmtcp-restart forks the coordinator it starts once CRIU has begun:
    the coordinator, which lives as long as the computation, must not hold
    the restart's pipes, CRIU's files or the images (a pipeline's reader
    would wait for it, a pruned generation's space would stay taken)."""
    cmd = [*programs["counter_single"], str(TICKS), str(INTERVAL_MS)]
    # into a pipe: the restart hands its own pipe over to CRIU (a copy of it)
    proc = subprocess.Popen([comp_tool("dmtcp-launch"), "--join", "-p", str(comp.port),
                             "--ckptdir", str(comp.ckptdir), *cmd],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    comp.wait_peers(1)
    comp.checkpoint()
    assert comp.kill_and_wait(proc) != 0
    proc.stdout.close()
    image, port = comp.images()[0], free_port()
    restarted = subprocess.Popen([comp_tool("dmtcp-restart"), "--new-coordinator", "-p",
                                  str(port), str(image)],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL)
    try:
        def coordinator() -> int | None:
            return next((c.pid for c in psutil.net_connections("tcp4")
                         if c.laddr.port == port and c.status == psutil.CONN_LISTEN), None)

        wait_until_running(restarted, port)
        assert restarted.poll() is None
        pid = coordinator()
        held = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")
                if int(fd) > 2}
        # its sockets, its epoll and its log: nothing else
        assert not [h for h in held if not h.startswith(("socket:", "anon_inode:"))
                    and not h.endswith(f"coordinator-{port}.log")], held
        assert str(comp.ckptdir) not in Path(f"/proc/{pid}/maps").read_text()
    finally:
        subprocess.run([comp_tool("dmtcp-command"), "-p", str(port), "-q"], capture_output=True,
                       timeout=TIMEOUT)
        restarted.wait(timeout=TIMEOUT)
        restarted.stdout.close()
