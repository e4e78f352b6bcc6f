"""Pre-copy (--precopy, images.precopy): a round begins with CRIU's
pre-dump of the running program into a layer; the dump, the program
stopped, takes only what it wrote since.  Held between the two
(DMTCP_TEST_HOLD_PRECOPIED), the program rewrites part of its memory: the
generation must hold those words as rewritten, not as the pre-dump read
them; every generation restarts on its own, the layer is gone after its
round, a round after which little was written is not pre-copied, a
restored tree keeps its --precopy, and a tree whose pre-copy fails is
dumped whole."""
from __future__ import annotations

import json
import os
import subprocess

from dmtcp_py.fault_injection import hold_env
from dmtcp_py.paths import run_dir
from dmtcp_py.protocol.states import State
from tests.e2e.harness import TIMEOUT, agent_log, tool, wait_for
from tests.e2e.test_incremental import MemProgram, _dumped_bytes, restart

HOLD = 3.0  # seconds each round waits after its pre-copy: the program writes then
# a program whose every write is more than a round needs to pre-copy
# (tree_work.PRECOPY_FROM): PART percent of BIG MiB
BIG, PART = 128, 60


def _checkpoint_writing_after_the_precopy(comp, prog, generation: int,
                                          write: bool = True) -> str:
    """-bc; once the pre-copy of `generation` is stored (the agent holds
    there), the program rewrites a part of its memory (if write); the
    command's output."""
    bc = subprocess.Popen([tool("dmtcp-command"), "-p", str(comp.port), "-bc"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: f"generation {generation}: pre-copied" in agent_log(comp),
                 what=f"the pre-copy of generation {generation}")
        if write:
            prog.write()
        out, err = bc.communicate(timeout=TIMEOUT)
    finally:
        if bc.poll() is None:
            bc.kill()
            bc.communicate()
    assert bc.returncode == 0 and "done" in out, err
    return out


def test_what_the_program_writes_after_the_precopy_is_in_the_generation(comp, programs,
                                                                        tmp_path):
    env = {**os.environ, **hold_env(State.PRECOPIED, HOLD)}
    prog = MemProgram(comp, programs, tmp_path, "--precopy", env=env, mib=BIG, percent=PART)
    # the first checkpoint is pre-copied: its dump takes little
    assert _dumped_bytes(_checkpoint_writing_after_the_precopy(comp, prog, 1, write=False)) \
        <= (BIG << 20) // 4
    assert not list(comp.ckptdir.glob(".*.precopy")), "the layer was left behind"
    # more than PRECOPY_FROM written since: the next one too, from the first
    prog.write()
    out = _checkpoint_writing_after_the_precopy(comp, prog, 2)
    assert _dumped_bytes(out) >= (BIG << 20) * PART // 100  # (what was written after it)
    assert not list(comp.ckptdir.glob(".*.precopy")), "the layer was left behind"
    comp.kill_and_wait(prog.proc)
    newest = comp.images()[0]
    m = json.loads((newest / "manifest.json").read_text())
    assert m["generation"] == 2
    assert m["options"] == {"compress": False, "incremental": True, "precopy": True}
    assert not (newest / "parent").exists()
    proc, out = restart(comp, newest, 1)
    assert prog.check(out) == "ok 0"
    comp.kill_and_wait(proc)
    # the restored tree (in a PID namespace of its own) is pre-copied too,
    # as it was launched (the image says so: no option needed), the first
    # time; the next time, with nothing written since, it is not
    proc, out = restart(comp, newest)
    assert prog.check(out) == "ok 2"
    tree = m["tree_id"]
    for generation, said in ((3, "pre-copied"), (4, "not pre-copied")):
        assert _dumped_bytes(comp.checkpoint()) <= (BIG << 20) // 4
        logged = (run_dir() / f"agent-{tree}-restart-{proc.pid}.log").read_text()
        assert f"generation {generation}: {said}" in logged
    comp.kill_and_wait(proc)
    proc, out = restart(comp, comp.images()[0])
    assert prog.check(out) == "ok 2"
    comp.kill_and_wait(proc)


def test_a_failed_precopy_leaves_the_dump_whole(comp, programs, tmp_path):
    """Storing the pre-copy fails after CRIU protected the written pages
    again (DMTCP_TEST_FAIL_PRECOPY_STORE): the round goes on, its dump
    writes every page (not only those written since: the pages written
    before the pre-copy are in no image), and the generation restarts
    with the words the program last wrote."""
    env = {**os.environ, "DMTCP_TEST_FAIL_PRECOPY_STORE": "1"}
    prog = MemProgram(comp, programs, tmp_path, "--precopy", env=env, mib=BIG, percent=PART)
    comp.checkpoint()
    prog.write()  # (enough for a pre-copy)
    out = comp.checkpoint()
    assert _dumped_bytes(out) >= BIG << 20, out
    assert "pre-copy failed" in agent_log(comp)
    assert not list(comp.ckptdir.glob(".*.precopy")), "the layer was left behind"
    comp.kill_and_wait(prog.proc)
    proc, out = restart(comp, comp.images()[0])
    assert prog.check(out) == "ok 1"
    comp.kill_and_wait(proc)
