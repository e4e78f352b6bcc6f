"""images/follow.py: page files hashed while they are written give the
digest seal() takes of the whole file, and every fd it opened is closed,
whether the image is sealed or dropped.  Real files, a writer appending
to them as CRIU does."""
from __future__ import annotations

import os
import time

import xxhash
import pytest

from dmtcp_py.images import chunks, follow, integrity

WAIT = 10.0  # seconds the follower may take to catch up (never asserted as a speed)


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def _caught_up(follower: follow.PageFollower, name: str, size: int) -> None:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        f = follower.files.get(name)
        if f is not None and f.hashed == size:
            return
        time.sleep(0.005)
    pytest.fail(f"the follower did not hash {name} up to {size} bytes")


@pytest.mark.parametrize("writeback", [False, True])
def test_a_file_hashed_while_written_has_the_whole_files_digest(tmp_path, writeback):
    before = _open_fds()
    pages, other = tmp_path / "pages-1.img", tmp_path / "core-1.img"
    first, rest = os.urandom(9 << 20), os.urandom(3 << 20)
    follower = follow.PageFollower(tmp_path, writeback=writeback)
    follower.start()
    with open(pages, "wb") as out:
        out.write(first)
        out.flush()
        _caught_up(follower, pages.name, len(first))
        follower.stop()
        out.write(rest)  # what CRIU wrote after the follower's last look
    other.write_bytes(b"not followed")
    followed = follower.taken()
    assert followed[pages.name].hashed == len(first)
    sealed = integrity.seal(tmp_path, followed=followed)
    assert sealed.digests[pages.name] == xxhash.xxh3_128(first + rest).hexdigest()
    assert sealed.digests[other.name] == xxhash.xxh3_128(b"not followed").hexdigest()
    assert sealed.sizes[pages.name] == len(first) + len(rest)
    assert _open_fds() == before


def _following_a_page_file(tmp_path) -> follow.PageFollower:
    follower = follow.PageFollower(tmp_path)
    follower.start()
    (tmp_path / "pages-1.img").write_bytes(b"x" * 4096)
    _caught_up(follower, "pages-1.img", 4096)
    return follower


def test_a_dropped_image_closes_what_was_followed(tmp_path):
    before = _open_fds()
    _following_a_page_file(tmp_path).close()
    assert _open_fds() == before


def test_a_seal_that_fails_still_closes_them(tmp_path):
    before = _open_fds()
    follower = _following_a_page_file(tmp_path)
    follower.stop()
    with pytest.raises(FileNotFoundError):
        integrity.seal(tmp_path / "gone", followed=follower.taken())
    assert _open_fds() == before


@pytest.mark.parametrize("start", [0, 5, 4096 + 7])
def test_hash_more_maps_from_where_it_is_and_goes_on_where_a_writer_got(tmp_path, monkeypatch,
                                                                        start):
    monkeypatch.setattr(chunks, "MAP_FROM", 1 << 10)         # mapped, not read
    monkeypatch.setattr(integrity, "_WIDE_STEP", 3 << 10)    # several updates, the last short
    path = tmp_path / "pages-1.img"
    data, more = os.urandom((20 << 10) + 11), os.urandom(3000)
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.lseek(fd, start, os.SEEK_SET)
        h = integrity.hasher(integrity.ALGORITHM)
        assert integrity.hash_more(fd, h) == len(data) - start
        assert os.lseek(fd, 0, os.SEEK_CUR) == len(data)
        with open(path, "ab") as writer:
            writer.write(more)   # appended after: mapped from an offset within a page
        assert integrity.hash_more(fd, h) == len(more)
        assert integrity.hash_more(fd, h) == 0
    finally:
        os.close(fd)
    assert h.hexdigest() == xxhash.xxh3_128(data[start:] + more).hexdigest()
