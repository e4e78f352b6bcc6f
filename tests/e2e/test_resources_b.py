"""Programs holding shared resources survive two checkpoint/kill/restart
cycles: POSIX and System V IPC, shared file mappings, a file being appended
to, a /dev/shm file shared by two processes, a pseudo-terminal pair, and
threads around a mutex and condition variables.

Each resb_* program checks its own invariants (exit 3 when one breaks);
the test checks that it is checkpointed while running, killed, restarted
from the script, checkpointed and killed again, restarted again, and then
runs to its end with its ticks consecutive.  A killed program cannot clean
up, so its named objects carry a name unique to the test run and the test
removes whatever is left of them.  System V objects live in the tree's own
IPC namespace (dmtcp_tree_init unshares one; CRIU restores it): they are
looked up there, never in the host's, and go with the namespace when its
last process (and the test's hold on it) is gone."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import psutil
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


def _sysv_ids(out: Path) -> list[tuple[str, str]]:
    """(kind, id) of the objects a resb_sysv run announced ("ipc shm ID sem ID msg ID")."""
    for line in out.read_text().splitlines():
        words = line.split()
        if words[:1] == ["ipc"]:
            return list(zip(words[1::2], words[2::2]))
    return []


def _hold_ipc_namespace(proc) -> int:
    """An fd on the IPC namespace of the program under `proc` (a launch or
    a restart), taken while it runs: it keeps the namespace, and whatever
    is left in it, until closed, so that it can be looked at after the
    program ended.  Asserts that it is the tree's own, not the host's."""
    [pid, *_] = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)
                 if c.name() == "resb_sysv"]
    fd = os.open(f"/proc/{pid}/ns/ipc", os.O_RDONLY | os.O_CLOEXEC)
    if os.fstat(fd).st_ino == os.stat("/proc/self/ns/ipc").st_ino:
        os.close(fd)
        raise AssertionError("the tree has no IPC namespace of its own")
    return fd


def _sysv_alive(ns_fd: int, kind: str, ident: str) -> bool:
    """Whether object `ident` of `kind` is in the IPC namespace open on
    ns_fd.  /proc/sysvipc shows the namespace of its reader: read inside."""
    rows = subprocess.run(["nsenter", f"--ipc=/proc/self/fd/{ns_fd}", "cat",
                           f"/proc/sysvipc/{kind}"], pass_fds=(ns_fd,), check=True,
                          capture_output=True, text=True, timeout=TIMEOUT).stdout
    return any(row.split()[1] == ident for row in rows.splitlines()[1:])


def _in_namespace(ns_fd: int) -> list[int]:
    """Pids of the processes that live in the IPC namespace open on ns_fd."""
    ino, pids = os.fstat(ns_fd).st_ino, []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and (p / "ns/ipc").stat().st_ino == ino:
                pids.append(int(p.name))
        except OSError:
            continue  # gone, or a zombie
    return pids


def _leftovers(tag: str, data: Path, sysv: list[tuple[str, str]] = (),
               ns_fd: int | None = None) -> list[str]:
    """What a run left behind: /dev/shm entries, files in data, and the
    SysV objects `sysv` still in the IPC namespace open on ns_fd."""
    found = [str(p) for p in Path("/dev/shm").glob(f"*{tag}*")]
    found += [str(p) for p in data.iterdir()]
    if ns_fd is not None:
        found += [f"{kind} {ident}" for kind, ident in sysv if _sysv_alive(ns_fd, kind, ident)]
    return found


def _remove(found: list[str]) -> None:
    """Files only: SysV objects go with their IPC namespace."""
    for item in found:
        if os.path.isdir(item):
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
    first_out, ns_fd = None, None
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
        sysv = _sysv_ids(first_out)
        if sysv:  # the restored program's objects, where they live: it uses them
            ns_fd = _hold_ipc_namespace(proc)
            assert _leftovers(tag, data, sysv, ns_fd) == [f"{k} {i}" for k, i in sysv]
        assert proc.wait(timeout=TIMEOUT) == 0, proc.err_path.read_text()
        assert_continues(out, before, killed, program)
        assert ticks(out)[-1] == ["done", str(TICKS)]
        assert _leftovers(tag, data, sysv, ns_fd) == [], "not cleaned up at exit"
        if ns_fd is not None:  # our fd is the namespace's last hold: it goes when closed
            assert _in_namespace(ns_fd) == [], "processes left in the tree's IPC namespace"
    finally:
        if ns_fd is not None:
            os.close(ns_fd)
        _remove(_leftovers(tag, data))
