"""`dmtcp-restart --lazy` (and the restart script's --lazy): the program
runs as soon as its processes are back, its memory comes in from the page
files on demand and in the background (CRIU's lazy pages); the pages are
checked meanwhile, and a damaged one kills the program (issue 17, part 2)."""
from __future__ import annotations

import psutil

from tests.e2e.harness import TIMEOUT, ticks, wait_for

# a pattern in 96 MiB of memory; every tick sums a page in 64, and says so
HOLDER = """import sys, time
b = bytearray(96 << 20)
for i in range(0, len(b), 4096):
    b[i] = (i // 4096) % 251
n = int(sys.argv[1]) if len(sys.argv) > 1 else 0
while True:
    n += 1
    print("tick", n, sum(b[i] for i in range(0, len(b), 4096 * 64)), flush=True)
    time.sleep(0.05)
"""
EXPECTED = str(sum(((i * 64) % 251) for i in range((96 << 20) // (4096 * 64))))


def _checkpointed(comp, tmp_path):
    program = tmp_path / "holder.py"
    program.write_text(HOLDER)
    proc, out = comp.launch("python3", str(program))
    wait_for(lambda: len(ticks(out)) >= 3, what="ticks")
    comp.checkpoint()
    comp.kill_and_wait(proc)
    assert all(r[2] == EXPECTED for r in ticks(out)), ticks(out)[-3:]
    return comp.images()[0]


def _lazy_daemons() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True)
            if p.name() == "criu" and "lazy-pages" in p.cmdline()]


def test_a_lazy_restart_runs_on_with_its_memory_intact(comp, tmp_path):
    _checkpointed(comp, tmp_path)
    restarted, out = comp._start("lazy", [str(comp.ckptdir / "dmtcp_restart_script.sh"),
                                          "--coord-port", str(comp.port), "--lazy"])
    wait_for(lambda: len(ticks(out)) >= 5, what="ticks after the lazy restart")
    assert all(r[2] == EXPECTED for r in ticks(out)), ticks(out)[-3:]
    # every page came in by itself: the daemon ends (96 MiB: in a moment)
    wait_for(lambda: not _lazy_daemons(), timeout=TIMEOUT, what="the lazy-pages daemon to end")
    comp.command("-k")
    restarted.wait(timeout=TIMEOUT)


def test_damaged_pages_kill_a_lazily_restarted_program(comp, tmp_path):
    image = _checkpointed(comp, tmp_path)
    target = max(image.glob("pages-*.img"), key=lambda p: p.stat().st_size)
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x10
    target.write_bytes(bytes(data))
    restarted, out = comp._start("lazy", [str(comp.ckptdir / "dmtcp_restart_script.sh"),
                                          "--coord-port", str(comp.port), "--lazy"])
    assert restarted.wait(timeout=TIMEOUT) != 0
    err = restarted.err_path.read_text()
    assert target.name in err and "damaged" in err and "Traceback" not in err, err
    wait_for(lambda: comp.status()["num_peers"] == 0, what="the program to go")
    wait_for(lambda: not _lazy_daemons(), what="the lazy-pages daemon to go")
