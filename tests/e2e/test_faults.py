"""Faults in the middle of a checkpoint, injected for real: the processes
that survive go on running (never left stopped), with their sockets, and
the previous complete generation still restarts."""
from __future__ import annotations

import os
import signal
import subprocess

from tests.e2e.harness import TIMEOUT, last_tick, ticks, tool, wait_for
from tests.e2e.test_bad_input import free_port
from tests.e2e.test_network import last


def test_coordinator_killed_mid_checkpoint_the_program_goes_on_with_its_sockets(comp, programs):
    port = str(free_port())
    hold = {**os.environ, "DMTCP_TEST_HOLD_DRAINED": "3"}  # agents linger with sockets parked
    server, sout = comp.launch(*programs["net_stream"], "server", "127.0.0.1", port, "50", "10",
                               env=hold)
    wait_for(lambda: sout.exists() and "listening" in sout.read_text(), what="the server")
    counter, cout = comp.launch(*programs["counter_single"], "100000", "10", env=hold)
    comp.wait_peers(2)
    comp.checkpoint()  # generation 1: a good one
    first = comp.images()
    with open(comp.root / "bc.err", "w") as err:
        bc = subprocess.Popen([tool("dmtcp-command"), "-p", str(comp.port), "-bc"],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
    wait_for(lambda: comp.status()["state"] == "DRAINED", what="the agents draining")
    comp.coordinator.send_signal(signal.SIGKILL)
    comp.coordinator.wait()

    assert bc.wait(timeout=TIMEOUT) != 0
    assert (comp.root / "bc.err").read_text().count("\n") == 1  # one line, no traceback
    # not left stopped: the counter ticks on
    seen = last_tick(cout)
    wait_for(lambda: last_tick(cout) >= seen + 10, what="the counter to go on")
    # the listening socket is back in its place: a new client is served to the end
    client = subprocess.run([*programs["net_stream"], "client", "127.0.0.1", port, "50", "10"],
                            stdin=subprocess.DEVNULL, capture_output=True, text=True,
                            timeout=TIMEOUT)
    assert client.returncode == 0, client.stderr
    assert server.wait(timeout=TIMEOUT) == 0, server.err_path.read_text()
    assert last(sout, "server") == 50
    # the good generation is still there, untouched by the abandoned one
    assert comp.images() == first
    assert not list(comp.ckptdir.glob(".*partial*"))
    counter.terminate()  # the agent passes it on to its tree
    assert counter.wait(timeout=TIMEOUT) != 0
    # and the good generation restarts, both trees, under a new coordinator
    out, new_port = comp.root / "restarted.out", str(free_port())
    with open(out, "w") as o:
        restarted = subprocess.Popen([tool("dmtcp-restart"), "--new-coordinator", "-p", new_port,
                                      *map(str, first)],
                                     stdin=subprocess.DEVNULL, stdout=o, stderr=subprocess.STDOUT)

    def counter_ticks() -> list[int]:
        return [int(r[1]) for r in ticks(out) if r[0] == "tick" and r[2] != "server"]

    try:
        wait_for(lambda: len(counter_ticks()) >= 5 or restarted.poll() is not None,
                 what="the restarted counter")
        assert restarted.poll() is None, out.read_text()
        assert 0 < counter_ticks()[0] <= seen + 1
    finally:
        subprocess.run([tool("dmtcp-command"), "-p", new_port, "-q"], capture_output=True,
                       timeout=TIMEOUT)
        restarted.wait(timeout=TIMEOUT)
