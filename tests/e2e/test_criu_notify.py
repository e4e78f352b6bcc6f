"""The agent listens for its shims again at CRIU's post-dump notification
(tree_work._dump): that is only safe if CRIU calls it once every image is
written and while the tree is still frozen, so that no process can
connect before its fds were dumped.  Real CRIU, a real process."""
from __future__ import annotations

import subprocess

from dmtcp_py import procfs
from dmtcp_py.agent import criu_driver
from tests.conftest import need_root


def _state(pid: int) -> str:
    stat = procfs.read(f"/proc/{pid}/stat") or ""
    return stat.rpartition(")")[2].split()[0] if ")" in stat else "?"


def test_post_dump_comes_with_the_images_written_and_the_tree_still_frozen(tmp_path):
    need_root()
    images = tmp_path / "images"
    images.mkdir()
    seen: list[tuple[str, list[str]]] = []

    def dumped() -> None:
        seen.append((_state(proc.pid), sorted(p.name for p in images.iterdir())))

    proc = subprocess.Popen(["sleep", "60"], start_new_session=True, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        criu_driver.dump(proc.pid, images, tmp_path / "criu-dump.log", leave_running=True,
                         external=[], on_dumped=dumped)
        assert len(seen) == 1, seen
        state, names = seen[0]
        assert state == "t", f"the process ran before CRIU let it go: state {state}"
        assert "pstree.img" in names and "files.img" in names, names
        assert any(n.startswith("pages-") for n in names), names
        assert proc.poll() is None and _state(proc.pid) != "t"  # let go, running on
    finally:
        proc.kill()
        proc.wait()
