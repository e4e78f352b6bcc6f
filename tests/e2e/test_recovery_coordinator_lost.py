"""The coordinator killed while a recovery restarts the computation
(--auto-restart): a clear outcome, nothing lost.  The restarting agents end
by themselves, their restored trees killed (a restart not yet released
cannot finish without its coordinator, and must not run on half done),
each with one line saying so; the checkpoint images are intact; and the
restart script run against a new coordinator brings the ring back, to its
end with every byte exactly once."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import psutil
import pytest

from dmtcp_py.fault_injection import hold_env
from dmtcp_py.images import integrity, manifest
from dmtcp_py.protocol.states import State
from tests.conftest import kill_descendants
from tests.e2e.conftest import need_root
from tests.e2e.harness import TIMEOUT, Computation, ticks, tool, wait_for
from tests.e2e.test_auto_restart import ring_streams

TICKS, TICK_MS = 160, 50
PORT = "7922"
ADDRS = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
# the recovery's agents linger this long with their trees restored, before
# they report it: the coordinator is killed in that time
HOLD = 8


@pytest.fixture
def run_dir(tmp_path, monkeypatch) -> Path:
    """Logs, tokens and the recovery's output of this test's own."""
    monkeypatch.setenv("DMTCP_TMPDIR", str(tmp_path / "tmp"))
    return tmp_path / "tmp" / f"dmtcp-{psutil.Process().username()}@{os.uname().nodename}"


@pytest.fixture
def comps(tmp_path, run_dir):
    """The coordinator with --auto-restart; later, a new one."""
    need_root()
    # the hold is in the coordinator's environment only, which its
    # recovery's restart inherits; the launched trees do not have it
    made = [Computation(tmp_path, "--auto-restart",
                        "--heartbeat", "0.5", "--heartbeat-timeout", "3",
                        env=hold_env(State.RESTARTING, HOLD))]
    try:
        yield made
    finally:
        for comp in made:
            comp.close()
        kill_descendants()


def gone(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_coordinator_killed_while_recovering(comps, programs, run_dir, tmp_path):
    auto = comps[0]
    outs = []
    for i, addr in enumerate(ADDRS):
        outs.append(auto.launch(*programs["net_stream"], "ring", addr, PORT,
                                ADDRS[(i + 1) % len(ADDRS)], str(TICKS), str(TICK_MS))[1])
    auto.wait_peers(3)
    ring_streams(outs)  # (a connection not yet accepted would restore closed)
    auto.command("-i", "1")
    wait_for(lambda: (st := auto.status())["last_checkpoint"] and st["last_checkpoint"]["ok"]
             and st["last_checkpoint"]["trees"] == 3, what="a checkpoint of the three trees")
    auto.command("-i", "0")
    st = wait_for(lambda: (st := auto.status())["running"] and st, what="the checkpoint to end")
    generation, images = st["generation"], auto.images()
    sums = {image: integrity.expected(manifest.load(image)) for image in images}
    # a recovery: one tree's program killed
    trees = json.loads(auto.command("-l", "--json").stdout)["trees"]
    os.kill(next(row[0] for t in trees for row in t["procs"] if row[1] == "net_stream"),
            signal.SIGKILL)

    def restored() -> int:
        return sum("restored " in p.read_text() for p in run_dir.glob("agent-*-restart-*.log"))

    wait_for(lambda: restored() == 3, what="the recovery's agents to restore their trees")
    log = run_dir / f"coordinator-{auto.port}.log"
    assert auto.status()["recovering"] == "restarting"
    restart = psutil.Process(int(re.search(r"restart running as pid (\d+)", log.read_text())[1]))
    restarting = [restart, *restart.children(recursive=True)]  # agents and restored trees
    assert sum(p.name() == "net_stream" for p in restarting) == 3, restarting
    auto.coordinator.send_signal(signal.SIGKILL)
    auto.coordinator.wait()

    # the restarting agents end by themselves, their trees with them
    wait_for(lambda: all(map(gone, restarting)), what="the restart to end by itself")
    _, status = os.waitpid(restart.pid, 0)  # an orphan now: we are the subreaper
    assert os.waitstatus_to_exitcode(status) != 0
    out = (run_dir / f"recovery-{auto.port}.out").read_text()
    errors = [line for line in out.splitlines() if line.startswith("dmtcp-restart: error: ")]
    assert len(errors) == 3 and "Traceback" not in out, out
    assert all(f"the coordinator went away during the restart of generation {generation}" in e
               and "images are intact" in e for e in errors), errors

    # the images are intact
    assert auto.images() == images
    integrity.verify_all([(image, *sums[image]) for image in images])
    shown = subprocess.run([tool("dmtcp-inspect"), "--json", *map(str, images)],
                           capture_output=True, text=True, timeout=TIMEOUT)
    assert shown.returncode == 0, shown.stderr
    assert {i["generation"] for i in json.loads(shown.stdout)} == {generation}

    # and the restart script, with a new coordinator, brings the ring back to its end
    (tmp_path / "again").mkdir()
    comps.append(Computation(tmp_path / "again"))
    new = comps[-1]
    with open(tmp_path / "again.out", "w") as o, open(tmp_path / "again.err", "w") as e:
        again = subprocess.Popen([str(auto.ckptdir / "dmtcp_restart_script.sh"),
                                  "--coord-port", str(new.port)],
                                 stdin=subprocess.DEVNULL, stdout=o, stderr=e)
    assert again.wait(timeout=TIMEOUT * 2) == 0, (tmp_path / "again.err").read_text()
    text = (tmp_path / "again.out").read_text()
    done = [r for r in ticks(tmp_path / "again.out") if r[0] == "done"]
    assert "FAIL" not in text and len(done) == 3, text[-2000:]
    assert all(r[:3] == ["done", str(TICKS), "ring"] for r in done), done
