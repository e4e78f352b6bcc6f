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


@pytest.mark.parametrize("module", ["dmtcp_py.cli.restart", "dmtcp_py.cli.coordinator"])
def test_restart_and_coordinator_entry_points_load_little(module):
    code = f"import sys, {module}; print(' '.join(sorted(sys.modules)))"
    loaded = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                check=True).stdout.split())
    assert not loaded & set(BEFORE_CRIU), sorted(loaded & set(BEFORE_CRIU))
