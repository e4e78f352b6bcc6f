"""Bad input: one clear line on stderr, a non-zero exit, no traceback, and
nothing started or damaged."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess

import psutil
import pytest

from dmtcp_py import fault_injection
from tests.conftest import need_root
from tests.e2e.harness import TIMEOUT, running_program, stream_images, tool, wait_for


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def one_line_error(argv: list[str], expect: str, env: dict | None = None
                   ) -> subprocess.CompletedProcess:
    res = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                         timeout=TIMEOUT, env=env)
    assert res.returncode != 0, res
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert "Traceback" not in res.stderr
    assert expect in lines[0], lines[0]
    return res


@pytest.fixture(scope="module")
def good_image(tmp_path_factory, programs):
    """A real checkpoint image of a small program, for damaging copies of."""
    need_root()
    with running_program(tmp_path_factory.mktemp("image"),
                         [*programs["counter_single"], "100000", "20"]) as (comp, proc):
        comp.checkpoint()
        comp.kill_and_wait(proc)
        [image] = comp.images()
        yield image


def damaged_copy(image, tmp_path, damage) -> str:
    copy = tmp_path / image.name
    shutil.copytree(image, copy)
    damage(copy)
    return str(copy)


def test_restart_missing_image(tmp_path, no_strays):
    port = free_port()
    one_line_error([tool("dmtcp-restart"), "-p", str(port), str(tmp_path / "ckpt_x_1.dmtcp")],
                   "no checkpoint image")
    assert not listening(port)  # the coordinator it started is gone with it


def _truncate_pages(copy):
    pages = max(copy.glob("pages-*.img"), key=lambda p: p.stat().st_size)
    with open(pages, "r+b") as f:
        f.truncate(pages.stat().st_size // 2)


def _corrupt_manifest(copy):
    (copy / "manifest.json").write_text('{"format": 1, "comp_id": ')


def _drop_manifest(copy):
    (copy / "manifest.json").unlink()


@pytest.mark.parametrize("generation", [None, "1"], ids=["newest", "--generation 1"])
@pytest.mark.parametrize("damage, expect", [
    (_truncate_pages, "truncated"),
    (_corrupt_manifest, "corrupt"),
    (_drop_manifest, "not a complete checkpoint image"),
])
def test_restart_damaged_image(good_image, tmp_path, no_strays, damage, expect, generation):
    """The restart script names its generation (--generation N): the same
    damage is named either way."""
    port = free_port()
    one_line_error([tool("dmtcp-restart"), "-p", str(port),
                    *(["--generation", generation] if generation else []),
                    damaged_copy(good_image, tmp_path, damage)], expect)
    assert not listening(port)


def test_lazy_restart_of_truncated_pages(good_image, tmp_path, no_strays):
    """Restoring lazily, the pages are checked once the tree is back: a
    failure of CRIU's is still explained by them."""
    port = free_port()
    one_line_error([tool("dmtcp-restart"), "--lazy", "-p", str(port),
                    damaged_copy(good_image, tmp_path, _truncate_pages)], "truncated")
    assert not listening(port)


def _running(program: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/exe") == program:
                found.append(int(pid))
        except OSError:
            pass
    return found


def test_restart_whose_coordinator_cannot_start_leaves_nothing(good_image, programs, no_strays):
    """The port is taken (bound, not listening: nothing answers on it) and
    the coordinator the restart starts there fails, after CRIU began to
    restore the tree beside it: the restored tree ends before it ran."""
    program = os.path.realpath(programs["counter_single"][0])
    assert not _running(program)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        port = busy.getsockname()[1]
        one_line_error([tool("dmtcp-restart"), "-p", str(port), str(good_image)],
                       "already in use")
    assert not _running(program)


def test_restart_of_one_end_of_a_connection_says_what_is_missing(comp, programs, tmp_path):
    """A server and its client checkpointed, then only the client's image
    restarted: its connection's other end never comes back.  The restart
    ends in one line that says so and what to do (after the wait for the
    peer, shortened here), the restored client does not run on, and the
    images are as they were: restarted together, both go on to the end
    of their stream."""
    port = free_port()
    images = stream_images(comp, programs, port, "200", 10)
    [alone] = [i for i in images if json.loads((i / "manifest.json").read_text())["argv"][1]
               == "client"]
    before = {p: p.stat().st_mtime_ns for i in images for p in i.iterdir()}
    one_line_error([tool("dmtcp-restart"), "--new-coordinator", "-p", str(free_port()),
                    str(alone)], "did not come back within 2 s",
                   env={**os.environ, fault_injection.CONNECT_TIMEOUT_ENV: "2"})
    wait_for(lambda: not [p for p in psutil.process_iter(["cmdline"])
                          if str(port) in (p.info["cmdline"] or [])],
             what="the restored client to end")
    assert {p: p.stat().st_mtime_ns for i in images for p in i.iterdir()} == before
    out = tmp_path / "both.out"
    with open(out, "w") as o:
        both = subprocess.run([tool("dmtcp-restart"), "--join", "-p", str(comp.port),
                               *map(str, images)], stdout=o, stderr=subprocess.PIPE,
                              text=True, timeout=TIMEOUT)
    assert both.returncode == 0, both.stderr
    assert sorted(line.split()[2] for line in out.read_text().splitlines()
                  if line.startswith("done")) == ["client", "server"]


def test_launch_missing_program(no_strays):
    port = free_port()
    res = one_line_error([tool("dmtcp-launch"), "-p", str(port), "no-such-program-xyz"],
                         "not found")
    assert res.returncode == 127
    assert not listening(port)


def test_launch_join_without_coordinator(no_strays):
    one_line_error([tool("dmtcp-launch"), "--join", "-p", str(free_port()), "true"],
                   "no coordinator")


def test_command_without_coordinator():
    one_line_error([tool("dmtcp-command"), "-p", str(free_port()), "-s"], "no coordinator")


def test_command_bad_port():
    one_line_error([tool("dmtcp-command"), "-p", "notaport", "-s"], "coord-port")


@pytest.mark.parametrize("daemon", [False, True])
def test_coordinator_port_in_use(no_strays, daemon):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        argv = [tool("dmtcp-coordinator"), "-p", str(port), "-q"] + (["--daemon"] if daemon else [])
        one_line_error(argv, "already in use")


def test_checkpoint_with_nothing_to_checkpoint(comp):
    one_line_error([tool("dmtcp-command"), "-p", str(comp.port), "-bc"], "no processes")
    assert json.loads(comp.command("-s", "--json").stdout)["num_peers"] == 0


def test_wrong_token_is_refused(comp):
    res = subprocess.run([tool("dmtcp-command"), "-p", str(comp.port), "-s"],
                         env={**os.environ, "DMTCP_COORD_TOKEN": "not-the-token"},
                         capture_output=True, text=True, timeout=TIMEOUT)
    assert res.returncode != 0
    [line] = res.stderr.strip().splitlines()
    assert line.startswith(f"dmtcp-command: error: coordinator at 127.0.0.1:{comp.port} refused us: "
                           "the token given in $DMTCP_COORD_TOKEN is not this coordinator's; "
                           "give it in DMTCP_COORD_TOKEN"), line
    assert comp.status()["num_peers"] == 0  # and it still serves the right token


def test_a_shell_with_another_tmpdir_is_told_where_the_token_was_looked_for(comp, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "DMTCP_COORD_TOKEN"}
    env["DMTCP_TMPDIR"] = str(tmp_path)
    res = subprocess.run([tool("dmtcp-command"), "-p", str(comp.port), "-s"], env=env,
                         capture_output=True, text=True, timeout=TIMEOUT)
    assert res.returncode != 0
    [line] = res.stderr.strip().splitlines()
    missing = next(tmp_path.glob("dmtcp-*")) / f"coordinator-{comp.port}.token"
    assert f"refused us: no token: {missing} does not exist; " in line, line
    assert "DMTCP_COORD_TOKEN" in line and "DMTCP_TMPDIR" in line, line


def test_launch_a_file_that_is_not_a_program(tmp_path, no_strays):
    junk = tmp_path / "junk"
    junk.write_bytes(b"\x00\x01 not an executable")
    junk.chmod(0o755)
    res = one_line_error([tool("dmtcp-launch"), "-p", str(free_port()), str(junk)], "cannot run")
    assert res.returncode == 126


@pytest.fixture
def not_a_coordinator():
    """A port where something else answers (a web server, say)."""
    import threading
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def answer():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\n")

    threading.Thread(target=answer, daemon=True).start()
    yield server.getsockname()[1]
    server.close()


def test_command_on_a_port_where_something_else_answers(not_a_coordinator):
    one_line_error([tool("dmtcp-command"), "-p", str(not_a_coordinator), "-s"],
                   "is not a dmtcp coordinator")


def test_launch_on_a_port_where_something_else_answers(not_a_coordinator, no_strays):
    one_line_error([tool("dmtcp-launch"), "-p", str(not_a_coordinator), "true"],
                   "is not a dmtcp coordinator")
