"""Programs holding shared resources survive two checkpoint/kill/restart
cycles: POSIX and System V IPC, shared file mappings, a file being appended
to, a /dev/shm file shared by two processes, a pseudo-terminal pair, and
threads around a mutex and condition variables.

Each resb_* program checks its own invariants (exit 3 when one breaks);
the test checks that it is checkpointed while running, killed, restarted
from the script, checkpointed and killed again, restarted again, and then
runs to its end with its ticks consecutive.  A killed program cannot clean
up, so its named objects carry a name unique to the test run and the test
removes whatever is left of them."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.e2e.harness import TIMEOUT, last_tick, ticks, wait_for
from tests.e2e.test_cycle import assert_continues, checkpoint_and_kill

TICKS, INTERVAL_MS = 300, 10

# program -> processes in its tree
PROCESSES = {
    "resb_posix_shm": 2,
    "resb_sysv": 2,
    "resb_file": 1,
    "resb_devshm": 2,
    "resb_pty": 2,
    "resb_queue": 1,
}


def _running(proc, out: Path, at_least: int) -> None:
    """Wait for tick `at_least`, failing at once if the run ends first."""
    def ready():
        if proc.poll() is not None:
            raise AssertionError(f"exited with {proc.returncode} before tick {at_least}: "
                                 f"{proc.err_path.read_text()}")
        return last_tick(out) >= at_least
    wait_for(ready, what=f"tick {at_least} in {out.name}")


_SYSV = {"shm": "-m", "sem": "-s", "msg": "-q"}  # /proc/sysvipc/<kind>, ipcrm option


def _sysv_ids(out: Path) -> list[tuple[str, str]]:
    """(kind, id) of the objects a resb_sysv run announced ("ipc shm ID sem ID msg ID")."""
    for line in out.read_text().splitlines():
        words = line.split()
        if words[:1] == ["ipc"]:
            return list(zip(words[1::2], words[2::2]))
    return []


def _sysv_alive(kind: str, ident: str) -> bool:
    rows = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()[1:]
    return any(row.split()[1] == ident for row in rows)


def _leftovers(tag: str, data: Path, sysv: list[tuple[str, str]]) -> list[str]:
    """What a run left behind: /dev/shm entries, files in data, SysV objects."""
    found = [str(p) for p in Path("/dev/shm").glob(f"*{tag}*")]
    found += [str(p) for p in data.iterdir()]
    found += [f"{kind} {ident}" for kind, ident in sysv if _sysv_alive(kind, ident)]
    return found


def _remove(found: list[str]) -> None:
    for item in found:
        kind, _, ident = item.partition(" ")
        if kind in _SYSV:
            subprocess.run(["ipcrm", _SYSV[kind], ident], check=False, capture_output=True)
        elif os.path.isdir(item):
            shutil.rmtree(item, ignore_errors=True)
        else:
            Path(item).unlink(missing_ok=True)


# Known gaps, each a strict xfail so that a fix shows up as XPASS:
KNOWN_GAPS: dict[str, str] = {}


def _cases():
    for program in sorted(PROCESSES):
        gap = KNOWN_GAPS.get(program)
        marks = [pytest.mark.xfail(reason=gap, strict=True)] if gap else []
        yield pytest.param(program, marks=marks, id=program)


@pytest.mark.parametrize("program", list(_cases()))
def test_two_cycles_then_runs_to_the_end(comp, programs, program, tmp_path):
    tag = f"resb-{os.getpid()}-{program}"  # named objects: /dev/shm/*<tag>*
    data = tmp_path / "data"               # resb_file's temporary directory goes here
    data.mkdir()
    name = str(data) if program == "resb_file" else tag
    peers = PROCESSES[program]
    first_out = None
    try:
        proc, out = comp.launch(*programs[program], str(TICKS), str(INTERVAL_MS), name)
        first_out = out
        comp.wait_peers(peers)
        _running(proc, out, 10)
        for cycle in (1, 2):
            before, killed = checkpoint_and_kill(comp, proc, out, after=last_tick(out))
            assert comp.status()["generation"] == cycle
            proc, out = comp.restart()
            _running(proc, out, before + 3)
            comp.wait_peers(peers)
            assert_continues(out, before, killed, program, finished=False)
        assert proc.wait(timeout=TIMEOUT) == 0, proc.err_path.read_text()
        assert_continues(out, before, killed, program)
        assert ticks(out)[-1] == ["done", str(TICKS)]
        assert _leftovers(tag, data, _sysv_ids(first_out)) == [], "not cleaned up at exit"
    finally:
        if first_out is not None:
            _remove(_leftovers(tag, data, _sysv_ids(first_out)))
