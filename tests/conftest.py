"""Shared fixtures.  The pytest process becomes a child subreaper, so every
process a test starts (coordinators daemonize, restored trees are orphaned
by CRIU) stays our descendant and is killed by pid when the test ends."""
from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import subprocess
import sys
import tempfile

import psutil
import pytest

_PR_SET_CHILD_SUBREAPER = 36


_RUN_BASE = "_DMTCP_TESTS_TMPDIR"


def pytest_configure(config):
    ctypes.CDLL(None).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    # Every command the tests start keeps its logs, tokens and sockets under
    # $DMTCP_TMPDIR/dmtcp-<user>@<host>: a directory of this session's,
    # removed at its end, not the user's own /tmp/dmtcp-<user>@<host>.
    base = tempfile.mkdtemp(prefix="dmtcp-tests-", dir="/tmp")
    os.environ["DMTCP_TMPDIR"] = os.environ[_RUN_BASE] = base


def pytest_unconfigure(config):
    base = os.environ.pop(_RUN_BASE, None)
    if base and os.environ.get("DMTCP_TESTS_KEEP_LOGS"):
        print(f"\nlogs kept in {base}")  # (to read an intermittent failure's)
    elif base:
        shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def ready_python(code: str, *args: str):
    """A Python child running code, once it printed "ready"; its pid.
    Killed and reaped at the end."""
    proc = subprocess.Popen([sys.executable, "-c", code, *args], text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == "ready\n"
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()
        proc.stdin.close()
        proc.stdout.close()


def kill_descendants() -> None:
    """Kill and reap every process below this pytest process."""
    me = psutil.Process()
    procs = me.children(recursive=True)
    for proc in procs:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=5)
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break


def reap_zombies() -> bool:
    """Reap every child that has ended (pytest is a subreaper: orphaned
    trees come to it); True once none is left unreaped."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return True
        if pid == 0:
            break
    return not any(c.status() == psutil.STATUS_ZOMBIE for c in psutil.Process().children())


@pytest.fixture
def no_strays():
    yield
    kill_descendants()


def need_root():
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("the end-to-end tests need root (CRIU)")
        pytest.skip("needs root (CRIU)")


BIN = os.path.dirname(sys.executable)
