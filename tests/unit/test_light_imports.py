"""What dmtcp-launch runs before it starts the program, and what
`dmtcp-command -s` or `-bc` runs, loads none of the heavy modules (issue 17: the
program starts at once; each of these costs milliseconds of import)."""
from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("asyncio", "click", "dataclasses", "typing", "json", "socket", "pathlib", "re",
         "logging", "threading", "psutil", "enum", "signal", "shutil", "tempfile", "getpass",
         "dmtcp_py.protocol.messages", "dmtcp_py.client")


@pytest.mark.parametrize("module", ["dmtcp_py.cli.launch", "dmtcp_py.cli.command",
                                    "dmtcp_py.cli.actions"])
def test_entry_points_load_nothing_heavy(module):
    code = f"import sys, {module}; print(' '.join(sorted(sys.modules)))"
    loaded = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                check=True).stdout.split())
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))


# What a restart runs before CRIU starts (the agent's modules load while
# CRIU restores), and what the coordinator's entry point loads before it
# knows whether click must read its line.
BEFORE_CRIU = ("asyncio", "click", "psutil", "_hashlib", "ssl", "socket", "blake3",
               "dmtcp_py.protocol.messages", "dmtcp_py.agent.runner")
# ... and what the restart's own modules load before CRIU starts
# (cli/restarting.py; tests/e2e/test_restart_start.py runs it)
RESTART_BEFORE_CRIU = (*BEFORE_CRIU, "logging", "concurrent.futures", "typing", "dataclasses",
                       "inspect", "shutil", "pycriu")


@pytest.mark.parametrize("module, heavy", [
    ("dmtcp_py.cli.restart", BEFORE_CRIU), ("dmtcp_py.cli.coordinator", BEFORE_CRIU),
    ("dmtcp_py.cli.restarting", RESTART_BEFORE_CRIU)])
def test_restart_and_coordinator_entry_points_load_little(module, heavy):
    code = f"import sys, {module}; print(' '.join(sorted(sys.modules)))"
    loaded = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                check=True).stdout.split())
    assert module in loaded
    assert not loaded & set(heavy), sorted(loaded & set(heavy))


# What a restart and the coordinator it starts load before the program runs
# again: neither OpenSSL (asyncio's TLS, hmac's and hashlib's hashes) nor what
# only a checkpoint needs (the agent loads that once it runs).
NOT_BEFORE_RUNNING = ("ssl", "_ssl", "_hashlib", "psutil", "pycriu", "statistics", "platform",
                      "dmtcp_py.images.checkpoint", "shutil")


@pytest.mark.parametrize("modules", [
    "dmtcp_py.cli.restart, dmtcp_py.cli.restarting, dmtcp_py.agent.runner",
    "dmtcp_py.cli.coordinator, dmtcp_py.cli.coordinating"])
def test_restart_and_its_coordinator_load_no_openssl(modules):
    code = ("import sys\nfrom dmtcp_py.cli.no_tls import keep_ssl_out\nkeep_ssl_out()\n"
            f"import {modules}\nimport asyncio\n"
            "print(' '.join(m for m, v in sys.modules.items() if v is not None))")
    loaded = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                check=True).stdout.split())
    assert "asyncio.base_events" in loaded  # (it did load what the processes run)
    assert not loaded & set(NOT_BEFORE_RUNNING), sorted(loaded & set(NOT_BEFORE_RUNNING))
