"""images/tracked_pages.py: a dump with pages left in its parent, made whole."""
from __future__ import annotations

import pytest

from dmtcp_py.images.chunks import CHUNK, cut
from dmtcp_py.images.page_chain import PE_LAZY, PE_PARENT, PE_PRESENT
from dmtcp_py.images.tracked_pages import (Part, Piece, Placed, Segment, chunk_spans, chunks_of,
                                           in_place, parent_of, pieces, placed_chunks, reused,
                                           whole_entries)

P = 4096
A = 0x7F0000000000 + 2 * P  # not at a chunk boundary, like CRIU's pipe-sized entries
LAZY = PE_PRESENT | PE_LAZY


def test_the_whole_pagemap_is_cut_where_the_parent_was_and_nowhere_else():
    # the parent: two entries, split where CRIU's page pipe was full
    cuts = [A, A + 254 * P, A + 510 * P]
    crius = [(A, 10 * P, PE_PARENT), (A + 10 * P, 2 * P, LAZY),   # two pages written
             (A + 12 * P, 498 * P, PE_PARENT)]
    whole, parts = whole_entries(crius, lambda addr: LAZY, cuts)
    assert whole == [(A, 254 * P, LAZY), (A + 254 * P, 256 * P, LAZY)]
    assert parts == [Part(A, 10 * P, None), Part(A + 10 * P, 2 * P, 0),
                     Part(A + 12 * P, 498 * P, None)]


def test_written_neighbours_are_one_part_and_offsets_follow_the_new_file():
    crius = [(A, P, PE_PRESENT), (A + P, P, PE_PRESENT), (A + 5 * P, P, PE_PRESENT),
             (A + 6 * P, 2 * P, PE_PARENT)]
    whole, parts = whole_entries(crius, lambda addr: 0, [A, A + 2 * P, A + 5 * P, A + 8 * P])
    assert parts == [Part(A, 2 * P, 0), Part(A + 5 * P, P, 2 * P), Part(A + 6 * P, 2 * P, None)]
    # the parent had no PE_LAZY there: neither has the whole entry
    assert whole == [(A, 2 * P, PE_PRESENT), (A + 5 * P, 3 * P, PE_PRESENT)]


def _parent(runs, order, lengths):
    spans = chunk_spans(runs, [lengths[f][i] for f, i in order])
    placed = placed_chunks(spans, order, lengths)
    return placed, [c.addr for c in placed], {(c.addr, c.length): c for c in placed}


def test_a_chunk_unchanged_in_the_parent_is_the_parents_chunk():
    runs = [(A, 3 * CHUNK)]
    lengths = cut(3 * CHUNK, runs)
    assert lengths[0] == CHUNK - 2 * P  # cut at the address's chunk boundary
    # data file "d": the chunks in another order than their addresses
    order = [["d", 1], ["d", 0], ["d", 2], ["d", 3]]
    files = {"d": [lengths[1], lengths[0], lengths[2], lengths[3]]}
    placed, addrs, by_span = _parent(runs, order, files)
    assert placed[0] == Placed(A, lengths[0], "d", 1, lengths[1])
    parts = [Part(A, CHUNK - 2 * P, None), Part(A + CHUNK - 2 * P, P, 0),
             Part(A + CHUNK - P, 2 * CHUNK + P, None)]
    spans = chunk_spans(runs, lengths)
    got, at = [], 0
    for addr, n in spans:
        ps, at = pieces(addr, n, parts, at, placed, addrs)
        got.append((ps, reused(ps, addr, n, by_span)))
    first, second = got[0], got[1]
    assert first[1] == placed[0]                    # untouched: taken as it was
    assert second[1] is None                        # one page written in it
    assert second[0] == [Piece(P, None, 0),          # from CRIU's new pages file
                         Piece(CHUNK - P, "d", P)]  # the rest, where the parent had it
    assert all(r is not None for _, r in got[2:])
    # chunks_of takes the untouched ones without pieces(), to the same result
    assert chunks_of(spans, parts, parent_of(placed)) == [(n, ps, r) for (_, n), (ps, r)
                                                          in zip(spans, got)]


def test_a_page_the_parent_does_not_hold_is_an_error():
    runs = [(A, 2 * P)]
    placed, addrs, _ = _parent(runs, [["d", 0]], {"d": [2 * P]})
    with pytest.raises(KeyError):
        pieces(A, 4 * P, [Part(A, 4 * P, None)], 0, placed, addrs)
    with pytest.raises(KeyError):
        chunks_of([(A, 4 * P)], [Part(A, 4 * P, None)], parent_of(placed))


def test_whole_new_chunks_stay_where_crius_file_has_them():
    chunks = [[Piece(4 * P, "old", 0)],                         # unchanged
              [Piece(8 * P, None, 0)],                           # all new
              [Piece(2 * P, "old", 4 * P), Piece(P, None, 8 * P)],  # put together
              [Piece(P, None, 9 * P), Piece(P, None, 10 * P)],   # new, but two pieces
              [Piece(4 * P, None, 11 * P)]]
    assert in_place(chunks, 15 * P, CHUNK) == [Segment(0, 8 * P, 1),
                                               Segment(8 * P, 3 * P, None),
                                               Segment(11 * P, 4 * P, 4)]


def test_bytes_no_chunk_uses_are_segments_of_no_chunk():
    chunks = [[Piece(P, None, 2 * P)], [Piece(P, None, 4 * P)]]
    assert in_place(chunks, 6 * P, CHUNK) == [Segment(0, 2 * P, None), Segment(2 * P, P, 0),
                                              Segment(3 * P, P, None), Segment(4 * P, P, 1),
                                              Segment(5 * P, P, None)]
    assert in_place([[Piece(P, "old", 0)]], 0, CHUNK) == []


def test_long_runs_of_no_chunk_are_cut_at_the_limit():
    # three chunks put together in a row: their new pages one run in the file
    chunks = [[Piece(P, "old", 0), Piece(3 * P, None, 3 * i * P)] for i in range(3)]
    assert in_place(chunks, 9 * P, 4 * P) == [Segment(0, 4 * P, None), Segment(4 * P, 4 * P, None),
                                              Segment(8 * P, P, None)]


@pytest.mark.parametrize("chunks, size", [
    ([[Piece(P, None, 4 * P)], [Piece(P, None, 0)]], 8 * P),  # backwards in the file
    ([[Piece(P, None, 0), Piece(P, None, 0)]], 8 * P),        # one piece twice
    ([[Piece(4 * P, None, 0)]], 2 * P),                       # past its end
])
def test_pieces_out_of_the_files_order_are_refused(chunks, size):
    with pytest.raises(ValueError):
        in_place(chunks, size, CHUNK)
