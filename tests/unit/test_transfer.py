"""Images between hosts (images/transfer.py, dmtcp-image, and the restart
script's copying of a moved tree's image from a replica)."""
from __future__ import annotations

import io
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from dmtcp_py.coordinator import restart_script
from dmtcp_py.errors import ImageError
from dmtcp_py.images import integrity, store, transfer
from dmtcp_py.images.manifest import load
from dmtcp_py.protocol.messages import Copy, ImageInfo
from tests.unit.test_images import FILES, NAME, write_image

BIN = Path(sys.executable).parent


def sealed_image(ckptdir: Path, generation: int = 1) -> Path:
    """A published image with digests, as a checkpoint leaves it."""
    partial = store.make_partial(ckptdir, NAME, generation)
    m = write_image(partial, generation, {**FILES, "gen.img": str(generation).encode()})
    sealed = integrity.seal(partial)
    m.files, m.xxh3 = sealed.sizes, sealed.digests
    m.write(partial)
    store.publish(partial, ckptdir / NAME)
    return ckptdir / NAME


def stream_of(image: Path) -> bytes:
    out = io.BytesIO()
    transfer.send(image, out)
    return out.getvalue()


def test_round_trip_is_checked_private_and_published(tmp_path):
    src = sealed_image(tmp_path / "a", 3)
    got = transfer.receive(io.BytesIO(stream_of(src)), tmp_path / "b")
    assert got == tmp_path / "b" / NAME
    m = load(got)
    assert m.generation == 3
    integrity.verify(got, m.xxh3)
    assert stat.S_IMODE(got.stat().st_mode) == 0o700
    assert {stat.S_IMODE(p.stat().st_mode) for p in got.iterdir()} == {0o600}
    assert not [p for p in (tmp_path / "b").iterdir() if p.name.startswith(".")]


def test_a_newer_copy_keeps_the_older_one_beside_it(tmp_path):
    dest = tmp_path / "b"
    transfer.receive(io.BytesIO(stream_of(sealed_image(tmp_path / "a1", 1))), dest)
    transfer.receive(io.BytesIO(stream_of(sealed_image(tmp_path / "a2", 2))), dest)
    assert load(dest / NAME).generation == 2
    assert load(dest / f"{NAME}.gen-1").generation == 1
    with pytest.raises(ImageError, match="newer"):  # an old stream never replaces a newer copy
        transfer.receive(io.BytesIO(stream_of(sealed_image(tmp_path / "a3", 1))), dest)


def test_a_flipped_byte_or_a_cut_stream_publishes_nothing(tmp_path):
    data = bytearray(stream_of(sealed_image(tmp_path / "a")))
    flipped = bytes(data[:-3]) + bytes([data[-3] ^ 1]) + bytes(data[-2:])
    with pytest.raises(ImageError, match="checksum"):
        transfer.receive(io.BytesIO(flipped), tmp_path / "b")
    with pytest.raises(ImageError, match="ended"):
        transfer.receive(io.BytesIO(bytes(data[:-100])), tmp_path / "b")
    assert list((tmp_path / "b").iterdir()) == []


@pytest.mark.parametrize("header", [b"", b"garbage\n", b'{"magic": "dmtcp-image"}\n',
                                    b'{"magic":"dmtcp-image","version":1,"name":"../x",'
                                    b'"generation":1,"manifest":10}\n'])
def test_what_is_not_an_image_stream_is_refused(tmp_path, header):
    with pytest.raises(ImageError, match="not an image stream"):
        transfer.receive(io.BytesIO(header + b"x" * 20), tmp_path / "b")


def test_send_refuses_another_generation(tmp_path):
    with pytest.raises(ImageError, match="generation 2, not 5"):
        transfer.send(sealed_image(tmp_path / "a", 2), io.BytesIO(), generation=5)


def test_dmtcp_image_pipes_an_image_and_says_where(tmp_path):
    src = sealed_image(tmp_path / "a")
    sender = subprocess.Popen([BIN / "dmtcp-image", "send", src], stdout=subprocess.PIPE)
    got = subprocess.run([BIN / "dmtcp-image", "receive", tmp_path / "b"], stdin=sender.stdout,
                         capture_output=True, text=True, timeout=60)
    sender.stdout.close()
    assert sender.wait(timeout=60) == 0
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == str(tmp_path / "b" / NAME)
    bad = subprocess.run([BIN / "dmtcp-image", "receive", tmp_path / "c"], input=b"junk\n",
                         capture_output=True, timeout=60)
    assert bad.returncode != 0 and bad.stderr.count(b"\n") == 1 and b"Traceback" not in bad.stderr


def restart_moved(tmp_path, img: ImageInfo, restart: str) -> subprocess.CompletedProcess:
    """The restart script of one image, its host lost and mapped to this one."""
    script = tmp_path / "restart.sh"
    script.write_text(restart_script.render([img], comp_id="c", generation=1,
                                            coord_host="127.0.0.1", coord_port=7779))
    return subprocess.run(["bash", str(script), "--map", f"{img.host}={socket.gethostname()}",
                           "--lost", img.host], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "DMTCP_RESTART": restart})


def args_stub(tmp_path) -> Path:
    """A dmtcp_restart that writes its arguments, one a line, beside itself."""
    stub = tmp_path / "restart-stub"
    stub.write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done > "$0.args"\n')
    stub.chmod(0o700)
    return stub


def test_the_restart_script_copies_a_moved_tree_from_its_replica(tmp_path):
    """The tree's host is lost; a replica is on "localhost" (this host, by
    another name): the script copies it into the tree's directory on the
    new host (this one) and restarts it from there."""
    replica = sealed_image(tmp_path / "replica")
    primary = tmp_path / "ckpt" / NAME
    img = ImageInfo(path=str(primary), host="lost-host", tree_id="tree1", program="prog",
                    replicas=(Copy(host="localhost", path=str(replica)),))
    res = restart_moved(tmp_path, img, str(args_stub(tmp_path)))
    assert res.returncode == 0, res.stderr
    assert load(primary).generation == 1  # copied into the tree's own directory
    assert str(primary) in (tmp_path / "restart-stub.args").read_text().splitlines()


def test_the_restart_script_fails_in_one_line_when_no_copy_can_be_had(tmp_path):
    img = ImageInfo(path=str(tmp_path / "ckpt" / NAME), host="lost-host", tree_id="tree1",
                    program="prog")
    res = restart_moved(tmp_path, img, "/bin/false")
    assert res.returncode != 0
    assert "error: no copy of" in res.stderr


def test_the_restart_script_uses_an_image_already_on_the_new_host(tmp_path):
    """Shared storage: the lost host's image is at its path here too."""
    primary = sealed_image(tmp_path / "ckpt")
    img = ImageInfo(path=str(primary), host="lost-host", tree_id="tree1", program="prog")
    res = restart_moved(tmp_path, img, str(args_stub(tmp_path)))
    assert res.returncode == 0, res.stderr
    assert "copying" not in res.stderr
    assert str(primary) in (tmp_path / "restart-stub.args").read_text().splitlines()


def test_an_agent_takes_copies_only_with_the_computations_token(tmp_path):
    """ReplicaServer and send_copy over loopback: the right token writes
    the copy; another is closed unread and nothing is written."""
    import asyncio

    from dmtcp_py.agent.replicas import ReplicaServer, send_copy
    from dmtcp_py.protocol.messages import ReplicaTarget

    src = sealed_image(tmp_path / "a", 4)
    dest = tmp_path / "b"

    async def scenario():
        server = ReplicaServer("right", lambda: dest)
        port = await server.start("127.0.0.1")
        target = ReplicaTarget(host="b", address="127.0.0.1", port=port)
        try:
            with pytest.raises(ImageError):  # (unanswered, or cut off mid-stream)
                await asyncio.to_thread(send_copy, src, 4, target, "wrong")
            assert not dest.exists() or not list(dest.iterdir())
            return await asyncio.to_thread(send_copy, src, 4, target, "right")
        finally:
            server.close()

    where = asyncio.run(scenario())
    assert where == str(dest / NAME) and load(dest / NAME).generation == 4


def test_the_generation_before_is_found_beside_the_newest(tmp_path):
    """After generation 2 took the name, generation 1 is kept as .gen-1:
    dmtcp-image has/send and dmtcp-restart --generation find it there."""
    ckpt = tmp_path / "a"
    sealed_image(ckpt, 1)
    image = sealed_image(ckpt, 2)
    assert store.find_generation(image, 2) == image
    assert store.find_generation(image, 1) == ckpt / f"{NAME}.gen-1"
    assert store.find_generation(image, 3) is None
    got = transfer.receive(io.BytesIO(_stream(image, 1)), tmp_path / "b")
    assert load(got).generation == 1
    res = subprocess.run([BIN / "dmtcp-image", "has", image, "--generation", "1"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == str(ckpt / f"{NAME}.gen-1")
    res = subprocess.run([BIN / "dmtcp-image", "has", image, "--generation", "3"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and res.stdout == ""
    res = subprocess.run([BIN / "dmtcp-restart", "--generation", "3", image],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and "no generation 3" in res.stderr
    assert res.stderr.count("\n") == 1


def _stream(image: Path, generation: int) -> bytes:
    out = io.BytesIO()
    transfer.send(image, out, generation=generation)
    return out.getvalue()
