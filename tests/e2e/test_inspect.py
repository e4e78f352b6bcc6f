"""dmtcp-inspect on real images: two trees talking over TCP, checkpointed;
what each image holds, as text and as JSON; bad images are one line."""
from __future__ import annotations

import json
import subprocess

from tests.e2e.harness import tool, wait_for
from tests.e2e.test_bad_input import free_port
from tests.e2e.test_network import last


def inspect(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([tool("dmtcp-inspect"), *args], capture_output=True, text=True,
                          timeout=60)


def test_inspect_shows_processes_sockets_and_files(comp, programs):
    port = str(free_port())
    server, sout = comp.launch(*programs["net_stream"], "server", "127.0.0.1", port, "100000", "5")
    wait_for(lambda: sout.exists() and "listening" in sout.read_text(), what="the server")
    client, cout = comp.launch(*programs["net_stream"], "client", "127.0.0.1", port, "100000", "5")
    comp.wait_peers(2)
    wait_for(lambda: last(sout, "server") >= 5, what="traffic")
    comp.checkpoint()
    images = [str(i) for i in comp.images()]
    assert len(images) == 2

    res = inspect("--json", *images)
    assert res.returncode == 0, res.stderr
    infos = json.loads(res.stdout)
    assert [i["program"] for i in infos] == ["net_stream", "net_stream"]
    conns = set()
    for info in infos:
        assert info["generation"] == 1 and info["trees_in_generation"] == 2
        assert info["memory_bytes"] > 0 and info["bytes"] >= info["memory_bytes"]
        assert any(p["program"] == "net_stream" and p["under_control"] for p in info["processes"])
        assert any(f["path"].endswith("/net_stream") for f in info["files"])
        tcp = [s for s in info["sockets"] if s["kind"] == "tcp" and s["connection"]]
        assert len(tcp) == 1, info["sockets"]
        conns.add(tcp[0]["connection"])
    assert len(conns) == 1, "the two ends name one connection"
    assert sum(s["listening"] for i in infos for s in i["sockets"]) == 1

    text = inspect(images[0])
    assert text.returncode == 0
    assert "generation 1 of 2 trees" in text.stdout and "connection" in text.stdout
    comp.command("-k")
    server.wait(timeout=60)
    client.wait(timeout=60)


def test_inspect_refuses_bad_images_in_one_line(comp, programs, tmp_path):
    assert inspect(str(tmp_path / "nothing.dmtcp")).stderr.count("\n") == 1
    proc, _ = comp.launch(*programs["counter_single"], "100000", "10")
    comp.wait_peers(1)
    comp.checkpoint()
    image = comp.images()[0]
    pstree = image / "pstree.img"
    data = bytearray(pstree.read_bytes())
    data[8:] = b"\xff" * (len(data) - 8)  # same size, garbage records
    pstree.write_bytes(bytes(data))
    res = inspect(str(image))
    assert res.returncode != 0
    assert res.stderr.startswith("dmtcp-inspect: error:") and res.stderr.count("\n") == 1, res.stderr
    assert "Traceback" not in res.stderr
    comp.kill_and_wait(proc)
