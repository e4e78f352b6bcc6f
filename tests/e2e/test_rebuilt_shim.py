"""An image made before the shim was rebuilt still restarts: the image maps
the shim and the tree's init by the name of the very file they were loaded
from, and a build never overwrites a file a previous build made
(hijack/keep.sh keeps each as kept/NAME-<digest>; NAME links to the newest)."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from dmtcp_py.paths import shim_library
from tests.conftest import need_root
from tests.e2e.harness import Computation, last_tick, wait_for
from tests.e2e.test_cycle import assert_continues, checkpoint_and_kill

KEEP = Path(__file__).resolve().parents[2] / "hijack" / "keep.sh"


def keep(new: Path, link: Path) -> None:
    subprocess.run(["sh", str(KEEP), str(new), str(link)], check=True)


def test_keep_never_overwrites_a_build(tmp_path):
    link = tmp_path / "libx.so"
    for content in (b"first", b"second", b"first"):
        (tmp_path / "new").write_bytes(content)
        keep(tmp_path / "new", link)
        assert link.read_bytes() == content and os.path.islink(link)
    kept = sorted(p.read_bytes() for p in (tmp_path / "kept").iterdir())
    assert kept == [b"first", b"second"]
    assert not (tmp_path / "new").exists()


def test_an_image_restarts_after_the_shim_is_rebuilt(tmp_path, programs, no_strays):
    need_root()
    build = tmp_path / "build"
    build.mkdir()
    ours = Path(shim_library()).parent
    for name in ("libdmtcphijack.so", "dmtcp_tree_init"):
        shutil.copyfile(ours / name, tmp_path / "new")
        os.chmod(tmp_path / "new", 0o755)
        keep(tmp_path / "new", build / name)
    env = {**os.environ, "DMTCP_HIJACK_LIB": str(build / "libdmtcphijack.so")}
    (tmp_path / "run").mkdir()
    comp = Computation(tmp_path / "run")
    try:
        proc, out = comp.launch(*programs["counter_single"], "400", "10", env=env)
        before, killed = checkpoint_and_kill(comp, proc, out)
        # the rebuild: another shim takes the name (the same code and a byte
        # more, which the loader ignores)
        (tmp_path / "new").write_bytes((build / "libdmtcphijack.so").read_bytes() + b"\0")
        keep(tmp_path / "new", build / "libdmtcphijack.so")
        restarted, out2 = comp.restart()
        assert restarted.wait(timeout=60) == 0, (out2.with_suffix(".err")).read_text()
        wait_for(lambda: last_tick(out2) >= 0, what="the restarted program's output")
        assert_continues(out2, before, killed, "counter_single")
    finally:
        comp.close()
