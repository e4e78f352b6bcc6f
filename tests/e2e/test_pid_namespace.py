"""A computation started where its session leader is invisible: inside a
PID namespace whose creator did not call setsid (some CI runners and
containers start jobs that way).  getsid() is 0 there, and CRIU refuses to
dump a task whose session leader it cannot see."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.conftest import need_root

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_demo_in_a_pid_namespace_without_its_session(no_strays):
    need_root()
    if shutil.which("unshare") is None:
        pytest.fail("unshare (util-linux) is missing")
    # The namespace's init is the demo script: when it exits, the kernel
    # kills whatever it left in the namespace, so nothing can outlive the test.
    res = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc",
                          "bash", os.path.join(ROOT, "scripts", "demo.sh")],
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "OK: the restarted program went on from tick" in res.stdout
