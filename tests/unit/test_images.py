"""Image manifests and the atomic publication of generations."""
from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import asdict

import blake3
import xxhash
import pytest

from dmtcp_py.errors import ImageError, UserError
from dmtcp_py.images import integrity, store
from dmtcp_py.images.manifest import MANIFEST, Manifest, load

NAME = store.image_name("prog", "tree1")
FILES = {"core-1.img": b"x" * 100, "pages-1.img": b"p" * 4096, "empty.img": b""}


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def make_manifest(generation: int = 1, files: dict | None = None) -> Manifest:
    return Manifest(
        comp_id="c1", tree_id="tree1", program="prog", argv=["prog", "-v"], host="h",
        generation=generation, time=1.5, root_pid=10, pids=[10, 11], peers=2,
        agent_socket="@dmtcp-x", num_trees=1, stdio={"1": {"key": "pipe:[5]", "kind": "pipe"}},
        external=[], criu_version="3.19", files=dict(files or {}))


def write_image(directory, generation: int = 1, files: dict = FILES) -> Manifest:
    """A complete image: data files, sizes from file_sizes(), a manifest."""
    for name, data in files.items():
        (directory / name).write_bytes(data)
    m = make_manifest(generation, store.file_sizes(directory))
    m.write(directory)
    return m


def new_generation(ckptdir, generation: int):
    partial = store.make_partial(ckptdir, NAME, generation)
    write_image(partial, generation, {**FILES, "gen.img": str(generation).encode()})
    return partial


def generation_of(path) -> int:
    return load(path).generation


# ---- manifest -------------------------------------------------------------------

def test_write_and_load_round_trip(tmp_path):
    m = write_image(tmp_path)
    assert mode(tmp_path / MANIFEST) == 0o600
    loaded = load(tmp_path)
    assert loaded == m
    assert loaded.files == {name: len(data) for name, data in FILES.items()}
    assert loaded.total_bytes == 4196
    assert load(str(tmp_path)) == m  # a str path is fine too


def test_image_error_is_a_user_error():
    assert issubclass(ImageError, UserError)


def test_missing_directory(tmp_path):
    with pytest.raises(ImageError, match="no checkpoint image at .*nope"):
        load(tmp_path / "nope")


def test_not_a_directory(tmp_path):
    path = tmp_path / "file"
    path.write_text("x")
    with pytest.raises(ImageError, match="not a checkpoint image \\(not a directory\\)"):
        load(path)


def test_no_manifest(tmp_path):
    with pytest.raises(ImageError, match=f"not a complete checkpoint image \\(no {MANIFEST}\\)"):
        load(tmp_path)


@pytest.mark.parametrize("content", [b"{", b"", b"\xff\xfe{}", b'{"format": 1,'])
def test_corrupt_manifest(tmp_path, content):
    (tmp_path / MANIFEST).write_bytes(content)
    with pytest.raises(ImageError, match=f"{MANIFEST} is corrupt"):
        load(tmp_path)


def test_manifest_that_is_a_directory(tmp_path):
    (tmp_path / MANIFEST).mkdir()
    with pytest.raises(ImageError, match="is corrupt"):
        load(tmp_path)


@pytest.mark.parametrize("raw", [[], "x", 1, {}, {"format": 2}, {"format": "1"}])
def test_unknown_format(tmp_path, raw):
    (tmp_path / MANIFEST).write_text(json.dumps(raw))
    with pytest.raises(ImageError, match="unknown manifest format"):
        load(tmp_path)


@pytest.mark.parametrize("change", ["missing", "extra"])
def test_manifest_with_wrong_fields(tmp_path, change):
    raw = asdict(make_manifest())
    if change == "missing":
        del raw["tree_id"]
    else:
        raw["surprise"] = 1
    (tmp_path / MANIFEST).write_text(json.dumps(raw))
    with pytest.raises(ImageError, match="is corrupt"):
        load(tmp_path)


def test_missing_file(tmp_path):
    write_image(tmp_path)
    (tmp_path / "pages-1.img").unlink()
    with pytest.raises(ImageError, match="is incomplete: pages-1.img is missing"):
        load(tmp_path)


@pytest.mark.parametrize("size", [0, 4095, 4097])
def test_truncated_or_grown_file(tmp_path, size):
    write_image(tmp_path)
    os.truncate(tmp_path / "pages-1.img", size)
    with pytest.raises(ImageError, match=f"truncated or damaged: pages-1.img has {size} "
                                         "bytes, expected 4096"):
        load(tmp_path)


# ---- store ------------------------------------------------------------------------

@pytest.mark.parametrize("program,expected", [
    ("prog", "ckpt_prog_T.dmtcp"),
    ("my prog/../x", "ckpt_my_prog_.._x_T.dmtcp"),
    ("a-b_c.d", "ckpt_a-b_c.d_T.dmtcp"),
    ("", "ckpt_prog_T.dmtcp"),
])
def test_image_name(program, expected):
    assert store.image_name(program, "T") == expected


def test_make_partial(tmp_path):
    ckptdir = tmp_path / "deep" / "ckpt"
    partial = store.make_partial(ckptdir, NAME, 3)
    assert partial.parent == ckptdir and partial.is_dir()
    assert partial.name.startswith(f".{NAME}.partial-3-")
    assert mode(partial) == 0o700
    (partial / "leftover").write_text("x")
    again = store.make_partial(ckptdir, NAME, 3)
    assert again == partial and list(again.iterdir()) == []


def test_a_new_checkpoint_clears_what_gone_agents_and_restarts_left(tmp_path):
    import subprocess

    from dmtcp_py.images import checkpoint

    gone = subprocess.Popen(["true"])
    gone.wait()
    ckptdir = tmp_path / "ckpt"
    left = [ckptdir / f".{NAME}.partial-2-{gone.pid}", ckptdir / f".{NAME}.restore-{gone.pid}",
            ckptdir / f".{NAME}.partial-2-{gone.pid}.dumped"]
    alive = [ckptdir / f".{NAME}.restore-{os.getpid()}", ckptdir / f".other.restore-{gone.pid}"]
    for d in left + alive:
        d.mkdir(parents=True)
        (d / "pages-1.img").write_text("x")
    ckpt = checkpoint.Checkpoint.begin(ckptdir, "prog", "tree1", 3)
    assert not any(d.exists() for d in left)
    assert all(d.exists() for d in alive) and ckpt.partial.is_dir()


DIGESTS = {"xxh3": lambda data: xxhash.xxh3_128(data).hexdigest(),
           "blake3": lambda data: blake3.blake3(data).hexdigest()}


@pytest.mark.parametrize("algorithm", sorted(DIGESTS))
@pytest.mark.parametrize("wide", [False, True])
def test_seal_makes_files_private_and_takes_sizes_and_digests(tmp_path, monkeypatch, wide,
                                                              algorithm):
    files = {**FILES, "pages-big.img": os.urandom((3 << 10) + 5)}
    monkeypatch.setattr(integrity, "FLUSH_APART", 2 << 10)  # one file flushed apart
    if wide:  # the big one hashed on every core, in several updates
        monkeypatch.setattr(integrity, "HASH_WIDE_FROM", 2 << 10)
        monkeypatch.setattr(integrity, "_WIDE_STEP", 1 << 10)
    for name, data in files.items():
        path = tmp_path / name
        path.write_bytes(data)
        os.chmod(path, 0o644)
    (tmp_path / MANIFEST).write_text("{}")
    (tmp_path / "subdir").mkdir()
    os.symlink("core-1.img", tmp_path / "link.img")
    sealed = integrity.seal(tmp_path, algorithm=algorithm)
    sizes = {name: len(data) for name, data in files.items()}
    assert sealed.sizes == sizes == store.file_sizes(tmp_path)
    assert list(sealed.sizes) == sorted(sizes)
    assert sealed.digests == {name: DIGESTS[algorithm](data) for name, data in files.items()}
    for name in files:
        assert mode(tmp_path / name) == 0o600


@pytest.mark.parametrize("algorithm", sorted(DIGESTS))
def test_a_big_mapped_file_names_a_flipped_byte(tmp_path, monkeypatch, algorithm):
    monkeypatch.setattr(integrity, "HASH_WIDE_FROM", 2 << 10)
    monkeypatch.setattr(integrity, "_WIDE_STEP", 1 << 10)
    data = bytearray(os.urandom((5 << 10) + 3))
    (tmp_path / "pages-1.img").write_bytes(data)
    digests = integrity.seal(tmp_path, algorithm=algorithm).digests
    assert digests["pages-1.img"] == DIGESTS[algorithm](data)
    integrity.verify(tmp_path, digests, algorithm)
    integrity.verify(tmp_path, digests, algorithm, wide=False)
    data[(4 << 10) + 1] ^= 1  # in the last update
    (tmp_path / "pages-1.img").write_bytes(data)
    for wide in (True, False):
        with pytest.raises(ImageError, match=rf"pages-1.img does not match its checksum \({algorithm}\)"):
            integrity.verify(tmp_path, digests, algorithm, wide=wide)


def test_publish_first_generation(tmp_path):
    partial = new_generation(tmp_path, 1)
    final = tmp_path / NAME
    store.publish(partial, final)
    assert not partial.exists()
    assert generation_of(final) == 1
    assert mode(final) == 0o700
    assert sorted(p.name for p in tmp_path.iterdir()) == [NAME]


def publish_all(ckptdir, generations):
    final = ckptdir / NAME
    for generation in generations:
        for expired in store.publish(new_generation(ckptdir, generation), final):
            store.discard(expired)
    return final


def kept(ckptdir) -> list[str]:
    return sorted(p.name for p in ckptdir.iterdir() if p.name != NAME)


def test_second_generation_keeps_the_previous(tmp_path):
    final = publish_all(tmp_path, [1, 2])
    assert generation_of(final) == 2
    assert (final / "gen.img").read_text() == "2"
    assert kept(tmp_path) == [f"{NAME}.gen-1"]
    assert generation_of(tmp_path / f"{NAME}.gen-1") == 1


def test_third_generation_prunes_to_keep_previous(tmp_path):
    final = publish_all(tmp_path, [1, 2, 3])
    assert store.KEEP_PREVIOUS == 1
    assert generation_of(final) == 3
    assert kept(tmp_path) == [f"{NAME}.gen-2"]
    assert generation_of(tmp_path / f"{NAME}.gen-2") == 2


def test_expired_generations_wait_hidden_for_the_caller(tmp_path):
    final = publish_all(tmp_path, [1, 2])
    expired = store.publish(new_generation(tmp_path, 3), final)
    assert [p.name.startswith(f".{NAME}.gen-1.expired") for p in expired] == [True]
    assert generation_of(expired[0]) == 1  # intact until the caller deletes it
    assert kept(tmp_path) == sorted([f"{NAME}.gen-2", expired[0].name])
    assert not list(tmp_path.glob("ckpt_*.dmtcp.gen-1"))


def test_an_expired_generation_gets_its_name_back(tmp_path):
    """A round that failed (or whose end its agent never heard of): what
    its publication moved aside may be the newest complete generation."""
    final = publish_all(tmp_path, [1, 2])
    [expired] = store.publish(new_generation(tmp_path, 3), final)
    assert store.retired_name(expired.name) == f"{NAME}.gen-1"
    assert store.retired_name(NAME) is None
    assert store.retired_name(f".{NAME}.partial-3-77") is None
    store.unretire(expired)
    assert kept(tmp_path) == [f"{NAME}.gen-1", f"{NAME}.gen-2"]
    assert generation_of(tmp_path / f"{NAME}.gen-1") == 1
    # the next publication prunes it as the window says
    for gone in store.publish(new_generation(tmp_path, 4), final):
        store.discard(gone)
    assert kept(tmp_path) == [f"{NAME}.gen-3"]


def test_an_expired_generation_whose_name_is_taken_stays_hidden(tmp_path):
    final = publish_all(tmp_path, [1, 2])
    [expired] = store.publish(new_generation(tmp_path, 3), final)
    (tmp_path / f"{NAME}.gen-1").mkdir()
    store.unretire(expired)
    assert expired.exists() and generation_of(expired) == 1  # never deleted unasked


def test_what_a_dead_agent_moved_aside_gets_its_name_back_at_the_next_checkpoint(tmp_path):
    from dmtcp_py.images import checkpoint
    final = publish_all(tmp_path, [1, 2])
    [expired] = store.publish(new_generation(tmp_path, 3), final)
    dead = expired.with_name(expired.name.rsplit("-", 1)[0] + "-999999999")  # (no such pid)
    expired.rename(dead)
    checkpoint._clear_stale(tmp_path, NAME)
    assert kept(tmp_path) == [f"{NAME}.gen-1", f"{NAME}.gen-2"]


def test_pruning_is_numeric(tmp_path):
    publish_all(tmp_path, [9, 10, 11])
    assert kept(tmp_path) == [f"{NAME}.gen-10"]


@pytest.mark.parametrize("keep", [0, 2, 3])
def test_keep_previous_setting(tmp_path, monkeypatch, keep):
    monkeypatch.setattr(store, "KEEP_PREVIOUS", keep)
    final = publish_all(tmp_path, [1, 2, 3, 4, 5])
    assert generation_of(final) == 5
    assert kept(tmp_path) == [f"{NAME}.gen-{g}" for g in range(5 - keep, 5)]


def test_republishing_a_generation_replaces_the_kept_copy(tmp_path):
    final = publish_all(tmp_path, [1, 2, 2])
    assert generation_of(final) == 2
    assert kept(tmp_path) == [f"{NAME}.gen-2"]


def test_previous_without_a_readable_manifest(tmp_path):
    final = tmp_path / NAME
    final.mkdir()
    (final / MANIFEST).write_text("{")
    publish_all(tmp_path, [1])
    assert generation_of(final) == 1
    assert kept(tmp_path) == [f"{NAME}.gen-old"]
    publish_all(tmp_path, [2])
    assert kept(tmp_path) == [f"{NAME}.gen-1"]  # the unnumbered one goes first


def test_discard(tmp_path):
    partial = new_generation(tmp_path, 1)
    store.discard(partial)
    assert not partial.exists()
    store.discard(partial)  # already gone: fine


def test_images_sealed_with_sha256_are_checked_with_it(tmp_path):
    """An image of an earlier version carries sha256 digests: they are what
    its files are checked against."""
    m = write_image(tmp_path, 1, FILES)
    m.sha256 = {name: hashlib.sha256(data).hexdigest() for name, data in FILES.items()}
    assert integrity.expected(m) == ("sha256", m.sha256)
    integrity.verify(tmp_path, m.sha256, "sha256")
    name = sorted(FILES)[0]
    (tmp_path / name).write_bytes(b"y" + FILES[name][1:])
    with pytest.raises(ImageError, match=rf"{name} does not match its checksum \(sha256\)"):
        integrity.verify(tmp_path, m.sha256, "sha256")
    m.blake3 = {"core-1.img": "00"}  # a newer seal wins
    assert integrity.expected(m)[0] == "blake3"
    m.xxh3 = {"core-1.img": "00"}
    assert integrity.expected(m)[0] == "xxh3"
