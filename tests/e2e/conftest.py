from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from dmtcp_py.coordinator import restarter
from tests.conftest import kill_descendants, need_root
from tests.e2e.harness import Computation

PROGRAMS = Path(__file__).parent / "programs"
INCLUDE = Path(__file__).parent.parent.parent / "hijack" / "include"  # dmtcp.h
EXAMPLES = Path(__file__).parent.parent.parent / "examples"


@pytest.fixture(scope="session")
def programs(tmp_path_factory) -> dict[str, list[str]]:
    """Test programs, built once: name -> argv prefix."""
    out = tmp_path_factory.mktemp("bin")
    built = {}
    for src in [*PROGRAMS.glob("*.c"), *EXAMPLES.glob("*.c")]:
        if src.stem.startswith("mpi_"):
            continue  # built with the MPI compiler wrappers (test_mpi.py)
        exe = out / src.stem
        subprocess.run(["cc", "-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-pthread",
                        "-I", str(INCLUDE), "-o", str(exe), str(src)], check=True)
        built[src.stem] = [str(exe)]
    built["counter_py"] = ["python3", str(PROGRAMS / "counter.py")]
    built["net_outside"] = ["python3", str(PROGRAMS / "net_outside.py")]
    built["listen_self"] = ["python3", str(PROGRAMS / "listen_self.py")]
    built["net_udp"] = ["python3", str(PROGRAMS / "net_udp.py")]
    built["api_user_py"] = ["python3", str(PROGRAMS / "api_user.py")]
    built["inotify_gap_py"] = ["python3", str(PROGRAMS / "inotify_gap.py")]
    return built


@pytest.fixture
def comp(tmp_path):
    need_root()
    c = Computation(tmp_path)
    try:
        yield c
    finally:
        c.close()
        kill_descendants()


@pytest.fixture
def coordinator(tmp_path):
    """A factory of one Computation per test, with the options given; all
    gone at the end."""
    need_root()
    made: list[Computation] = []

    def make(*options: str, **kwargs) -> Computation:
        made.append(Computation(tmp_path, *options, **kwargs))
        return made[-1]

    try:
        yield make
    finally:
        for c in made:
            c.close()
        kill_descendants()


@pytest.fixture
def auto(tmp_path):
    """A coordinator with --auto-restart and quick heartbeats; its recovery
    output file goes with it.  Tests set the interval (-i 1) once their
    programs run as they should: a checkpoint while a connection waits in
    its listener's backlog, not yet accepted, restores it closed (README,
    known limits)."""
    need_root()
    comp = Computation(tmp_path, "--auto-restart", "--heartbeat", "0.5",
                       "--heartbeat-timeout", "3")
    try:
        yield comp
    finally:
        comp.close()
        kill_descendants()
        restarter.output_path(comp.port).unlink(missing_ok=True)
