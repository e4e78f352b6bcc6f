"""An incremental generation restored from its data files as they are,
through CRIU's own parent images: nothing is copied.

A generation of chunks (images.chunks) keeps a process's memory pages as
chunks spread over data files that several generations share.  CRIU reads
a pages file front to back, as far as its pagemap says; but an entry
flagged PE_PARENT is read from the same address in the image directory's
`parent`, which may have a parent of its own.  So a restart reads through
a view of hard links and small pagemaps:

  view/                 every file of the generation but its data files;
                        per process, a pagemap whose entries are all in
                        the parent, and an empty pages file;
  view/parent/          per process, one data file as its pages file, and
                        a pagemap saying at which address each of its
                        chunks goes; the addresses whose chunk another
                        data file holds are in the parent again;
  view/parent/parent/   and so on, a level per data file a process reads.

Putting each pages file together instead (a copy of every chunk, before
CRIU starts) made the restart of a 1 GiB generation that shared its
chunks with the previous one ~1.2 s slower than that of a whole one here.

CRIU looks addresses up in a parent's pagemap going forward only
(pagemap.c, seek_pagemap: the restore asks in rising addresses, and the
lazy-pages daemon starts again from the top for each fault).  So, within
a level, a data file's chunks must be used in file order and at rising
addresses: a level is a chain of such uses, and a chunk used out of that
order (a mapping that moved down, a chunk used twice) goes into another
chain, a level further down.  The bytes of a data file that its level does
not use are passed over by present entries at address 0 that nothing asks
for: CRIU moves past an entry that ends at or below the address it seeks,
counting its bytes, so each of these ends below the next address sought.
"""
from __future__ import annotations

import os
import struct
from collections import namedtuple
from pathlib import Path

PAGE = 4096
PE_PARENT, PE_LAZY, PE_PRESENT = 1, 2, 4
_INT = struct.Struct("i")


# (collections' namedtuple, not typing's NamedTuple: typing's import,
# ~4 ms, would stand before CRIU in a restart that reads through a view)

# a pagemap image: its magic numbers as read (bytes), its pages file's id,
# and its entries (Entry each, in order)
Pagemap = namedtuple("Pagemap", "prefix pages_id entries")

# one chunk at its place in the process's memory: address, bytes, the data
# file that holds it and where in that file
Use = namedtuple("Use", "addr length source offset")

# an entry of a pagemap: address, bytes, flags (PE_*)
Entry = namedtuple("Entry", "vaddr length flags")


# ---- pagemap images -------------------------------------------------------------------

# The two messages, read and written here rather than through pycriu's
# protobuf classes (criu/images/pagemap.proto; the head first, then an
# entry per run of pages, each behind its 32-bit size): a 1 GiB dump's
# ~1000 entries read in 4.0 ms against 6.9 ms through upb and the
# conversion to Entry, and no import of pycriu's classes (below) on a
# checkpoint's and a restart's path.  Every field is a varint:
#   pagemap_head  { required uint32 pages_id = 1; }
#   pagemap_entry { required uint64 vaddr = 1; required uint32 compat_nr_pages = 2;
#                   optional bool in_parent = 3; optional uint32 flags = 4;
#                   optional uint64 nr_pages = 5; }
_MAGICS = {"IMG_COMMON": 0x54564319, "IMG_SERVICE": 0x55105940, "PAGEMAP": 0x56084025}


def _message_at(raw: bytes, at: int, end: int) -> dict[int, int]:
    """field number -> value of the message in raw[at:end].  ValueError:
    a field these messages do not have (every key is one byte here, each
    value a varint)."""
    fields = {}
    while at < end:
        key = raw[at]
        if key & 7 or not 0x08 <= key <= 0x28:
            raise ValueError(f"field key {key:#x} in a pagemap")
        value, shift = 0, 0
        while True:  # (inline: a call per varint took a third of the time)
            byte = raw[at + 1]
            at += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                break
            shift += 7
        fields[key >> 3] = value
        at += 1
    if at != end:
        raise ValueError("a message runs past its size")
    return fields


def _entry(fields: dict[int, int]) -> Entry:
    """An entry as CRIU reads it (pagemap.c, init_compat_pagemap_entry):
    its bytes, and its flags, PE_PARENT for in_parent."""
    pages = fields[5] if 5 in fields else fields[2]
    if fields.get(3):
        flags = PE_PARENT | fields.get(4, 0)
    else:
        flags = fields.get(4, PE_PRESENT)
    return Entry(fields[1], pages * PAGE, flags)


def read_pagemap(path: Path) -> Pagemap | None:
    """A pagemap image's head and entries; None if it cannot be read as one."""
    try:
        raw = path.read_bytes()
        (value,), at = _INT.unpack_from(raw), 4
        if value in (_MAGICS["IMG_COMMON"], _MAGICS["IMG_SERVICE"]):
            (value,), at = _INT.unpack_from(raw, 4), 8
        if value != _MAGICS["PAGEMAP"]:
            return None
        prefix, pages_id, entries = raw[:at], None, []
        size_of, size, total = _INT.unpack_from, _INT.size, len(raw)
        while at < total:
            body = at + size
            end = body + size_of(raw, at)[0]
            if end > total:
                return None
            fields = _message_at(raw, body, end)
            if pages_id is None:
                pages_id = fields[1]
            else:
                entries.append(_entry(fields))
            at = end
        return Pagemap(prefix, pages_id, entries) if pages_id is not None else None
    except (OSError, struct.error, ValueError, KeyError, IndexError):
        return None


def present(entry: Entry) -> bool:
    """The entry's pages are in its own pages file."""
    return (entry.flags & (PE_PRESENT | PE_PARENT)) == PE_PRESENT


_SMALL = [bytes((n,)) for n in range(0x80)]  # the varints of one byte


def _varint(value: int) -> bytes:
    if value < 0x80:
        return _SMALL[value]
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _framed(body: bytes) -> bytes:
    return _INT.pack(len(body)) + body


def write_pagemap(path: Path, prefix: bytes, pages_id: int,
                  entries: list[Entry] | list[tuple[int, int, int]]) -> None:
    """A pagemap image, as CRIU writes one (nr_pages, compat_nr_pages 0).
    Encoded here too: pycriu's classes encode 1000 entries in 1.8 ms
    against 2.6, but importing them takes 55-70 ms, which stood before
    CRIU in every restart of an incremental generation."""
    parts = [prefix, _framed(b"\x08" + _varint(pages_id))]
    parts += [_framed(b"".join((b"\x08", _varint(vaddr), b"\x10\x00\x20", _varint(flags),
                                b"\x28", _varint(length // PAGE))))
              for vaddr, length, flags in entries]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(b"".join(parts))


# ---- the plan: pure -------------------------------------------------------------------

def chains(uses: list[Use]) -> list[list[Use]]:
    """The uses (in rising addresses) cut into chains, each of one data
    file at rising offsets; the fewest this greedy way finds: each use
    goes on the chain of its file that reached furthest below it."""
    out: list[list[Use]] = []
    for use in uses:
        best = None
        for chain in out:
            last = chain[-1]
            if last.source == use.source and last.offset + last.length <= use.offset and \
                    (best is None or last.offset > best[-1].offset):
                best = chain
        if best is None:
            out.append([use])
        else:
            best.append(use)
    return out


def level_entries(uses: list[Use], level: list[Use], deeper: set[int]) -> list[Entry]:
    """The pagemap of one level: its own chunks present (and the bytes of
    its data file it does not use passed over), the addresses of deeper
    levels (deeper: their uses' addresses) in the parent.  uses: every use,
    in rising addresses.  An entry goes on into the next use when that
    has its flags and follows it (a present one only ever follows its own
    bytes: a gap in the data file puts an entry at 0 between)."""
    own = {u.addr for u in level}
    out: list[Entry] = []
    at = 0  # how far into the data file the entries have gone
    cur: list[int] | None = None  # the entry being made: [vaddr, length, flags]
    for use in uses:
        addr = use.addr
        if addr in own:
            flags = PE_PRESENT
            gap = use.offset - at
            if gap > 0:
                if cur is not None:
                    out.append(Entry(*cur))
                    cur = None
                while gap > 0:  # (each piece ends below every address sought after it)
                    step = min(gap, max(PAGE, addr // PAGE * PAGE))
                    out.append(Entry(0, step, PE_PRESENT))
                    gap -= step
            at = use.offset + use.length
        elif addr in deeper:
            flags = PE_PARENT
        else:
            continue
        if cur is not None and cur[2] == flags and cur[0] + cur[1] == addr:
            cur[1] += use.length
        else:
            if cur is not None:
                out.append(Entry(*cur))
            cur = [addr, use.length, flags]
    if cur is not None:
        out.append(Entry(*cur))
    return out


def top_entries(pagemap: Pagemap) -> list[Entry]:
    """The view's own pagemap: the dump's entries, all in the parent."""
    return [Entry(e.vaddr, e.length, (e.flags & ~PE_PRESENT) | PE_PARENT)
            for e in pagemap.entries]


def uses_of(pagemap: Pagemap, order: list[tuple[str, int, int]]) -> list[Use] | None:
    """Each chunk of a pages file (order: data file, offset there, length;
    in the file's order) at its address, from the dump's pagemap; None if
    they do not fit it (an entry not present, a chunk across two)."""
    uses: list[Use] = []
    k = 0
    for e in pagemap.entries:
        if not present(e):
            return None
        addr, left = e.vaddr, e.length
        while left > 0:
            if k >= len(order) or order[k][2] > left or order[k][2] % PAGE:
                return None
            source, offset, n = order[k]
            uses.append(Use(addr, n, source, offset))
            addr, left, k = addr + n, left - n, k + 1
    return uses if k == len(order) else None


# ---- the view ---------------------------------------------------------------------------

# per process pagemap name: the dump's pagemap and its chunks' uses
# ({name: (Pagemap, [Use])})
Plan = namedtuple("Plan", "processes")


def plan(directory: Path, pages: dict[str, list[tuple[str, int, int]]]) -> Plan | None:
    """pages: the pages-N.img files of the dump to read through levels,
    each its chunks (data file, offset, length).  None when a pagemap does
    not fit its chunks: the caller puts the pages files together instead."""
    processes = {}
    for path in directory.glob("pagemap-*.img"):
        pm = read_pagemap(path)
        if pm is None:
            return None
        order = pages.get(f"pages-{pm.pages_id}.img")
        if order is None:  # (its pages file is a data file as it is)
            continue
        uses = uses_of(pm, order)
        if uses is None:
            return None
        processes[path.name] = (pm, uses)
    return Plan(processes) if len(processes) == len(pages) else None


def build(directory: Path, p: Plan, view: Path) -> None:
    """The levels of the view (view exists and holds the generation's
    other files): pagemaps written, data files hard-linked (view is on the
    same file system as directory)."""
    levels: dict[str, list[list[Use]]] = {}
    for name, (pm, uses) in p.processes.items():
        levels[name] = chains(uses)
        write_pagemap(view / name, pm.prefix, pm.pages_id, top_entries(pm))
        (view / f"pages-{pm.pages_id}.img").touch(mode=0o600, exist_ok=False)
    here, depth = view, 0
    while any(len(c) > depth for c in levels.values()):
        here = here / "parent"
        here.mkdir(mode=0o700)
        for name, (pm, uses) in p.processes.items():
            mine = levels[name]
            if len(mine) <= depth:
                continue
            deeper = {u.addr for chain in mine[depth + 1:] for u in chain}
            write_pagemap(here / name, pm.prefix, pm.pages_id,
                          level_entries(uses, mine[depth], deeper))
            os.link(directory / mine[depth][0].source, here / f"pages-{pm.pages_id}.img")
        depth += 1
