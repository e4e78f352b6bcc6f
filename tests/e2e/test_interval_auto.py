"""`--interval auto` through the real commands: the coordinator's option
and DMTCP_CHECKPOINT_INTERVAL=auto, dmtcp-command -i auto, dmtcp-launch -i
auto; a word that is neither a number nor auto is one line of error.  No
timing is asserted: only that the interval is chosen, shown, and followed."""
from __future__ import annotations

import subprocess

import pytest

from tests.e2e.harness import TIMEOUT, tool
from tests.e2e.test_bad_input import free_port, listening, one_line_error
from tests.e2e.test_interval import PROGRAM, wait_generation


@pytest.mark.parametrize("argv", [
    ["dmtcp-coordinator", "-i", "banana"],
    ["dmtcp-command", "-i", "banana"],
    ["dmtcp-launch", "-i", "banana", "true"],
    ["dmtcp-coordinator", "--interval", "-3"],
])
def test_bad_interval_is_one_line(argv, no_strays):
    port = free_port()
    one_line_error([tool(argv[0]), "-p", str(port), *argv[1:]], "interval")
    assert not listening(port)  # nothing was started


def test_bad_interval_from_the_environment(no_strays):
    port = free_port()
    res = subprocess.run([tool("dmtcp-coordinator"), "-p", str(port)],
                         env={"DMTCP_CHECKPOINT_INTERVAL": "soon", "PATH": "/usr/bin:/bin"},
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=TIMEOUT)
    assert res.returncode != 0 and "Traceback" not in res.stderr
    assert res.stderr.count("\n") == 1 and "'soon'" in res.stderr, res.stderr
    assert not listening(port)


def test_environment_auto(coordinator):
    comp = coordinator(env={"DMTCP_CHECKPOINT_INTERVAL": "auto"})
    st = comp.status()
    assert st["interval_auto"] is True and st["checkpoint_interval"] > 0
    assert any(line.startswith("CKPT_INTERVAL=") and line.endswith(" (auto)")
               for line in comp.command("-s").stdout.splitlines())


def test_coordinator_auto_chooses_and_follows(coordinator, programs):
    comp = coordinator("--interval", "auto")
    proc, _ = comp.launch(*programs["counter_single"], *PROGRAM)
    comp.wait_peers(1)
    # one checkpoint on request measures the cost; the interval chosen from
    # it (the program is young: short) then brings the next one by itself
    comp.checkpoint()
    wait_generation(comp.status, 2)
    st = comp.status()
    assert st["interval_auto"] is True and st["checkpoint_interval"] > 0
    assert st["last_checkpoint"]["ok"]
    # a number leaves auto mode; -i auto comes back to it
    assert comp.command("-i", "0").stdout.strip() == "checkpoint interval: 0 s"
    assert comp.status()["interval_auto"] is False
    out = comp.command("-i", "auto").stdout.strip()
    assert out.startswith("checkpoint interval: auto, "), out
    assert comp.status()["interval_auto"] is True
    comp.kill_and_wait(proc)
