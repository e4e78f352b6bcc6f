"""dmtcp-restart starts CRIU before it loads anything CRIU does not need
(cli/restarting.py): the agent's modules, asyncio and the coordinator it
starts load while CRIU restores, and the restarted program still runs."""
from __future__ import annotations

import os
import subprocess

from tests.e2e.harness import TIMEOUT, tool, wait_until_running
from tests.e2e.test_bad_input import free_port
from tests.unit.test_light_imports import RESTART_BEFORE_CRIU

# dmtcp-restart itself, noting every module loaded when CRIU's restore is
# started (its command line, through subprocess or posix_spawn; ssl is
# there as None, kept out: cli/no_tls.py)
AT_CRIU = """
import sys
out = sys.argv.pop(1)

def note(event, args):
    argv = args[1] if event in ("subprocess.Popen", "os.posix_spawn") else ()
    if len(argv) > 1 and argv[1] == "restore":
        with open(out, "w") as f:
            f.write(" ".join(m for m, v in sys.modules.items() if v is not None))

sys.addaudithook(note)
sys.argv[0] = "dmtcp-restart"
from dmtcp_py.cli.restart import main
main()
"""


def test_criu_restores_before_the_heavy_modules_load(comp, programs, tmp_path):
    proc, _ = comp.launch(*programs["counter_single"], "3000", "10")
    comp.wait_peers(1)
    comp.checkpoint()
    assert comp.kill_and_wait(proc) != 0
    noted, port = tmp_path / "at-criu", free_port()
    restarted = subprocess.Popen(
        [os.path.join(os.path.dirname(tool("dmtcp-restart")), "python"), "-c", AT_CRIU,
         str(noted), "--new-coordinator", "-p", str(port), str(comp.images()[0])],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_until_running(restarted, port)
        assert restarted.poll() is None, restarted.stderr.read()
    finally:
        subprocess.run([tool("dmtcp-command"), "-p", str(port), "-q"], capture_output=True,
                       timeout=TIMEOUT)
        restarted.wait(timeout=TIMEOUT)
        restarted.stderr.close()
    loaded = set(noted.read_text().split())
    assert "dmtcp_py.agent.restoring" in loaded  # (noted where the restore began)
    assert not loaded & set(RESTART_BEFORE_CRIU), sorted(loaded & set(RESTART_BEFORE_CRIU))
