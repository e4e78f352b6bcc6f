"""Images are trusted only as published: every file has a digest in the
manifest, checked before the program runs again (the memory pages while
CRIU restores them into processes that stay stopped, the rest before the
restart writes or starts anything); an image another user owns is refused
unless --any-owner says otherwise."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.e2e.harness import TIMEOUT, last_tick, tool, wait_for


@pytest.fixture
def image(comp, programs):
    proc, out = comp.launch(*programs["counter_single"], "100000", "10")
    comp.wait_peers(1)
    wait_for(lambda: last_tick(out) >= 3, what="ticks")
    comp.checkpoint()
    comp.kill_and_wait(proc)
    return comp.images()[0]


def _restart(comp, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([tool("dmtcp-restart"), "-p", str(comp.port), *args],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=TIMEOUT)


def test_every_file_has_a_checksum(image):
    m = json.loads((image / "manifest.json").read_text())
    files = {p.name for p in image.iterdir() if p.name != "manifest.json"}
    assert set(m["xxh3"]) == files and all(len(d) == 32 for d in m["xxh3"].values())
    assert not m["blake3"] and not m["sha256"]  # the digests of images before XXH3


@pytest.mark.parametrize("victim", ["pages", "core"])
def test_a_flipped_byte_is_named_and_nothing_starts(comp, image, victim):
    target = max(image.glob(f"{victim}-*.img"), key=lambda p: p.stat().st_size)
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))
    res = _restart(comp, str(image))
    assert res.returncode != 0
    assert res.stderr.count("\n") == 1 and target.name in res.stderr, res.stderr
    assert res.stdout == "" and comp.status()["num_peers"] == 0


def test_damaged_pages_of_one_tree_stop_the_whole_restart(comp, programs, tmp_path):
    """Two trees restarted together, one with a damaged page image: neither
    program runs again, and the error names the file."""
    procs = []
    for n in range(2):
        proc, out = comp.launch(*programs["counter_single"], "100000", "10")
        procs.append((proc, out))
    comp.wait_peers(2)
    wait_for(lambda: all(last_tick(out) >= 3 for _, out in procs), what="ticks")
    comp.checkpoint()
    comp.command("-k")
    for proc, _ in procs:
        proc.wait(timeout=TIMEOUT)
    images = comp.images()
    res = _restart_damaged(comp, images,
                           max(images[0].glob("pages-*.img"), key=lambda p: p.stat().st_size))
    assert res.stdout == ""  # no tick from either program


def test_damaged_pages_of_a_small_tree_end_the_restore_of_a_big_one(comp, programs, tmp_path):
    """The small tree's damage is found while CRIU still restores the big
    one: the big one's restore is ended too, and the restart exits (it hung
    when its tree was killed under CRIU's ptrace: a zombie nobody reaped)."""
    control = tmp_path / "control"
    control.write_text("")
    # (the small one's restore and check end while CRIU fills the big one)
    small, _ = comp.launch(*programs["mem_phases"], "64", "0", str(control))
    big, _ = comp.launch(*programs["mem_phases"], "512", "0", str(control))
    comp.wait_peers(2)
    comp.checkpoint()
    comp.command("-k")
    for proc in (small, big):
        proc.wait(timeout=TIMEOUT)
    images = comp.images()
    _restart_damaged(comp, images, min(
        (max(i.glob("pages-*.img"), key=lambda p: p.stat().st_size) for i in images),
        key=lambda p: p.stat().st_size))


def _restart_damaged(comp, images: list, target) -> subprocess.CompletedProcess:
    """Flip a bit of target, restart every image together: the restart
    fails naming target, and no restored process is left."""
    data = bytearray(target.read_bytes())
    data[len(data) // 3] ^= 0x80
    target.write_bytes(bytes(data))
    res = _restart(comp, *map(str, images))
    assert res.returncode != 0
    assert target.name in res.stderr and "Traceback" not in res.stderr, res.stderr
    wait_for(lambda: comp.status()["num_peers"] == 0, what="every restored process to go")
    return res


def test_another_users_image_is_refused_unless_told(comp, image):
    os.chown(image / "manifest.json", 65534, 65534)
    res = _restart(comp, str(image))
    assert res.returncode != 0 and "belongs to" in res.stderr and "--any-owner" in res.stderr
    assert comp.status()["num_peers"] == 0
    # told otherwise, it restarts, and the program runs under control again
    with open(comp.root / "any-owner.err", "w") as err:
        restarted = subprocess.Popen([tool("dmtcp-restart"), "-p", str(comp.port), "--any-owner",
                                      str(image)], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=err)
    try:
        wait_for(lambda: comp.status()["num_peers"] == 1 or restarted.poll() is not None,
                 what="the restored program")
        assert restarted.poll() is None, (comp.root / "any-owner.err").read_text()
    finally:
        comp.command("-k", check=False)
        restarted.wait(timeout=TIMEOUT)
