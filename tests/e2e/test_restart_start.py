"""dmtcp-restart starts CRIU before it loads anything CRIU does not need
(cli/restarting.py): the agent's modules, asyncio and the coordinator it
starts load while CRIU restores, and the restarted program still runs.
Under a coordinator that runs already, the restart claims its tree first
(coordinator/claims.py): one it refuses touches nothing.  A tree's sockets
are made again while CRIU restores (agent/start.py)."""
from __future__ import annotations

import os
import subprocess

import pytest

from tests.e2e.harness import (TIMEOUT, last_tick, stream_images, tool, wait_for,
                                wait_until_running)
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


def _restart_noting_modules(noted, *args: str, stdout=subprocess.DEVNULL) -> subprocess.Popen:
    return subprocess.Popen(
        [os.path.join(os.path.dirname(tool("dmtcp-restart")), "python"), "-c", AT_CRIU,
         str(noted), *args], stdin=subprocess.DEVNULL, stdout=stdout,
        stderr=subprocess.PIPE)


def _began_light(noted, *allowed: str) -> None:
    """CRIU's restore began before the heavy modules (but those allowed)
    were loaded."""
    loaded = set(noted.read_text().split())
    assert "dmtcp_py.agent.restoring" in loaded  # (noted where the restore began)
    heavy = set(RESTART_BEFORE_CRIU) - set(allowed)
    assert not loaded & heavy, sorted(loaded & heavy)


@pytest.mark.parametrize("coordinator", ["its own", "running"])
def test_criu_restores_before_the_heavy_modules_load(comp, programs, tmp_path, coordinator):
    proc, _ = comp.launch(*programs["counter_single"], "3000", "10")
    comp.wait_peers(1)
    comp.checkpoint()
    assert comp.kill_and_wait(proc) != 0
    noted = tmp_path / "at-criu"
    port = free_port() if coordinator == "its own" else comp.port
    where = ["--new-coordinator"] if coordinator == "its own" else ["--join"]
    restarted = _restart_noting_modules(noted, *where, "-p", str(port), str(comp.images()[0]))
    try:
        wait_until_running(restarted, port)
        assert restarted.poll() is None, restarted.stderr.read()
    finally:
        subprocess.run([tool("dmtcp-command"), "-p", str(port),
                        "-q" if coordinator == "its own" else "-k"],
                       capture_output=True, timeout=TIMEOUT)
        restarted.wait(timeout=TIMEOUT)
        restarted.stderr.close()
    _began_light(noted)


@pytest.mark.parametrize("commands", ["one per tree", "one for both"])
def test_connected_trees_restore_while_their_agents_load(comp, programs, tmp_path, commands):
    """A server and its client, two trees, restarted under the running
    coordinator by a dmtcp-restart each, or by one for both (their agents
    then share its process: together.py): CRIU restores each before the
    agents load, the agents make the connection again while CRIU
    restores, and the stream goes on from where it was, every counter
    checked by net_stream (a lost or doubled byte fails it)."""
    images = stream_images(comp, programs, free_port(), "300", 20)
    runs = [[image] for image in images] if commands == "one per tree" else [images]
    restarted = []
    try:
        for i, run in enumerate(runs):
            with open(tmp_path / f"out-{i}", "w") as out:
                restarted.append(_restart_noting_modules(
                    tmp_path / f"at-criu-{i}", "--join", "-p", str(comp.port),
                    *map(str, run), stdout=out))
        for proc in restarted:
            _, err = proc.communicate(timeout=TIMEOUT)
            assert proc.returncode == 0, err
            assert b"FAIL" not in err, err
    finally:
        for proc in restarted:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stderr.close()
    done = sorted(line.split()[2] for i in range(len(runs))
                  for line in (tmp_path / f"out-{i}").read_text().splitlines()
                  if line.startswith("done"))
    assert done == ["client", "server"]
    # (both images' drained bytes are more than integrity.verify_all hashes
    # in one thread: its pool, and concurrent.futures, come before CRIU)
    pool = ("concurrent.futures", "logging") if len(runs) == 1 else ()
    for i in range(len(runs)):
        _began_light(tmp_path / f"at-criu-{i}", *pool)


def test_a_restart_refused_while_its_tree_runs_touches_nothing(comp, programs, tmp_path):
    """The tree still runs (say, a second copy of the restart script): its
    coordinator refuses the claim before CRIU starts or the file the
    program writes is cut back to its checkpoint-time length."""
    proc, out = comp.launch(*programs["counter_single"], "3000", "10")
    comp.wait_peers(1)
    comp.checkpoint()
    at_checkpoint = out.stat().st_size
    # ~3 KB a second: a cut would take back more than it writes meanwhile
    wait_for(lambda: out.stat().st_size > at_checkpoint + 3000, what="the output to grow")
    before = out.stat().st_size
    noted = tmp_path / "at-criu"
    refused = _restart_noting_modules(noted, "--join", "-p", str(comp.port),
                                      str(comp.images()[0]))
    _, err = refused.communicate(timeout=TIMEOUT)
    assert refused.returncode != 0
    assert b"busy with computation" in err, err
    assert not noted.exists()  # CRIU never started
    assert out.stat().st_size >= before  # (appended to, never cut)
    ticked = last_tick(out)
    wait_for(lambda: last_tick(out) > ticked, what="the program to tick on")
    assert proc.poll() is None and comp.status()["running"]
    assert comp.kill_and_wait(proc) != 0


def test_an_incremental_generation_restores_before_the_heavy_modules_load(comp, programs,
                                                                          tmp_path):
    """A generation that shares chunks with the one before is read through
    a view of parent images (images.page_chain): its pagemaps are read and
    written without pycriu's classes (55-70 ms of import) and the view is
    made without concurrent.futures or logging, so CRIU begins as early as
    for a whole image; the program finds every word of its memory."""
    from tests.e2e.test_incremental import MemProgram
    prog = MemProgram(comp, programs, tmp_path)
    comp.checkpoint()
    prog.write()
    comp.checkpoint()
    comp.kill_and_wait(prog.proc)
    noted, out = tmp_path / "at-criu", tmp_path / "restarted.out"
    with open(out, "w") as o:
        restarted = _restart_noting_modules(noted, "--join", "-p", str(comp.port),
                                            str(comp.images()[0]), stdout=o)
    try:
        assert prog.check(out) == "ok 1"
    finally:
        comp.command("-k")
        restarted.wait(timeout=TIMEOUT)
        restarted.stderr.close()
    _began_light(noted, "blake3")  # (the image's digests are BLAKE3's: images.chunks)
