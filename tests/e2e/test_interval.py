"""Interval checkpoints through every interface DMTCP users know: the
coordinator's -i and DMTCP_CHECKPOINT_INTERVAL, dmtcp-command -i, the
console's `i N`, dmtcp-launch -i; and a restart from the newest generation."""
from __future__ import annotations

import json
import subprocess
import time

import pytest

from tests.conftest import need_root
from tests.e2e.harness import TIMEOUT, Computation, last_tick, ticks, tool, wait_for
from tests.e2e.test_bad_input import free_port, listening

PROGRAM = ("100000", "20")  # counter_single's TICKS, INTERVAL_MS: runs until killed


def status_at(port: int) -> dict:
    res = subprocess.run([tool("dmtcp-command"), "-p", str(port), "-s", "--json"],
                         capture_output=True, text=True, timeout=TIMEOUT, check=True)
    return json.loads(res.stdout)


def wait_generation(status, n: int) -> None:
    """Wait, without asking for checkpoints, until generation n is done."""
    wait_for(lambda: status()["generation"] >= n, what=f"interval checkpoint generation {n}")


def settled(status) -> int:
    """The generation once a checkpoint in progress has ended."""
    wait_for(lambda: status()["running"], what="the checkpoint in progress to end")
    return status()["generation"]


def assert_stays_put(status) -> None:
    """With the interval off, the generation no longer moves."""
    generation = settled(status)
    time.sleep(2)
    assert status()["generation"] == generation >= 2


def image_generation(image) -> int | None:
    try:
        return int(json.loads((image / "manifest.json").read_text())["generation"])
    except (OSError, ValueError, KeyError):
        return None  # being swapped: look again


def newest_and_previous_kept(comp: Computation) -> int:
    """The image holds the newest generation N >= 2, and N-1 is kept beside
    it; retried, as an interval checkpoint may be publishing."""
    def check():
        [image] = comp.images()
        gen = image_generation(image)
        kept = [k.name for k in comp.ckptdir.glob(image.name + ".gen-*")]
        return gen if gen and gen >= 2 and kept == [f"{image.name}.gen-{gen - 1}"] else None
    return wait_for(check, what="the newest generation and the previous one kept")


@pytest.mark.parametrize("how", ["option", "env"])
def test_coordinator_interval_makes_generations(coordinator, programs, how):
    if how == "option":
        comp = coordinator("-i", "1")
    else:
        comp = coordinator(env={"DMTCP_CHECKPOINT_INTERVAL": "1"})
    proc, _ = comp.launch(*programs["counter_single"], *PROGRAM)
    assert comp.status()["checkpoint_interval"] == 1
    wait_generation(comp.status, 2)
    newest_and_previous_kept(comp)
    comp.kill_and_wait(proc)


def test_command_interval_turns_checkpoints_on_and_off(comp, programs):
    proc, _ = comp.launch(*programs["counter_single"], *PROGRAM)
    comp.wait_peers(1)
    assert "CKPT_INTERVAL=0" in comp.command("-s").stdout.splitlines()
    assert comp.command("-i", "1").stdout.strip() == "checkpoint interval: 1 s"
    assert "CKPT_INTERVAL=1" in comp.command("-s").stdout.splitlines()
    wait_generation(comp.status, 2)
    comp.command("-i", "0")
    assert "CKPT_INTERVAL=0" in comp.command("-s").stdout.splitlines()
    assert_stays_put(comp.status)
    comp.kill_and_wait(proc)


def test_console_interval(coordinator, programs):
    comp = coordinator(stdin=subprocess.PIPE)

    def console(line: str) -> None:
        comp.coordinator.stdin.write(line + "\n")
        comp.coordinator.stdin.flush()

    proc, _ = comp.launch(*programs["counter_single"], *PROGRAM)
    comp.wait_peers(1)
    console("i 1")
    wait_generation(comp.status, 2)
    assert comp.status()["checkpoint_interval"] == 1
    console("i 0")
    wait_for(lambda: comp.status()["checkpoint_interval"] == 0, what="the console's i 0")
    console("q")
    assert comp.coordinator.wait(timeout=TIMEOUT) == 0
    assert proc.wait(timeout=TIMEOUT) != 0  # killed by q


@pytest.mark.parametrize("interval", ["1", "auto"])
def test_launch_interval_for_the_coordinator_it_starts(tmp_path, programs, no_strays, interval):
    need_root()
    port = free_port()
    with open(tmp_path / "out", "w") as o:
        proc = subprocess.Popen([tool("dmtcp-launch"), "-i", interval, "-p", str(port),
                                 "--ckptdir", str(tmp_path), *programs["counter_single"], *PROGRAM],
                                stdin=subprocess.DEVNULL, stdout=o)
    try:
        wait_for(lambda: listening(port), what="the coordinator launch starts")
        st = status_at(port)
        assert st["interval_auto"] is (interval == "auto")
        if interval != "auto":  # (auto's first interval is 10 s: not waited for here)
            assert st["checkpoint_interval"] == 1
            wait_generation(lambda: status_at(port), 2)
        # a kill kills the trees that joined: the coordinator may listen
        # before the launch's agent is in
        wait_for(lambda: status_at(port)["num_peers"] >= 1, what="the program to join")
        subprocess.run([tool("dmtcp-command"), "-p", str(port), "-k"], check=True,
                       capture_output=True, timeout=TIMEOUT)
        proc.wait(timeout=TIMEOUT)
        wait_for(lambda: not listening(port), what="the coordinator to exit with the program")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_restart_continues_from_the_newest_generation(comp, programs):
    proc, out = comp.launch(*programs["counter_single"], *PROGRAM)
    wait_for(lambda: last_tick(out) >= 5, what="the program")
    before = last_tick(out)  # every interval checkpoint comes after this tick
    comp.command("-i", "1")
    wait_generation(comp.status, 2)
    comp.command("-i", "0")
    generation = settled(comp.status)  # the last one: the interval is off
    assert newest_and_previous_kept(comp) == generation
    assert comp.kill_and_wait(proc) != 0
    killed = last_tick(out)
    restarted, rout = comp.restart()
    wait_for(lambda: ticks(rout) or restarted.poll() is not None, what="output after the restart")
    assert ticks(rout), restarted.err_path.read_text()
    first = int(ticks(rout)[0][1])
    assert before < first <= killed + 1, (before, first, killed)
    comp.kill_and_wait(restarted)
