"""Incremental generations (images.chunks): a generation stores only the
memory chunks that changed since the previous one and hard-links the rest,
yet each kept generation restarts on its own; a damaged shared chunk is
caught; --keep N keeps N previous generations, and pruning one never breaks
a newer one; --gzip generations are whole (not incremental) and restart."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.e2e.harness import TIMEOUT, agent_log, tool, wait_for

MIB, PERCENT = 64, 5


class MemProgram:
    """mem_phases under a computation, driven through its control file."""

    def __init__(self, comp, programs, tmp_path: Path, *options: str, env=None,
                 scatter: bool = False, mib: int = MIB, percent: int = PERCENT) -> None:
        self.comp, self.control, self.seq = comp, tmp_path / "control", 0
        self.proc, self.out = comp.launch("--incremental", *options, *programs["mem_phases"],
                                          str(mib), str(percent), str(self.control),
                                          *(["scatter"] if scatter else []), env=env)
        wait_for(lambda: "ready" in self.text(), what="the program to fill its memory")
        comp.wait_peers(1)

    def text(self) -> str:
        return self.out.read_text() if self.out.exists() else ""

    def send(self, cmd: str) -> int:
        self.seq += 1000  # above any seq an older generation saw
        tmp = self.control.with_name("control.tmp")
        tmp.write_text(f"{self.seq} {cmd}\n")
        os.replace(tmp, self.control)
        return self.seq

    def write(self) -> None:
        seq = self.send("w")
        wait_for(lambda: f"wrote {seq} " in self.text(), what="the program to write")
        self.send("n")  # a no-op: an older generation restarted must not write again

    def check(self, out: Path) -> str:
        """The program's own check of every word of its memory."""
        seq = self.send("c")
        line = wait_for(lambda: next((ln for ln in _lines(out) if ln.startswith(f"check {seq} ")),
                                     None), what="the program's check")
        return line.split(" ", 2)[2]


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def restart(comp, image: Path, generation: int | None = None, *options: str):
    argv = [tool("dmtcp-restart"), "--join", "-p", str(comp.port), *options]
    if generation is not None:
        argv += ["--generation", str(generation)]
    proc, out = comp._start("restart", [*argv, str(image)])
    comp.wait_peers(1)
    return proc, out


def new_bytes(newer: Path, older: Path) -> int:
    """Bytes in newer's files that are not older's files (hard links)."""
    old = {p.stat().st_ino for p in older.iterdir()}
    return sum(p.stat().st_size for p in newer.iterdir() if p.stat().st_ino not in old)


def pages_bytes(image: Path) -> int:
    m = json.loads((image / "manifest.json").read_text())
    return sum(int(m["data"][name][i][0]) for order in m["pages"].values() for name, i in order)


@pytest.fixture
def two_generations(comp, programs, tmp_path):
    """Generation 1 (phase 0), then 5% of the memory rewritten (phase 1),
    generation 2; the program killed."""
    prog = MemProgram(comp, programs, tmp_path)
    comp.checkpoint()
    prog.write()
    comp.checkpoint()
    comp.kill_and_wait(prog.proc)
    image = comp.images()[0]
    return prog, image, image.with_name(image.name + ".gen-1")


def test_the_second_generation_writes_only_what_changed(two_generations):
    _, newest, previous = two_generations
    m2 = json.loads((newest / "manifest.json").read_text())
    m1 = json.loads((previous / "manifest.json").read_text())
    assert (m1["generation"], m2["generation"]) == (1, 2)
    total = pages_bytes(newest)
    assert total >= MIB << 20
    written = new_bytes(newest, previous)
    # 5% changed: at most 10% of the bytes are new files, the rest is linked
    assert written <= total // 10, (written, total)
    shared = set(m1["data"]) & set(m2["data"])
    assert shared and all((newest / n).stat().st_ino == (previous / n).stat().st_ino
                          for n in shared)
    # every file of the generation is listed and checksummed, as before
    files = {p.name for p in newest.iterdir() if p.name != "manifest.json"}
    assert set(m2["files"]) == files == set(m2["blake3"])


def _dumped_bytes(out: str) -> int:
    """The bytes CRIU dumped, as `dmtcp-command -bc` says them."""
    return int(out.split(" bytes")[0].rsplit(" ", 1)[1])


def test_written_pages_only_are_dumped_generation_after_generation(comp, programs, tmp_path):
    """With write tracking (agent/tracking.py) CRIU dumps only the pages
    written since the previous generation, which are its parent; each
    generation is made whole again, so a chain of them restarts, and the
    program restarted from the third finds every word of its memory."""
    prog = MemProgram(comp, programs, tmp_path)
    full = _dumped_bytes(comp.checkpoint())
    assert full >= MIB << 20
    for generation in (2, 3):
        prog.write()
        dumped = _dumped_bytes(comp.checkpoint())
        assert dumped <= full // 10, (generation, dumped, full)
    comp.kill_and_wait(prog.proc)
    newest = comp.images()[0]
    m = json.loads((newest / "manifest.json").read_text())
    assert m["generation"] == 3
    assert not (newest / "parent").exists(), "CRIU's link to the parent was left in the image"
    assert new_bytes(newest, newest.with_name(newest.name + ".gen-2")) <= pages_bytes(newest) // 10
    proc, out = restart(comp, newest)
    assert prog.check(out) == "ok 2"
    comp.kill_and_wait(proc)


def test_a_generation_replaced_after_it_was_read_ahead_is_read_again(comp, programs, tmp_path):
    """Once a round is over the agent reads the published generation for
    the next dump (images.previous).  Replaced meanwhile (here by the
    generation before it, moved into its place), what was read is not
    taken: the dump reads the generation that is there, finds that its
    dump did not protect the pages, and writes every page; restarted, the
    program finds every word of its memory."""
    prog = MemProgram(comp, programs, tmp_path, env={**os.environ, "DMTCP_LOG_LEVEL": "DEBUG"})
    comp.checkpoint()
    prog.write()
    comp.checkpoint()
    wait_for(lambda: "generation 2 read for the next dump" in agent_log(comp),
             what="the agent to read generation 2 ahead")
    newest = comp.images()[0]
    older, aside = newest.with_name(newest.name + ".gen-1"), tmp_path / "aside"
    os.rename(newest, aside)
    os.rename(older, newest)
    os.rename(aside, older)
    prog.write()
    assert _dumped_bytes(comp.checkpoint()) >= MIB << 20
    comp.kill_and_wait(prog.proc)
    proc, out = restart(comp, comp.images()[0])
    assert prog.check(out) == "ok 2"
    comp.kill_and_wait(proc)


def test_scattered_writes_put_every_chunk_together(comp, programs, tmp_path):
    """A word written in one page of every twenty: CRIU's tracked dump is
    pages of every chunk, none whole, so each chunk is put together from
    them and the parent's data files (CRIU's file is not kept as a data
    file: most of it would be bytes of no chunk); the third generation
    restarts with every word."""
    prog = MemProgram(comp, programs, tmp_path, scatter=True)
    full = _dumped_bytes(comp.checkpoint())
    for _ in (2, 3):
        prog.write()
        assert _dumped_bytes(comp.checkpoint()) <= full // 10
    comp.kill_and_wait(prog.proc)
    newest = comp.images()[0]
    # every chunk changed: the generation holds all of its memory anew
    assert new_bytes(newest, newest.with_name(newest.name + ".gen-2")) >= pages_bytes(newest)
    proc, out = restart(comp, newest)
    assert prog.check(out) == "ok 2"
    comp.kill_and_wait(proc)


def test_a_damaged_parent_is_not_taken_into_the_next_generation(comp, programs, tmp_path):
    """Bytes of the published generation's data file went bad before the
    next checkpoint, which must put its chunks together from them: that
    checkpoint fails in one line, naming the damage, rather than taking
    them under new digests; the published generation stays; the next
    checkpoint is whole, shares nothing with it, and restarts."""
    prog = MemProgram(comp, programs, tmp_path, scatter=True)
    comp.checkpoint()
    image = comp.images()[0]
    m = json.loads((image / "manifest.json").read_text())
    biggest = max(m["data"], key=lambda name: (image / name).stat().st_size)
    with open(image / biggest, "r+b") as f:  # (same size: no check of sizes sees it)
        middle = (image / biggest).stat().st_size // 2
        f.seek(middle)
        flipped = bytes(b ^ 0xFF for b in f.read(8))  # (never the bytes it had)
        f.seek(middle)
        f.write(flipped)
    prog.write()
    res = comp.command("-bc", check=False)
    assert res.returncode != 0
    assert "damaged" in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert json.loads((image / "manifest.json").read_text())["generation"] == 1
    assert _dumped_bytes(comp.checkpoint()) >= MIB << 20  # whole: no parent to trust
    newest = comp.images()[0]
    assert new_bytes(newest, newest.with_name(newest.name + ".gen-1")) >= MIB << 20
    comp.kill_and_wait(prog.proc)
    proc, out = restart(comp, newest)
    assert prog.check(out) == "ok 1"
    comp.kill_and_wait(proc)


def test_the_newest_and_the_previous_generation_both_restart(comp, two_generations):
    prog, newest, _ = two_generations
    proc, out = restart(comp, newest)
    assert prog.check(out) == "ok 1"
    comp.kill_and_wait(proc)
    proc, out = restart(comp, newest, generation=1)
    assert prog.check(out) == "ok 0"
    comp.kill_and_wait(proc)
    assert not list(comp.ckptdir.glob(".*restore*")), "the view was left behind"
    assert not list(Path("/dev/shm").glob(f".{newest.name}.restore-*"))


def test_a_restart_reads_the_shared_chunks_where_they_are(two_generations):
    """The view CRIU restores from holds the data files themselves, a level
    each (parent images), and copies no page."""
    from dmtcp_py.images import chunks, manifest

    _, newest, _ = two_generations
    m = manifest.load(newest)
    with chunks.readable(newest, m) as view:
        assert (view / "parent").is_dir()
        files = [p for p in view.rglob("*") if p.is_file()]
        copied = [p for p in files if p.stat().st_nlink == 1 and p.stat().st_size > 64 << 10]
        assert copied == []
        data = {(newest / name).stat().st_ino for name in m.data}
        assert data == {p.stat().st_ino for p in files} & data
    wait_for(lambda: not view.exists(), what="the view's removal")


def test_a_lazy_restart_of_an_incremental_generation(comp, two_generations):
    prog, newest, _ = two_generations
    proc, out = restart(comp, newest, None, "--lazy")
    assert prog.check(out) == "ok 1"
    comp.kill_and_wait(proc)


def test_a_damaged_shared_chunk_is_caught_in_one_line(comp, two_generations):
    _, newest, previous = two_generations
    m2 = json.loads((newest / "manifest.json").read_text())
    shared = [n for n in m2["data"] if (previous / n).exists()
              and (previous / n).stat().st_ino == (newest / n).stat().st_ino]
    target = max((previous / n for n in shared), key=lambda p: p.stat().st_size)
    fd = os.open(target, os.O_RDWR)
    try:  # in place: the one inode both generations hold
        at = target.stat().st_size * 3 // 4
        byte = os.pread(fd, 1, at)
        os.pwrite(fd, bytes([byte[0] ^ 0x10]), at)
    finally:
        os.close(fd)
    for generation in (None, 1):
        argv = [tool("dmtcp-restart"), "-p", str(comp.port)]
        argv += ["--generation", str(generation)] if generation else []
        res = subprocess.run([*argv, str(newest)], stdin=subprocess.DEVNULL,
                             capture_output=True, text=True, timeout=TIMEOUT)
        assert res.returncode != 0
        assert res.stderr.count("\n") == 1 and target.name in res.stderr \
            and "checksum" in res.stderr, res.stderr
        wait_for(lambda: comp.status()["num_peers"] == 0, what="no restored process")


@pytest.mark.parametrize("how", ["coordinator", "environment"])
def test_keep_n_prunes_and_the_kept_ones_restart(tmp_path, programs, how):
    from tests.conftest import kill_descendants
    from tests.e2e.conftest import need_root
    from tests.e2e.harness import Computation
    need_root()
    comp = Computation(tmp_path, *(["--keep", "2"] if how == "coordinator" else []))
    try:
        env = {**os.environ, "DMTCP_KEEP": "2"} if how == "environment" else None
        prog = MemProgram(comp, programs, tmp_path, env=env)
        for n in range(4):  # generation n+1 holds phase n
            if n:
                prog.write()
            comp.checkpoint()
        newest = comp.images()[0]
        kept = sorted(p.name for p in comp.ckptdir.glob(newest.name + ".gen-*"))
        assert kept == [f"{newest.name}.gen-2", f"{newest.name}.gen-3"]
        # (deleted after the checkpoint's reply)
        wait_for(lambda: not list(comp.ckptdir.glob(".*expired*")), what="generation 1 deleted")
        comp.kill_and_wait(prog.proc)
        # generation 1, whose data files generation 2 shares, is gone
        proc, out = restart(comp, newest, generation=2)
        assert prog.check(out) == "ok 1"
        comp.kill_and_wait(proc)
    finally:
        comp.close()
        kill_descendants()


def test_gzip_generations_are_whole_and_restart(comp, programs, tmp_path):
    prog = MemProgram(comp, programs, tmp_path, "--gzip")
    comp.checkpoint()
    prog.write()
    comp.checkpoint()
    comp.kill_and_wait(prog.proc)
    newest = comp.images()[0]
    m = json.loads((newest / "manifest.json").read_text())
    assert m["compression"] == "zstd" and not m["data"] and not m["pages"]
    proc, out = restart(comp, newest)
    assert prog.check(out) == "ok 1"
    comp.kill_and_wait(proc)


def test_inspect_shows_the_chunks_and_what_is_shared(two_generations):
    _, newest, _ = two_generations
    out = subprocess.run([tool("dmtcp-inspect"), "--json", str(newest)], capture_output=True,
                         text=True, timeout=TIMEOUT)
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    info = info[0] if isinstance(info, list) else info
    assert info["memory_bytes"] == pages_bytes(newest) and info["chunks"] > 0
    assert info["shared_bytes"] >= info["memory_bytes"] * 9 // 10


def test_without_incremental_every_generation_is_whole(comp, programs, tmp_path):
    """Incremental generations are asked for (--incremental): by default a
    restart never has page files to put together."""
    control = tmp_path / "control"
    proc, out = comp.launch(*programs["mem_phases"], str(MIB), str(PERCENT), str(control))
    wait_for(lambda: "ready" in out.read_text(), what="the program to fill its memory")
    comp.wait_peers(1)
    comp.checkpoint()
    comp.checkpoint()
    m = json.loads((comp.images()[0] / "manifest.json").read_text())
    assert m["generation"] == 2 and not m["data"] and not m["pages"]
    comp.kill_and_wait(proc)
