"""An alarm that expires while CRIU dumps the process still comes after a
restart (hijack/src/timers.c).

CRIU reads a task's pending signals before it reads its interval timers;
an alarm() expiring between the two is in the image neither as a timer
nor as a pending SIGALRM.  That window is a few milliseconds inside CRIU,
so the test makes the same image another way: the alarm expires while the
agent holds the program stopped at SUSPENDED (before CRIU runs, so CRIU
sees it pending), and the pending SIGALRM is then taken out of the image,
as CRIU's race leaves it.  Without timers.c the restored program never
gets another alarm (its count stands still); with it, the shim sees at
RESUME that the alarm armed at SUSPEND has expired, finds its signal not
pending, and sends it again."""
from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pycriu

from dmtcp_py.fault_injection import hold_env
from dmtcp_py.images import integrity
from dmtcp_py.protocol.states import State
from tests.e2e.harness import last_tick, ticks, tree_report, wait_for

ALARM_S, HOLD_S = 3, 4  # the alarm expires during the hold, after the checkpoint began


def _alarms(out: Path) -> int:
    rows = [r for r in ticks(out) if r[0] == "tick"]
    return int(rows[-1][3]) if rows else -1


def _drop_pending_signals(image: Path) -> list[int]:
    """Take the process-wide pending signals out of the image's core files
    and give the manifest their new digests; the signal numbers taken."""
    manifest = json.loads((image / "manifest.json").read_text())
    algorithm = next(a for a in integrity.ALGORITHMS if manifest.get(a))
    taken = []
    for core in sorted(image.glob("core-*.img")):
        with open(core, "rb") as f:
            data = pycriu.images.load(f)
        changed = False
        for entry in data["entries"]:
            pending = entry.get("tc", {}).get("signals_s", {})
            for signal in pending.pop("signals", []):
                taken.append(int.from_bytes(base64.b64decode(signal["siginfo"])[:4], "little"))
                changed = True
        if changed:
            content = core.with_suffix(".new")
            with open(content, "wb") as f:
                pycriu.images.dump(data, f)
            os.chmod(content, 0o600)
            os.replace(content, core)
            h = integrity.hasher(algorithm)
            h.update(core.read_bytes())
            manifest[algorithm][core.name] = h.hexdigest()
            manifest["files"][core.name] = core.stat().st_size
    (image / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return taken


def test_an_alarm_lost_from_the_image_comes_after_the_restart(comp, programs):
    env = {**os.environ, **hold_env(State.SUSPENDED, HOLD_S)}
    proc, out = comp.launch(*programs["res_alarm"], "100000", "10", str(ALARM_S), env=env)
    wait_for(lambda: last_tick(out) >= 5, what="ticks", explain=lambda: tree_report(proc))
    comp.checkpoint()
    comp.kill_and_wait(proc)
    image = comp.images()[0]
    assert _drop_pending_signals(image) == [14], "the alarm did not expire during the hold"
    restarted, rout = comp.restart()
    wait_for(lambda: _alarms(rout) >= 1, timeout=ALARM_S + 10,
             what="an alarm in the restarted program", explain=lambda: tree_report(restarted))
    assert comp.kill_and_wait(restarted) != 0
