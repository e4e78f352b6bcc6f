"""The agent listens for its shims again at CRIU's post-dump notification
(tree_work._dump): that is only safe if CRIU calls it once every image is
written and while the tree is still frozen, so that no process can
connect before its fds were dumped.  Real CRIU, a real process."""
from __future__ import annotations

import subprocess

import pytest

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


def test_the_hooks_come_before_the_seizing_and_before_any_process_is_read(tmp_path):
    """tree_work._dump lets CRIU start while the shims detach, holding it
    at before_seizing until they did, and reads the tree's files while
    CRIU seizes it, holding it at on_seized until they are read: the first
    must come before any process is stopped, the second with the tree
    stopped but nothing of it written yet."""
    need_root()
    images = tmp_path / "images"
    images.mkdir()
    seen: list[tuple[str, str, list[str]]] = []

    def look(point: str) -> None:
        seen.append((point, _state(proc.pid), sorted(p.name for p in images.iterdir())))

    proc = subprocess.Popen(["sleep", "60"], start_new_session=True, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        criu_driver.dump(proc.pid, images, tmp_path / "criu-dump.log", leave_running=True,
                         external=[], before_seizing=lambda: look("before"),
                         on_seized=lambda: look("seized"), on_dumped=lambda: look("dumped"))
        assert [point for point, _, _ in seen] == ["before", "seized", "dumped"], seen
        (_, before, _), (_, seized, written), _ = seen
        assert before == "S", f"stopped before CRIU was let through: state {before}"
        assert seized == "t", f"not stopped when CRIU said it seized the tree: state {seized}"
        assert not [n for n in written if n.startswith(("core-", "pages-", "mm-"))], written
        assert proc.poll() is None and _state(proc.pid) != "t"
    finally:
        proc.kill()
        proc.wait()


def test_a_hook_that_fails_ends_the_dump_and_lets_the_tree_go(tmp_path):
    need_root()
    images = tmp_path / "images"
    images.mkdir()

    def refuse() -> None:
        raise criu_driver.CriuError("the files could not be read")

    proc = subprocess.Popen(["sleep", "60"], start_new_session=True, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with pytest.raises(criu_driver.CriuError, match="the files could not be read"):
            criu_driver.dump(proc.pid, images, tmp_path / "criu-dump.log", leave_running=True,
                             external=[], on_seized=refuse)
        assert proc.poll() is None and _state(proc.pid) == "S"  # let go, running on
        assert not (images / "pstree.img").exists()
    finally:
        proc.kill()
        proc.wait()
