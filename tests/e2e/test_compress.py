"""--gzip / DMTCP_GZIP: the memory pages of the images are compressed (zstd),
restart reads them, and a damaged compressed file stops the restart in one
line before anything starts."""
from __future__ import annotations

import json
import os

import pytest

from tests.e2e.harness import TIMEOUT, last_tick, wait_for
from tests.e2e.test_cycle import assert_continues, checkpoint_and_kill

TICKS, INTERVAL_MS = 400, 10


@pytest.mark.parametrize("how", ["option", "environment"])
def test_compressed_images_restart(comp, programs, how):
    option = ["--gzip"] if how == "option" else []
    env = {**os.environ, "DMTCP_GZIP": "1"} if how == "environment" else None
    proc, out = comp.launch(*option, *programs["counter_single"], str(TICKS), str(INTERVAL_MS),
                            env=env)
    comp.wait_peers(1)
    before, killed = checkpoint_and_kill(comp, proc, out)
    image = comp.images()[0]
    names = [p.name for p in image.iterdir()]
    assert any(n.startswith("pages-") and n.endswith(".img.zst") for n in names), names
    assert not any(n.startswith("pages-") and n.endswith(".img") for n in names), names
    assert json.loads((image / "manifest.json").read_text())["compression"] == "zstd"
    restarted, rout = comp.restart()
    assert restarted.wait(timeout=TIMEOUT) == 0, restarted.err_path.read_text()
    assert_continues(rout, before, killed, "counter_single")
    assert not list(comp.ckptdir.glob(".*restore*")), "the decompressed view was left behind"


def test_without_gzip_pages_are_plain(comp, programs):
    proc, out = comp.launch("--no-gzip", *programs["counter_single"], "100000", "10",
                            env={**os.environ, "DMTCP_GZIP": "1"})
    comp.wait_peers(1)
    wait_for(lambda: last_tick(out) >= 3, what="ticks")
    comp.checkpoint()
    names = [p.name for p in comp.images()[0].iterdir()]
    assert any(n.startswith("pages-") and n.endswith(".img") for n in names), names
    comp.kill_and_wait(proc)


def test_a_damaged_compressed_image_is_refused_in_one_line(comp, programs):
    proc, out = comp.launch("--gzip", *programs["counter_single"], "100000", "10")
    comp.wait_peers(1)
    wait_for(lambda: last_tick(out) >= 3, what="ticks")
    comp.checkpoint()
    comp.kill_and_wait(proc)
    image = comp.images()[0]
    packed = max(image.glob("pages-*.img.zst"), key=lambda p: p.stat().st_size)
    data = bytearray(packed.read_bytes())
    for i in range(8, len(data), 7):  # same size, scrambled frames
        data[i] ^= 0x5A
    packed.write_bytes(bytes(data))
    # the image's checksums catch it first ...
    restarted, rout = comp.restart()
    assert restarted.wait(timeout=TIMEOUT) != 0
    err = restarted.err_path.read_text()
    errors = [line for line in err.splitlines() if "error" in line]
    assert len(errors) == 1 and packed.name in errors[0] and "checksum" in errors[0], err
    # ... and without them (an image from before checksums), zstd's own
    manifest = image / "manifest.json"
    m = json.loads(manifest.read_text())
    del m["xxh3"]
    manifest.write_text(json.dumps(m))
    restarted, rout = comp.restart()
    assert restarted.wait(timeout=TIMEOUT) != 0
    err = restarted.err_path.read_text()
    errors = [line for line in err.splitlines() if "error" in line]
    assert len(errors) == 1 and "corrupt" in errors[0] and "Traceback" not in err, err
    assert last_tick(rout) == 0, "a restart from a damaged image ran the program"
    assert not list(comp.ckptdir.glob(".*restore*"))
