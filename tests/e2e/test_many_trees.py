"""Many separately launched trees on one host, checkpointed, killed and
restarted from the restart script, twice: all of them come back and go on
from where they were, under one agent process (each tree in a PID
namespace of its own: agent/together.py) that still writes each tree's
log apart, and the system file every Python program maps
(gconv-modules.cache) is never written."""
from __future__ import annotations

import json
import os
from pathlib import Path

import psutil

from dmtcp_py.paths import run_dir
from tests.e2e.harness import TIMEOUT, ticks, wait_for

TREES = 64
INTERVAL_MS = 200
TICKER = Path(__file__).parent / "programs" / "named_ticker.py"


def _last_ticks(out: Path) -> dict[str, int]:
    """name -> the last tick it printed in that output."""
    last: dict[str, int] = {}
    for row in ticks(out):
        if row[0] == "tick" and len(row) == 3:
            last[row[2]] = int(row[1])
    return last


def _gconv_cache() -> Path | None:
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].endswith("/gconv-modules.cache"):
            return Path(fields[5])
    return None


def _identity(path: Path) -> tuple:
    st = os.stat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _wait_all_running(comp) -> None:
    wait_for(lambda: (lambda s: s["num_peers"] == TREES and s["running"])(comp.status()),
             timeout=3 * TIMEOUT, what=f"{TREES} trees running")


def _checkpoint_and_kill(comp, outputs: list[Path], waited: list) -> dict[str, int]:
    """-bc, then -k; the tick each tree had reached by the checkpoint, at least."""
    seen = {}
    for out in outputs:
        seen.update(_last_ticks(out))
    comp.checkpoint()
    comp.command("-k")
    for proc in waited:
        proc.wait(timeout=TIMEOUT)
    wait_for(lambda: comp.status()["num_peers"] == 0, what="every tree gone")
    return seen


def _agents_of_one_process(comp) -> None:
    """Every restored tree's agent is the one process; each tree's records
    are in a log of its own, and only its own."""
    trees = json.loads(comp.command("-l", "--json").stdout)["trees"]
    assert len(trees) == TREES
    pids = {t["agent_pid"] for t in trees}
    assert len(pids) == 1, pids
    pid, = pids
    for t in trees:
        text = (run_dir() / f"agent-{t['tree_id']}-restart-{pid}.log").read_text()
        assert f"_{t['tree_id']}.dmtcp" in text  # "restored <its image> ..."
        assert not any(f"_{o['tree_id']}.dmtcp" in text for o in trees if o is not t)


def test_many_python_trees_restart_together_twice(comp):
    cache = _gconv_cache()
    assert cache is not None, "python maps gconv-modules.cache: the test's premise"
    before = _identity(cache)
    names = [f"t{i:02d}" for i in range(TREES)]
    launched = [comp.launch("python3", str(TICKER), name, str(INTERVAL_MS)) for name in names]
    _wait_all_running(comp)
    outputs = [out for _, out in launched]
    wait_for(lambda: all(_last_ticks(out) for out in outputs), what="every tree ticking")
    waited = [proc for proc, _ in launched]
    for _ in range(2):
        at_checkpoint = _checkpoint_and_kill(comp, outputs, waited)
        assert set(at_checkpoint) == set(names)
        restarted, rout = comp.restart()
        _wait_all_running(comp)
        # each tree goes on from its own tick: past what it had printed
        # before the checkpoint, and never from 1 again
        wait_for(lambda: set(_last_ticks(rout)) == set(names), timeout=TIMEOUT,
                 what="every restored tree ticking")
        first = {}
        for row in ticks(rout):
            first.setdefault(row[2], int(row[1]))
        assert all(first[n] > 1 and first[n] >= at_checkpoint[n] for n in names), first
        assert restarted.poll() is None  # dmtcp-restart waits for its trees
        _agents_of_one_process(comp)
        outputs, waited = [rout], [restarted]
    assert _identity(cache) == before
    assert len([p for p in psutil.Process(restarted.pid).children(recursive=True)
                if p.name().startswith("python")]) == TREES
    comp.command("-k")
    restarted.wait(timeout=TIMEOUT)
