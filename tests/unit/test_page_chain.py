"""images.page_chain's levels, read back the way CRIU reads parent images
(a model of criu/pagemap.c: seek_pagemap, read_pagemap_page,
read_parent_page), on layouts the dumps make and on the ones they rarely
do: a mapping that moved down, a chunk used twice, chunks of several data
files interleaved.  (A real restart through the view: tests/e2e/
test_incremental.py.)"""
from __future__ import annotations

import random

import pytest

from dmtcp_py.images import page_chain as pc

PAGE = pc.PAGE


class Level:
    """One page_read: a pagemap over its pages file, with its parent."""

    def __init__(self, entries: list[pc.Entry], data: bytes, parent: Level | None) -> None:
        self.entries, self.data, self.parent = entries, data, parent
        self.cur, self.pe, self.cvaddr, self.pi_off = -1, None, 0, 0

    def advance(self) -> bool:
        self.cur += 1
        if self.cur >= len(self.entries):
            return False
        self.pe = self.entries[self.cur]
        self.cvaddr = self.pe.vaddr
        return True

    def skip(self, n: int) -> None:
        if n and self.pe.flags & pc.PE_PRESENT:
            self.pi_off += n
        self.cvaddr += n

    def seek(self, vaddr: int) -> bool:
        if self.pe is None and not self.advance():
            return False
        while True:
            start, end = self.pe.vaddr, self.pe.vaddr + self.pe.length
            if vaddr < self.cvaddr:
                return False
            if start <= vaddr < end:
                self.skip(vaddr - self.cvaddr)
                return True
            if end <= vaddr:
                self.skip(end - self.cvaddr)
            if not self.advance():
                return False

    def read(self, vaddr: int, n: int) -> bytes:
        pe = self.pe
        assert pe.vaddr <= vaddr and vaddr + n <= pe.vaddr + pe.length, "CRIU's BUG()"
        if pe.flags & pc.PE_PARENT:
            out = self.read_parent(vaddr, n)
        else:
            out = self.data[self.pi_off:self.pi_off + n]
            assert len(out) == n, "read past the pages file"
            self.pi_off += n
        self.cvaddr += n
        return out

    def read_parent(self, vaddr: int, n: int) -> bytes:
        p, out = self.parent, b""
        assert p is not None, "no parent for snapshot pagemap"
        while n:
            assert p.seek(vaddr), f"missing {vaddr:#x} in parent pagemap"
            step = min(n, p.pe.vaddr + p.pe.length - vaddr)
            out += p.read(vaddr, step)
            vaddr, n = vaddr + step, n - step
        return out


def restore(uses: list[pc.Use], top: list[pc.Entry], files: dict[str, bytes]) -> dict[int, bytes]:
    """What CRIU puts at each address, reading through the levels."""
    levels = pc.chains(uses)
    parent = None
    for depth in reversed(range(len(levels))):
        deeper = {u.addr for chain in levels[depth + 1:] for u in chain}
        entries = pc.level_entries(uses, levels[depth], deeper)
        parent = Level(entries, files[levels[depth][0].source], parent)
    view, memory = Level(top, b"", parent), {}
    while view.advance():
        pe = view.pe
        got = view.read(pe.vaddr, pe.length)
        for k in range(0, pe.length, PAGE):
            memory[pe.vaddr + k] = got[k:k + PAGE]
    return memory


def files_of(sizes: dict[str, int]) -> dict[str, bytes]:
    """Data files whose every page says which file and page it is."""
    return {name: b"".join(f"{name}:{i}".encode().ljust(PAGE, b".") for i in range(pages))
            for name, pages in sizes.items()}


def expected(uses: list[pc.Use], files: dict[str, bytes]) -> dict[int, bytes]:
    out = {}
    for u in uses:
        for k in range(0, u.length, PAGE):
            out[u.addr + k] = files[u.source][u.offset + k:u.offset + k + PAGE]
    return out


def top_of(uses: list[pc.Use]) -> list[pc.Entry]:
    """The view's entries for address runs (contiguous uses make one)."""
    out: list[pc.Entry] = []
    for u in uses:
        if out and out[-1].vaddr + out[-1].length == u.addr:
            out[-1] = pc.Entry(out[-1].vaddr, out[-1].length + u.length, pc.PE_PARENT)
        else:
            out.append(pc.Entry(u.addr, u.length, pc.PE_PARENT))
    return out


BASE = 0x7F0000000000


def layout(spec: list[tuple[str, int, int]], gaps: set[int] = frozenset()) -> list[pc.Use]:
    """Uses at rising addresses from (file, first page, pages); a gap of
    64 pages before the uses whose index is in gaps."""
    uses, addr = [], BASE
    for i, (name, page, pages) in enumerate(spec):
        if i in gaps:
            addr += 64 * PAGE
        uses.append(pc.Use(addr, pages * PAGE, name, page * PAGE))
        addr += pages * PAGE
    return uses


def check(uses: list[pc.Use], sizes: dict[str, int]) -> int:
    files = files_of(sizes)
    assert restore(uses, top_of(uses), files) == expected(uses, files)
    return len(pc.chains(uses))


def test_a_whole_file_is_one_level_without_skips():
    uses = layout([("a", 0, 4), ("a", 4, 8)], gaps={1})
    assert check(uses, {"a": 12}) == 1
    entries = pc.level_entries(uses, uses, set())
    assert [e.flags for e in entries] == [pc.PE_PRESENT, pc.PE_PRESENT]


def test_changed_chunks_come_from_the_new_file_and_the_rest_from_the_old():
    # generation 2: chunks 1 and 3 rewritten (file b), the others shared (file a)
    uses = layout([("a", 0, 4), ("b", 0, 4), ("a", 8, 4), ("b", 4, 4), ("a", 16, 4)])
    assert check(uses, {"a": 20, "b": 8}) == 2


def test_bytes_of_a_file_a_level_does_not_use_are_passed_over():
    uses = layout([("a", 3, 2), ("a", 10, 1), ("a", 30, 5)], gaps={2})
    assert check(uses, {"a": 40}) == 1
    entries = pc.level_entries(uses, uses, set())
    skipped = sum(e.length for e in entries if e.vaddr == 0)
    assert skipped == (3 + 5 + 19) * PAGE


def test_a_mapping_that_moved_down_and_a_chunk_used_twice_take_more_levels():
    moved = layout([("a", 8, 4), ("a", 0, 4)])     # file order against address order
    assert check(moved, {"a": 12}) == 2
    twice = layout([("a", 0, 4), ("a", 0, 4), ("a", 0, 4)], gaps={1, 2})
    assert check(twice, {"a": 4}) == 3


def test_a_skip_never_reaches_an_address_that_is_sought():
    # a mapping low in memory after a long unused part of its data file
    uses = [pc.Use(0x10000, PAGE, "a", 300 * PAGE), pc.Use(0x20000, PAGE, "a", 700 * PAGE)]
    assert check(uses, {"a": 701}) == 1
    entries = pc.level_entries(uses, uses, set())
    for i, e in enumerate(entries):
        if e.vaddr == 0:   # ends at or below the next address sought
            assert e.length <= next(f.vaddr for f in entries[i:] if f.vaddr)
    assert sum(e.length for e in entries if e.vaddr == 0) == (300 + 399) * PAGE


@pytest.mark.parametrize("seed", range(40))
def test_random_layouts_read_back_what_each_address_holds(seed):
    rng = random.Random(seed)
    sizes = {name: rng.randint(8, 64) for name in "abcd"[:rng.randint(1, 4)]}
    spec = []
    for _ in range(rng.randint(1, 30)):
        name = rng.choice(sorted(sizes))
        pages = rng.randint(1, 4)
        spec.append((name, rng.randint(0, sizes[name] - pages), pages))
    gaps = {i for i in range(len(spec)) if rng.random() < 0.3}
    check(layout(spec, gaps), sizes)


def test_uses_follow_the_dumps_entries_and_refuse_what_does_not_fit():
    def entry(vaddr, pages, flags=pc.PE_PRESENT):
        return pc.Entry(vaddr, pages * PAGE, flags)

    lazy = entry(BASE + 16 * PAGE, 1, pc.PE_PRESENT | pc.PE_LAZY)
    pm = pc.Pagemap(b"", 7, [entry(BASE, 3), lazy])
    order = [("a", 0, PAGE), ("b", 8 * PAGE, 2 * PAGE), ("a", PAGE, PAGE)]
    assert pc.uses_of(pm, order) == [pc.Use(BASE, PAGE, "a", 0),
                                     pc.Use(BASE + PAGE, 2 * PAGE, "b", 8 * PAGE),
                                     pc.Use(BASE + 16 * PAGE, PAGE, "a", PAGE)]
    assert pc.top_entries(pm) == [pc.Entry(BASE, 3 * PAGE, pc.PE_PARENT),
                                  pc.Entry(BASE + 16 * PAGE, PAGE, pc.PE_PARENT | pc.PE_LAZY)]
    assert pc.uses_of(pm, order[:2]) is None                      # a chunk missing
    assert pc.uses_of(pm, [("a", 0, 4 * PAGE)]) is None            # a chunk across two entries
    parent = pc.Pagemap(b"", 7, [entry(BASE, 4, pc.PE_PARENT)])
    assert pc.uses_of(parent, [("a", 0, 4 * PAGE)]) is None        # not in this dump


# ---- the pagemap image, against CRIU's own protobuf classes ------------------------------

def _criu_image(head_id: int, entries: list[dict]) -> bytes:
    """A pagemap image as pycriu's classes encode it (CRIU's own layout)."""
    import struct

    import pycriu.images
    pb, magic = pycriu.images.pb, pycriu.images.magic.by_name
    out = struct.pack("ii", magic["IMG_COMMON"], magic["PAGEMAP"])
    head = pb.pagemap_head()
    head.pages_id = head_id
    messages = [head]
    for fields in entries:
        e = pb.pagemap_entry()
        for name, value in fields.items():
            setattr(e, name, value)
        messages.append(e)
    for m in messages:
        body = m.SerializeToString()
        out += struct.pack("i", len(body)) + body
    return out


def test_a_pagemap_reads_as_criu_reads_it(tmp_path):
    path = tmp_path / "pagemap-3.img"
    path.write_bytes(_criu_image(3, [
        {"vaddr": BASE, "compat_nr_pages": 0, "nr_pages": 1 << 20, "flags": pc.PE_PRESENT},
        {"vaddr": 0x7FFF_FFFF_F000, "compat_nr_pages": 2},               # no flags: present
        {"vaddr": BASE + PAGE, "compat_nr_pages": 0, "in_parent": True, "nr_pages": 4},
        {"vaddr": BASE + 9 * PAGE, "compat_nr_pages": 0, "nr_pages": 1,
         "flags": pc.PE_PRESENT | pc.PE_LAZY}]))
    pm = pc.read_pagemap(path)
    assert pm is not None and pm.pages_id == 3 and len(pm.prefix) == 8
    assert pm.entries == [pc.Entry(BASE, (1 << 20) * PAGE, pc.PE_PRESENT),
                          pc.Entry(0x7FFF_FFFF_F000, 2 * PAGE, pc.PE_PRESENT),
                          pc.Entry(BASE + PAGE, 4 * PAGE, pc.PE_PARENT),
                          pc.Entry(BASE + 9 * PAGE, PAGE, pc.PE_PRESENT | pc.PE_LAZY)]


def test_a_pagemap_is_written_as_criu_writes_it(tmp_path):
    entries = [pc.Entry(BASE, 3 * PAGE, pc.PE_PRESENT), pc.Entry(BASE + 8 * PAGE, PAGE, 0),
               (BASE + (1 << 40), 300 * PAGE, pc.PE_PARENT | pc.PE_LAZY)]
    path = tmp_path / "pagemap-5.img"
    pc.write_pagemap(path, _criu_image(5, [])[:8], 5, entries)
    assert path.read_bytes() == _criu_image(5, [
        {"vaddr": a, "compat_nr_pages": 0, "flags": f, "nr_pages": n // PAGE}
        for a, n, f in entries])
    pm = pc.read_pagemap(path)
    assert (pm.pages_id, pm.entries) == (5, [pc.Entry(*e) for e in entries])


@pytest.mark.parametrize("damage", ["truncated", "other magic", "other wire type", "empty"])
def test_a_pagemap_that_is_not_one_reads_as_none(tmp_path, damage):
    raw = _criu_image(1, [{"vaddr": BASE, "compat_nr_pages": 0, "nr_pages": 2}])
    raw = {"truncated": raw[:-1], "other magic": raw[:4] + b"\0\0\0\0" + raw[8:],
           "other wire type": raw[:-2] + bytes([(5 << 3) | 2]) + raw[-1:], "empty": b""}[damage]
    path = tmp_path / "pagemap-1.img"
    path.write_bytes(raw)
    assert pc.read_pagemap(path) is None
