"""Incremental generations (images.chunks) on plain files: what is written,
what is linked, what a restore puts together, what the checksums catch.
(The real thing, with CRIU's pagemaps, is tests/e2e/test_incremental.py.)"""
from __future__ import annotations

import io
import os
import shutil
from dataclasses import replace

import pytest
import xxhash

from dmtcp_py.errors import ImageError
from dmtcp_py.images import chunks, integrity, store, transfer
from dmtcp_py.images.manifest import load
from tests.unit.test_images import make_manifest

MIB = chunks.CHUNK
SIZE = 6 * MIB + 8192   # the last chunk shorter


def test_cut_follows_addresses_and_falls_back_to_offsets():
    runs = [(MIB - 4096, 8192), (5 * MIB, 2 * MIB + 4096)]
    assert chunks.cut(sum(n for _, n in runs), runs) == [4096, 4096, MIB, MIB, 4096]
    assert chunks.cut(3 * MIB + 1, None) == [MIB, MIB, MIB, 1]
    assert chunks.cut(100, [(0, 4096)]) == [100]  # a pagemap that does not fit the file


@pytest.mark.parametrize("map_from", [1 << 30, 1])   # read into a buffer; mapped
def test_a_range_of_chunks_hashes_the_same_read_or_mapped(tmp_path, monkeypatch, map_from):
    monkeypatch.setattr(chunks, "MAP_FROM", map_from)
    data = os.urandom(4 * 4096 + 777)
    path = tmp_path / "pages-1.img"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        lengths, at = [4096, 5000, 100], 4097   # from within a page, chunks across pages
        got = chunks._hash_range(fd, at, lengths, (chunks.ALGORITHM, chunks.QUICK))
        with pytest.raises(OSError, match="shorter than its chunks"):
            chunks._hash_range(fd, at, [len(data)], (chunks.QUICK,))
    finally:
        os.close(fd)
    import blake3
    want = []
    for n in lengths:
        part = data[at:at + n]
        want.append((blake3.blake3(part).hexdigest(), xxhash.xxh3_128(part).hexdigest()))
        at += n
    assert got == want


def test_the_chunk_hasher_is_the_list_digest_and_refuses_other_lengths():
    data = os.urandom(10000)
    lengths = [4096, 4096, 1808]
    h = chunks.ChunkHasher(lengths)
    for i in range(0, len(data), 999):
        h.update(data[i:i + 999])
    parts = [data[:4096], data[4096:8192], data[8192:]]
    import blake3
    assert h.hexdigest() == chunks.list_digest([blake3.blake3(p).hexdigest() for p in parts])
    short = chunks.ChunkHasher(lengths)
    short.update(data[:-1])
    long = chunks.ChunkHasher(lengths)
    long.update(data + b"x")
    assert short.hexdigest() == long.hexdigest() == "incomplete"


def _generation(tmp_path, generation: int, pages: bytes, previous=None, aside=None):
    """A published generation holding pages as pages-1.img (no pagemap:
    cut at offsets), stored against the previous (directory, manifest)."""
    partial = store.make_partial(tmp_path, "ckpt_p_t.dmtcp", generation)
    (partial / "pages-1.img").write_bytes(pages)
    (partial / "core-1.img").write_bytes(b"core %d" % generation)
    stored = chunks.store(partial, generation, *(previous or (None, None)), aside)
    sealed = integrity.seal(partial, frozenset(stored.data), algorithm=chunks.ALGORITHM)
    m = replace(make_manifest(generation), files={**sealed.sizes, **stored.sizes},
                blake3={**sealed.digests, **stored.digests}, data=stored.data,
                data_xxh3=stored.quick, pages=stored.pages)
    m.write(partial)
    final = tmp_path / f"gen{generation}"
    os.rename(partial, final)
    return final, load(final), stored


def _restored(directory, m) -> bytes:
    with chunks.readable(directory, m) as view:
        return (view / "pages-1.img").read_bytes()


@pytest.fixture
def two(tmp_path):
    first = os.urandom(SIZE)
    second = bytearray(first)
    second[2 * MIB + 10:2 * MIB + 20] = os.urandom(10)   # one chunk changes
    d1, m1, s1 = _generation(tmp_path, 1, first)
    d2, m2, s2 = _generation(tmp_path, 2, bytes(second), (d1, m1))
    return (d1, m1, s1, first), (d2, m2, s2, bytes(second))


def test_the_first_generation_is_criu_s_file_and_restores_in_place(two):
    (d1, m1, s1, first), _ = two
    assert set(m1.data) == {"pages-1.img"} and s1.written == SIZE
    with chunks.readable(d1, m1) as view:
        assert view == d1   # a plain CRIU image: no view at all
    assert _restored(d1, m1) == first


def test_the_second_writes_one_chunk_and_links_the_rest(two):
    (d1, _, _, _), (d2, m2, s2, second) = two
    assert s2.written == MIB and s2.shared == SIZE - MIB
    assert os.stat(d2 / "pages-1.img").st_ino == os.stat(d1 / "pages-1.img").st_ino
    assert (d2 / "pages-1-g2.img").stat().st_size == MIB
    assert not list(d2.glob(".dumped-*"))
    assert _restored(d2, m2) == second
    assert not list(d2.parent.glob(".*restore*")) and not list(d2.glob(".*restore*"))


def test_deleting_the_older_generation_leaves_the_newer_whole(two):
    (d1, _, _, _), (d2, m2, _, second) = two
    shutil.rmtree(d1)
    integrity.verify(d2, *reversed(integrity.expected(m2)))
    assert _restored(d2, m2) == second


def test_a_restart_checks_data_files_with_the_quick_digest(two):
    (d1, m1, s1, _), (d2, m2, s2, _) = two
    assert set(m2.data_xxh3) == set(m2.data) == {"pages-1.img", "pages-1-g2.img"}
    assert m2.data_xxh3["pages-1.img"] == m1.data_xxh3["pages-1.img"]   # shared: carried over
    for d, m in ((d1, m1), (d2, m2)):
        algorithm, digests = integrity.expected(m)
        assert algorithm == chunks.ALGORITHM
        assert {digests[n].kind for n in m.data} == {chunks.QUICK}
        for name, chunk_list in m.data.items():   # the list digest of each chunk's XXH3
            data = (d / name).read_bytes()
            at, quick = 0, []
            for n, _ in chunk_list:
                quick.append(xxhash.xxh3_128(data[at:at + n]).hexdigest())
                at += n
            assert m.data_xxh3[name] == chunks.list_digest(quick, chunks.QUICK)
        integrity.verify(d, digests, algorithm)


@pytest.mark.parametrize("quick", [True, False], ids=["xxh3", "older-image-blake3"])
@pytest.mark.parametrize("parallel", [True, False], ids=["every-core", "one-core"])
def test_a_damaged_shared_chunk_is_named(two, monkeypatch, quick, parallel):
    (d1, m1, _, _), (d2, m2, _, _) = two
    monkeypatch.setattr(chunks, "PARALLEL_FROM", 1 if parallel else 1 << 40)
    calls, hash_chunks = [], chunks.hash_chunks
    monkeypatch.setattr(chunks, "hash_chunks", lambda *a: calls.append(a[3:]) or hash_chunks(*a))
    with open(d1 / "pages-1.img", "r+b") as f:   # the inode both hold
        f.seek(5 * MIB)
        byte = f.read(1)
        f.seek(5 * MIB)
        f.write(bytes([byte[0] ^ 1]))
    for d, m in ((d1, m1), (d2, m2)):
        m = m if quick else replace(m, data_xxh3={})
        algorithm, digests = integrity.expected(m)
        kind = chunks.QUICK if quick else chunks.ALGORITHM
        with pytest.raises(ImageError, match=f"pages-1.img does not match its checksum "
                                             f"\\({kind}\\)"):
            integrity.verify(d, digests, algorithm)
    assert calls == ([(integrity._workers(), (chunks.QUICK if quick else chunks.ALGORITHM,))] * 3
                     if parallel else [])


def test_an_old_file_mostly_dead_is_not_kept_alive(two, tmp_path):
    _, (d2, m2, _, second) = two
    third = bytearray(second)
    for c in (0, 1, 3, 4):  # 4 more of 7 change: less than half of pages-1.img stays
        third[c * MIB] ^= 0xFF
    d3, m3, s3 = _generation(tmp_path, 3, bytes(third), (d2, m2))
    assert "pages-1.img" not in m3.data            # copied again, not linked
    assert s3.shared == MIB                         # generation 2's own chunk is kept
    assert _restored(d3, m3) == bytes(third)


def test_a_copy_between_hosts_checks_chunks(two, tmp_path):
    _, (d2, m2, _, second) = two
    image = tmp_path / "ckpt_p_t.dmtcp"
    os.rename(d2, image)
    out = io.BytesIO()
    transfer.send(image, out)
    got = transfer.receive(io.BytesIO(out.getvalue()), tmp_path / "other")
    assert _restored(got, load(got)) == second
    damaged = bytearray(out.getvalue())
    damaged[-(SIZE // 2)] ^= 1   # inside pages-1.img
    with pytest.raises(ImageError, match="does not match its checksum"):
        transfer.receive(io.BytesIO(bytes(damaged)), tmp_path / "third")


def test_a_generation_abandoned_midway_leaves_the_previous_one_whole(two, tmp_path):
    (d1, m1, _, first), (d2, m2, _, second) = two
    partial = store.make_partial(tmp_path, "ckpt_p_t.dmtcp", 3)
    (partial / "pages-1.img").write_bytes(second)
    chunks.store(partial, 3, d2, m2)   # links generation 2's files in ...
    store.discard(partial)             # ... and the checkpoint fails
    for d, m, data in ((d1, m1, first), (d2, m2, second)):
        integrity.verify(d, *reversed(integrity.expected(m)))
        assert _restored(d, m) == data


def test_hashing_and_putting_together_on_every_core_give_the_same(tmp_path, monkeypatch):
    first = os.urandom(SIZE)
    second = bytearray(first)
    second[3 * MIB:3 * MIB + 5] = b"12345"
    d1, m1, _ = _generation(tmp_path / "one", 1, first)
    d2, m2, _ = _generation(tmp_path / "one", 2, bytes(second), (d1, m1))
    monkeypatch.setattr(chunks, "PARALLEL_FROM", 1)
    p1, q1, _ = _generation(tmp_path / "all", 1, first)
    p2, q2, _ = _generation(tmp_path / "all", 2, bytes(second), (p1, q1))
    assert (q1.data, q2.data, q2.pages) == (m1.data, m2.data, m2.pages)
    assert _restored(p2, q2) == bytes(second)


def test_criu_s_files_set_aside_are_left_for_the_caller(two, tmp_path):
    (_, _, _, _), (d2, m2, _, second) = two
    third = bytearray(second)
    third[0] ^= 1
    aside = tmp_path / ".aside"
    d3, m3, s3 = _generation(tmp_path, 3, bytes(third), (d2, m2), aside)
    assert [p.name for p in aside.iterdir()] == ["pages-1.img"]
    assert (aside / "pages-1.img").read_bytes() == bytes(third)
    assert s3.written == MIB and _restored(d3, m3) == bytes(third)


# ---- the view through CRIU's parent images (images.page_chain) --------------------------

def _with_pagemap(tmp_path, generation: int, pages: bytes, previous=None):
    """_generation's, with CRIU's pagemap-1.img beside pages-1.img: one
    entry of every page at a high address, as a dump of one mapping."""
    import struct

    import pycriu.images
    from dmtcp_py.images import page_chain

    magic = pycriu.images.magic.by_name
    prefix = struct.pack("ii", magic["IMG_COMMON"], magic["PAGEMAP"])
    partial = store.make_partial(tmp_path, "ckpt_p_t.dmtcp", generation)
    page_chain.write_pagemap(partial / "pagemap-1.img", prefix, 1,
                             [page_chain.Entry(0x7F0000000000, len(pages), page_chain.PE_PRESENT)])
    (partial / "pages-1.img").write_bytes(pages)
    stored = chunks.store(partial, generation, *(previous or (None, None)))
    m = replace(make_manifest(generation), data=stored.data, pages=stored.pages)
    final = tmp_path / f"gen{generation}"
    os.rename(partial, final)
    return final, m


def _read_through(view) -> bytes:
    """What CRIU reads at the view's addresses, level by level (the model
    of pagemap.c in test_page_chain)."""
    from dmtcp_py.images import page_chain
    from tests.unit.test_page_chain import Level

    def level(directory):
        pm = page_chain.read_pagemap(directory / "pagemap-1.img")
        parent = level(directory / "parent") if (directory / "parent").is_dir() else None
        entries = list(pm.entries)
        return Level(entries, (directory / f"pages-{pm.pages_id}.img").read_bytes(), parent)

    top, out = level(view), b""
    while top.advance():
        out += top.read(top.pe.vaddr, top.pe.length)
    return out


@pytest.fixture
def mapped(tmp_path):
    first = os.urandom(SIZE - 8192)   # whole pages
    second = bytearray(first)
    second[4 * MIB + 100:4 * MIB + 200] = os.urandom(100)
    d1, m1 = _with_pagemap(tmp_path, 1, first)
    d2, m2 = _with_pagemap(tmp_path, 2, bytes(second), (d1, m1))
    return d2, m2, bytes(second)


def test_a_generation_of_shared_chunks_is_read_through_levels_of_links(mapped):
    d2, m2, second = mapped
    with chunks.readable(d2, m2) as view:
        assert view.parent == d2.parent and (view / "parent" / "parent").is_dir()
        assert (view / "pages-1.img").stat().st_size == 0   # nothing copied
        assert _read_through(view) == second
    with chunks.readable(d2, m2, lazy=True) as view:   # CRIU's lazy pages read no parents
        assert not (view / "parent").exists()
        assert (view / "pages-1.img").read_bytes() == second
    _gone(view)


def test_where_hard_links_are_refused_the_pages_are_put_together(mapped, monkeypatch):
    from dmtcp_py.images import page_chain

    d2, m2, second = mapped

    def refused(src, dst, **kwargs):
        raise PermissionError(1, "Operation not permitted", str(src))

    monkeypatch.setattr(page_chain.os, "link", refused)
    with chunks.readable(d2, m2) as view:
        assert not (view / "parent").exists()
        assert (view / "pages-1.img").read_bytes() == second
    _gone(view)


def _gone(view) -> None:
    """The view's removal thread is done (in /dev/shm: not under tmp_path)."""
    import time

    deadline = time.monotonic() + 10
    while view.exists():
        assert time.monotonic() < deadline, f"{view} was left behind"
        time.sleep(0.01)
