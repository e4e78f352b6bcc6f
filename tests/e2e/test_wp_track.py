"""Our CRIU tells the pages a process wrote since its last dump by
userfaultfd write-protection (scripts/criu-patches/0004, agent/tracking.py).

A program makes its userfaultfd and hands it over, as the shim does to its
agent; the test registers the program's ranges through it (tracking.register)
and dumps the program twice with CRIU_UFFD_WP_TRACK, the second time with
the first as its parent, after the program rewrote 1 MiB of its 16.  The
second dump writes about that MiB and leaves the rest in the parent; the
program restored from it has every byte it had (its checksum).  Without
the registration nothing is left out: the second dump writes everything.
"""
from __future__ import annotations

import array
import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pycriu
import pytest

from dmtcp_py.agent import tracking
from dmtcp_py.paths import criu_binary
from tests.conftest import need_root
from tests.e2e.harness import wait_for

MIB = 16
PAGE = 4096


def _receive_uffd(listener: socket.socket) -> int:
    conn, _ = listener.accept()
    with conn:
        _, ancillary, _, _ = conn.recvmsg(1, socket.CMSG_SPACE(4))
        fds = array.array("i")
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(data[:4])
        conn.sendall(b"k")
    assert len(fds) == 1, "the program handed over no userfaultfd"
    return fds[0]


def _criu(*args: str, cwd: Path) -> None:
    env = {**os.environ, tracking.CRIU_ENV: "1"}
    done = subprocess.run([criu_binary(), *args, "--shell-job", "-o", "criu.log", "-v2"],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    log = next(cwd.rglob("criu.log"), None)
    assert done.returncode == 0, (args, log.read_text()[-3000:] if log else done.stderr)


def _dump(pid: int, images: Path, parent: Path | None = None) -> dict:
    images.mkdir()
    extra = ["--prev-images-dir", f"../{parent.name}"] if parent else []
    _criu("dump", "-t", str(pid), "-D", str(images), "--leave-running", "--track-mem", *extra,
          cwd=images)
    with open(images / "stats-dump", "rb") as f:
        return pycriu.images.load(f)["entries"][0]["dump"]


def _sums(out: Path) -> list[str]:
    return out.read_text().split() if out.exists() else []


def _checksum(pid: int, out: Path) -> str:
    before = len(_sums(out))
    os.kill(pid, signal.SIGUSR2)
    wait_for(lambda: len(_sums(out)) > before, 10, "the program's checksum")
    return _sums(out)[-1]


@contextmanager
def _tracked_program(programs, tmp_path: Path) -> Iterator[tuple[subprocess.Popen, int, Path]]:
    """wp_track running, its userfaultfd handed over: (the process, the
    userfaultfd, the file of its checksums); both gone at the end."""
    need_root()
    sock, out = tmp_path / "uffd.sock", tmp_path / "sums"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(sock))
    listener.listen(1)
    listener.settimeout(20)
    proc = subprocess.Popen([*programs["wp_track"], str(sock), str(out), str(MIB)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    uffd = -1
    try:
        uffd = _receive_uffd(listener)
        yield proc, uffd, out
    finally:
        tracking.close(uffd)
        listener.close()
        proc.kill()
        proc.wait(timeout=10)


@pytest.mark.parametrize("registered", [True, False], ids=["registered", "unregistered"])
def test_second_dump_writes_only_written_pages(programs, tmp_path, registered):
    restored = 0
    with _tracked_program(programs, tmp_path) as (proc, uffd, out):
        try:
            if registered:
                assert tracking.register(uffd, proc.pid) >= 1
            first = _dump(proc.pid, tmp_path / "d1")
            assert first["pages_written"] >= MIB * 256
            os.kill(proc.pid, signal.SIGUSR1)  # rewrites 1 MiB (before the checksum)
            expected = _checksum(proc.pid, out)
            if registered:
                tracking.register(uffd, proc.pid)
            second = _dump(proc.pid, tmp_path / "d2", parent=tmp_path / "d1")
            if registered:
                assert second["pages_written"] < 2 * 256, second  # 1 MiB and some stack
                assert second["pages_skipped_parent"] >= (MIB - 1) * 256, second
            else:
                assert second["pages_written"] >= MIB * 256, second
            proc.kill()
            proc.wait(timeout=10)
            _criu("restore", "-D", str(tmp_path / "d2"), "-d", "--pidfile",
                  str(tmp_path / "pid"), cwd=tmp_path / "d2")
            restored = int((tmp_path / "pid").read_text())
            assert _checksum(restored, out) == expected
        finally:
            if restored:
                try:
                    os.kill(restored, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                wait_for(lambda: not Path(f"/proc/{restored}").exists()
                         or "Z" in Path(f"/proc/{restored}/stat").read_text().split()[2], 10,
                         "the restored program to end")


def test_the_bytes_written_since_the_last_dump_are_counted_without_stopping_it(programs,
                                                                               tmp_path):
    """tracking.written_bytes (what decides whether a pre-copy is worth its
    pass): of the tracked memory, all before the registration, the few
    pages the program touches after a tracked dump, that MiB more after it
    rewrote 1 MiB; asked to stop early, it does."""
    with _tracked_program(programs, tmp_path) as (proc, uffd, out):
        assert tracking.written_bytes(proc.pid, 1 << 40) >= MIB << 20  # (nothing protected)
        assert tracking.register(uffd, proc.pid) >= 1
        _dump(proc.pid, tmp_path / "d1")  # (protects what it dumped)
        quiet = tracking.written_bytes(proc.pid, 1 << 40)
        assert quiet < 256 << 10, quiet
        os.kill(proc.pid, signal.SIGUSR1)  # rewrites 1 MiB
        _checksum(proc.pid, out)
        written = tracking.written_bytes(proc.pid, 1 << 40)
        assert 1 << 20 <= written - quiet < 2 << 20, (written, quiet)
        assert tracking.written_bytes(proc.pid, PAGE) < written
