"""A dump that left its unwritten pages in its parent, made whole again:
pure (no I/O; images.chunks reads and writes).

With write tracking (agent/tracking.py) CRIU dumps only the pages a
process wrote since the previous generation; its pagemap says of the
others "in the parent" (PE_PARENT), and its pages file holds only the
written ones.  Every generation must stay restartable on its own, so the
generation's pagemap is written whole again (every entry present), and its
memory is kept as chunks like any other incremental generation's
(images.chunks): a chunk all of whose pages are in the parent at the place
of one of the parent's chunks is that chunk (its digest is known: nothing
is read or hashed); any other chunk is put together from CRIU's new pages
and the parent's data files, then hashed and stored like a dumped one.
"""
from __future__ import annotations

from bisect import bisect_right
from typing import NamedTuple

from dmtcp_py.images.page_chain import PE_LAZY, PE_PARENT, PE_PRESENT


class Part(NamedTuple):
    """Bytes of the new generation's memory, in address order."""
    addr: int
    length: int
    new_offset: int | None   # where in CRIU's new pages file; None: in the parent


class Piece(NamedTuple):
    """Where the bytes of a part of a chunk are read from."""
    length: int
    source: str | None       # a data file of the parent; None: CRIU's new pages file
    offset: int


class Placed(NamedTuple):
    """One chunk of the parent: its addresses and where its bytes are."""
    addr: int
    length: int
    file: str
    index: int               # its place in file's chunks (the manifest's `data`)
    offset: int              # its first byte in file


def whole_entries(entries: list[tuple[int, int, int]], parent_flags,
                  cuts: list[int]) -> tuple[list[tuple[int, int, int]], list[Part]]:
    """CRIU's pagemap entries (address, bytes, flags) made whole: every
    one present (PE_LAZY as the parent had it: parent_flags(address)),
    cut where the parent's entries were cut (cuts: their first and end
    addresses, sorted) and nowhere else (a chunk never spans two entries:
    where the memory did not change, the generation's chunks are then its
    parent's, whatever the written pages did to CRIU's entries); and the
    parts of memory they hold, each from the new pages file or from the
    parent."""
    whole: list[tuple[int, int, int]] = []
    parts: list[Part] = []
    offset = 0
    for addr, length, flags in entries:
        if flags & PE_PARENT:
            flags, source = PE_PRESENT | (parent_flags(addr) & PE_LAZY), None
        elif flags & PE_PRESENT:
            source = offset
            offset += length
        else:
            continue  # (no pages: a zero or a lazy-only entry)
        if whole and whole[-1][0] + whole[-1][1] == addr and whole[-1][2] == flags:
            whole[-1] = (whole[-1][0], whole[-1][1] + length, flags)
        else:
            whole.append((addr, length, flags))
        if parts and parts[-1].addr + parts[-1].length == addr and \
                (parts[-1].new_offset is None) == (source is None) and \
                (source is None or parts[-1].new_offset + parts[-1].length == source):
            parts[-1] = parts[-1]._replace(length=parts[-1].length + length)
        else:
            parts.append(Part(addr, length, source))
    return _cut_at(whole, cuts), parts


def _cut_at(entries: list[tuple[int, int, int]], cuts: list[int]) -> list[tuple[int, int, int]]:
    out = []
    for addr, length, flags in entries:
        end = addr + length
        k = bisect_right(cuts, addr)
        while k < len(cuts) and cuts[k] < end:
            out.append((addr, cuts[k] - addr, flags))
            addr = cuts[k]
            k += 1
        out.append((addr, end - addr, flags))
    return out


def chunk_spans(runs: list[tuple[int, int]], lengths: list[int]) -> list[tuple[int, int]]:
    """(address, length) of each chunk of a pages file cut into lengths
    (images.chunks.cut) over its runs."""
    spans, i, used = [], 0, 0
    for n in lengths:
        while runs[i][1] == used:
            i, used = i + 1, 0
        spans.append((runs[i][0] + used, n))
        used += n
    return spans


def placed_chunks(spans: list[tuple[int, int]], order: list[list],
                  lengths: dict[str, list[int]]) -> list[Placed]:
    """The parent's chunks of one pages file, in address order: spans
    (chunk_spans) with the manifest's order ([data file, index] each) and
    each data file's chunk lengths."""
    starts: dict[str, list[int]] = {}
    for name, ls in lengths.items():
        at, offsets = 0, []
        for n in ls:
            offsets.append(at)
            at += n
        starts[name] = offsets
    out = [Placed(addr, n, str(file), int(index), starts[str(file)][int(index)])
           for (addr, n), (file, index) in zip(spans, order)]
    return sorted(out)


class Parent(NamedTuple):
    """The parent's chunks of one pages file, looked up by address."""
    chunks: list[Placed]                      # in address order (placed_chunks)
    addrs: list[int]                          # their addresses
    by_span: dict[tuple[int, int], Placed]    # (address, length) -> chunk


def parent_of(placed: list[Placed]) -> Parent:
    return Parent(placed, [c.addr for c in placed], {(c.addr, c.length): c for c in placed})


class ParentPages(NamedTuple):
    """One pagemap of the previous generation, as a tracked dump's plan
    takes it (images.chunks.parent_pages reads it)."""
    pages_id: int
    entries: list[tuple[int, int, int]]   # its present entries: (address, bytes, flags)
    addrs: list[int]                      # their addresses
    cuts: list[int]                       # where they begin and end, sorted
    chunks: Parent                        # its chunks by address


def pieces(addr: int, length: int, parts: list[Part], part_at: int,
           parent: list[Placed], parent_addrs: list[int]) -> tuple[list[Piece], int]:
    """Where the bytes of the chunk [addr, addr + length) come from, given
    the parts (from part_at on, the first that reaches addr); and the
    index of the part where the next chunk starts.  KeyError: the parent
    holds no page at an address CRIU left to it."""
    out: list[Piece] = []
    end = addr + length
    while addr < end:
        part = parts[part_at]
        if part.addr + part.length <= addr:
            part_at += 1
            continue
        n = min(end, part.addr + part.length) - addr
        if part.new_offset is not None:
            out.append(Piece(n, None, part.new_offset + addr - part.addr))
        else:
            out.extend(_from_parent(addr, n, parent, parent_addrs))
        addr += n
    return out, part_at


def _from_parent(addr: int, length: int, parent: list[Placed],
                 parent_addrs: list[int]) -> list[Piece]:
    out = []
    while length > 0:
        k = bisect_right(parent_addrs, addr) - 1
        if k < 0 or parent[k].addr + parent[k].length <= addr:
            raise KeyError(f"no page at {addr:#x} in the previous generation")
        c = parent[k]
        n = min(length, c.addr + c.length - addr)
        out.append(Piece(n, c.file, c.offset + addr - c.addr))
        addr, length = addr + n, length - n
    return out


def reused(pieces_: list[Piece], addr: int, length: int,
           by_span: dict[tuple[int, int], Placed]) -> Placed | None:
    """The parent's chunk this one is, unchanged: all its bytes in the
    parent, where one of the parent's chunks had exactly its addresses."""
    if any(p.source is None for p in pieces_):
        return None
    return by_span.get((addr, length))


def chunks_of(spans: list[tuple[int, int]], parts: list[Part],
              parent: Parent) -> list[tuple[int, list[Piece], Placed | None]]:
    """Per chunk of the generation (spans, in address order): its length,
    where its bytes are (pieces()), and the parent's chunk it is, unchanged
    (reused()), or None.  KeyError as pieces()'s."""
    placed, addrs, by_span = parent
    out: list[tuple[int, list[Piece], Placed | None]] = []
    part_at = 0
    for addr, n in spans:
        while parts[part_at].addr + parts[part_at].length <= addr:
            part_at += 1
        part, same = parts[part_at], by_span.get((addr, n))
        # most chunks lie in memory no one wrote, where a parent's chunk was:
        # that chunk, without looking further (~4x faster over 1 GiB)
        if same is not None and part.new_offset is None and part.addr <= addr \
                and addr + n <= part.addr + part.length:
            out.append((n, [Piece(n, same.file, same.offset)], same))
            continue
        pieces_, part_at = pieces(addr, n, parts, part_at, placed, addrs)
        out.append((n, pieces_, reused(pieces_, addr, n, by_span)))
    return out


class Segment(NamedTuple):
    """Bytes of CRIU's new pages file, kept where they are."""
    offset: int
    length: int
    chunk: int | None   # the generation's chunk they are (its index); None: no chunk's
                        # bytes as they lie (pieces of a chunk put together elsewhere)


def in_place(chunks: list[list[Piece]], size: int, limit: int) -> list[Segment]:
    """CRIU's new pages file (size bytes) as it lies, in segments: a chunk
    all of whose bytes are one piece of that file is a segment of its own;
    the file's other bytes (pieces of chunks that also take bytes of the
    parent, or that nothing uses) are segments of no chunk, cut at most
    limit bytes long (a chunk's most: what is hashed in one buffer).
    chunks: every chunk's pieces, in address order, as pieces() gives them.
    ValueError: the file's pieces do not follow each other in it (CRIU
    writes the pages in address order, as the pagemap lists them)."""
    out: list[Segment] = []
    at = 0

    def gap(to: int) -> None:
        start = at
        if out and out[-1].chunk is None and out[-1].offset + out[-1].length == start:
            start = out.pop().offset  # the one before goes on
        while start < to:
            n = min(limit, to - start)
            out.append(Segment(start, n, None))
            start += n

    for i, pieces_ in enumerate(chunks):
        whole = len(pieces_) == 1
        for p in pieces_:
            if p.source is not None:
                continue
            if p.offset < at:
                raise ValueError(f"new pages at {p.offset} come before {at}")
            if whole:
                gap(p.offset)
                out.append(Segment(p.offset, p.length, i))
            else:
                gap(p.offset + p.length)
            at = p.offset + p.length
    if at > size:
        raise ValueError(f"new pages reach {at}, past the file's {size} bytes")
    gap(size)
    return out
