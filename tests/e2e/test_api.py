"""Programs that talk to the checkpointer: a C program through dmtcp.h and a
Python program through `import dmtcp`.  Each checkpoints itself, checks
what it is told (generation, counts, its hooks) and goes on; killed and
restarted from that checkpoint, the copy learns it was restarted."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.e2e.harness import TIMEOUT, wait_for


API_DIR = Path(__file__).parent.parent.parent / "hijack" / "python"  # dmtcp.py


def _returned(path) -> list[str]:
    return re.findall(r"^returned .*$", path.read_text(), re.M) if path.exists() else []


@pytest.mark.parametrize("program", ["api_user", "api_user_py"])
def test_a_program_checkpoints_itself_and_learns_it_was_restarted(comp, programs, program):
    proc, out = comp.launch(*programs[program], "400", "10")
    wait_for(lambda: _returned(out), what="the program's own checkpoint to return")
    assert _returned(out) == ["returned 1 gen 1 ckpts 1 restarts 0 hooks 1 1 0"], out.read_text()
    assert len(comp.images()) == 1
    assert comp.status()["generation"] == 1
    assert comp.kill_and_wait(proc) != 0
    assert "FAIL" not in proc.err_path.read_text(), proc.err_path.read_text()

    restarted, rout = comp.restart()
    assert restarted.wait(timeout=TIMEOUT) == 0, restarted.err_path.read_text()
    text = rout.read_text()
    # the copy comes back inside dmtcp_checkpoint(), which says: restarted
    assert _returned(rout) == ["returned 2 gen 1 ckpts 0 restarts 1 hooks 1 0 1"], text
    assert text.splitlines()[-1] == "done"


@pytest.mark.parametrize("program", ["api_user", "api_user_py"])
def test_outside_dmtcp_the_api_says_not_present(programs, program):
    """Built with dmtcp.h (weak symbols) or importing the module, a program
    runs without dmtcp too, and is told dmtcp is not there."""
    env = {**os.environ, "PYTHONPATH": str(API_DIR)}
    env.pop("LD_PRELOAD", None)
    res = subprocess.run([*programs[program], "1", "1"], capture_output=True, text=True,
                         env=env, timeout=60)
    assert res.returncode == 3 and res.stderr.startswith("FAIL dmtcp"), res.stderr
