"""Files a program maps MAP_SHARED but only reads (issue 20): a restart
never writes them, and refuses to start when one changed since the
checkpoint unless told --allow-changed-files.

Real CRIU, real processes.  The data files live outside the temporary
places (/tmp, /var/tmp, /dev/shm, /run, any tmpfs): there a read-only file
counts as the job's scratch and is kept in the image (see
images.shared_files), which is not what these tests are about."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import psutil
import pytest

from dmtcp_py.images import scratch
from dmtcp_py.paths import run_dir
from tests.e2e.harness import TIMEOUT, last_tick, ticks, tool, wait_for
from tests.e2e.test_cycle import assert_continues, checkpoint_and_kill

TICKS, INTERVAL_MS = 400, 10
NOBODY = 65534
PAGE = 4096


@pytest.fixture
def data_dir():
    """A private directory on a disk, in no temporary place; removed after."""
    for base in ("/var/lib", "/srv", "/opt", str(Path.home())):
        if os.path.isdir(base) and os.access(base, os.W_OK) \
                and not scratch.is_scratch(base + "/x"):
            path = Path(tempfile.mkdtemp(prefix="dmtcp-test-ro-", dir=base))
            break
    else:
        pytest.skip("no directory on a disk outside the temporary places to write in")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _data_file(directory: Path) -> Path:
    """Two pages of random bytes, owned by nobody, 0644."""
    path = directory / "table.dat"
    path.write_bytes(os.urandom(2 * PAGE))
    os.chown(path, NOBODY, NOBODY)
    os.chmod(path, 0o644)
    return path


def _entry(image: Path, path: Path) -> dict:
    m = json.loads((image / "manifest.json").read_text())
    found = [e for e in m["shared_files"] if e["path"] == str(path)]
    assert len(found) == 1, m["shared_files"]
    return found[0]


def _restart(comp, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([tool("dmtcp-restart"), "-p", str(comp.port), *args],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=TIMEOUT)


def _identity(st: os.stat_result) -> tuple:
    """What any write, chmod or chown to a file would change."""
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode, st.st_uid,
            st.st_gid)


def test_another_users_read_only_file_is_not_written_back(comp, programs, data_dir):
    target = _data_file(data_dir)
    content = target.read_bytes()
    before = os.stat(target)
    proc, out = comp.launch(*programs["ro_map"], str(TICKS), str(INTERVAL_MS), str(target))
    comp.wait_peers(1)
    first, killed = checkpoint_and_kill(comp, proc, out)
    image = comp.images()[0]
    # described for the check at restart, not copied
    assert _entry(image, target) == {"path": str(target), "size": 2 * PAGE,
                                     "mtime_ns": before.st_mtime_ns,
                                     "sha256": hashlib.sha256(content).hexdigest()}
    assert not list(image.glob("shared-*.data"))
    shown = json.loads(subprocess.run([tool("dmtcp-inspect"), "--json", str(image)],
                                      capture_output=True, text=True, check=True).stdout)
    [info] = shown if isinstance(shown, list) else [shown]
    assert str(target) in info["checked_files"] and str(target) not in info["saved_files"]
    restarted, rout = comp.restart()
    assert restarted.wait(timeout=TIMEOUT) == 0, restarted.err_path.read_text()
    assert_continues(rout, first, killed, "ro_map")
    assert _identity(os.stat(target)) == _identity(before)
    assert target.read_bytes() == content


def test_a_changed_file_is_named_and_refused_unless_allowed(comp, programs, data_dir):
    target = _data_file(data_dir)
    proc, out = comp.launch(*programs["ro_map"], str(TICKS), str(INTERVAL_MS), str(target))
    comp.wait_peers(1)
    first, killed = checkpoint_and_kill(comp, proc, out)
    image = comp.images()[0]
    checkpointed = os.stat(target)

    with open(target, "ab") as f:  # grown
        f.write(b"more")
    res = _restart(comp, str(image))
    assert res.returncode != 0
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.stderr
    assert str(target) in res.stderr and f"size {2 * PAGE} -> {2 * PAGE + 4} bytes" in res.stderr
    assert "--allow-changed-files" in res.stderr
    assert res.stdout == "" and comp.status()["num_peers"] == 0

    # same size again, other bytes past the mapped page, a later mtime: the
    # restored mapping is unaffected, so the program can go on when allowed
    with open(target, "r+b") as f:
        f.truncate(2 * PAGE)
        f.seek(PAGE + 100)
        f.write(b"changed")
    later = checkpointed.st_mtime_ns + 3_000_000_000
    os.utime(target, ns=(later, later))
    res = _restart(comp, str(image))
    assert res.returncode != 0
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.stderr
    assert str(target) in res.stderr and "modified" in res.stderr and "size" not in res.stderr
    assert comp.status()["num_peers"] == 0

    restarted, rout = comp._start("restart", [tool("dmtcp-restart"), "-p", str(comp.port),
                                              "--allow-changed-files", str(image)])
    assert restarted.wait(timeout=TIMEOUT) == 0, restarted.err_path.read_text()
    assert_continues(rout, first, killed, "ro_map")
    tree = json.loads((image / "manifest.json").read_text())["tree_id"]
    agent_log = run_dir() / f"agent-{tree}-restart-{restarted.pid}.log"
    logged = agent_log.read_text()
    assert str(target) in logged and "changed since the checkpoint" in logged
    assert os.stat(target).st_mtime_ns == later  # still not written


def _gconv_cache(pid: int) -> str | None:
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].endswith("/gconv-modules.cache"):
            return fields[5]
    return None


def _python_pids(proc: subprocess.Popen) -> list[int]:
    """The Python interpreters under one launch (not the tree's init, whose
    command line names counter.py too)."""
    out = []
    for p in psutil.Process(proc.pid).children(recursive=True):
        cmd = p.cmdline()
        if cmd and os.path.basename(cmd[0]).startswith("python") \
                and any(arg.endswith("/counter.py") for arg in cmd):
            out.append(p.pid)
    return out


def test_python_trees_restarting_together_leave_gconv_cache_alone(comp, programs):
    """The issue's case, scaled down: several Python trees (glibc maps
    gconv-modules.cache read-only MAP_SHARED into each) restart at once."""
    trees = 3
    runs = [comp.launch(*programs["counter_py"], str(TICKS), str(INTERVAL_MS))
            for _ in range(trees)]
    comp.wait_peers(trees)
    for _, out in runs:
        wait_for(lambda out=out: last_tick(out) >= 5, what="ticks")
    pids = [pid for proc, _ in runs for pid in _python_pids(proc)]
    assert len(pids) == trees
    cache = _gconv_cache(pids[0])
    if cache is None:
        pytest.skip("python3 does not map gconv-modules.cache on this system")
    before = os.stat(cache)
    comp.checkpoint()
    comp.command("-k")
    for proc, _ in runs:
        proc.wait(timeout=TIMEOUT)
    for image in comp.images():
        assert "data" not in _entry(image, Path(cache))
    restarted, rout = comp.restart()
    assert restarted.wait(timeout=TIMEOUT) == 0, restarted.err_path.read_text()
    done = [row for row in ticks(rout) if row[0] == "done"]
    assert len(done) == trees and all(row[1] == str(TICKS) for row in done)
    assert _identity(os.stat(cache)) == _identity(before)
