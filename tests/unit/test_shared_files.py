"""images.shared_files: which mapped files a restart may write, the check of
the others, and write-backs that keep the inode and never show a file
half written."""
from __future__ import annotations

import errno
import hashlib
import logging
import mmap
import multiprocessing
import os
import textwrap
import time
from pathlib import Path

import pytest

from dmtcp_py.images import shared_files as sf
from dmtcp_py.images import tree_view as tv
from tests.conftest import ready_python

MAPS = """\
55d0c8a00000-55d0c8a01000 r--p 00000000 fe:00 1001                       /usr/bin/prog
7f0000000000-7f0000007000 r--s 00000000 fe:00 338846                     /usr/lib/gconv/gconv-modules.cache
7f0000010000-7f0000011000 rw-s 00000000 00:1a 77                         /dev/shm/seg
7f0000020000-7f0000021000 rw-s 00000000 00:01 3                          /dev/zero (deleted)
7f0000030000-7f0000031000 rw-s 00000000 00:00 0 
7f0000040000-7f0000041000 r--s 00001000 fe:00 42                         /data/with space.db
7f0000050000-7f0000051000 r--s 00000000 00:1a 78                         /dev/shm/sem.tmp (deleted)
"""

SMAPS = """\
7f0000000000-7f0000007000 r--s 00000000 fe:00 338846                     /usr/lib/gconv/gconv-modules.cache
Size:                 28 kB
Rss:                  28 kB
VmFlags: rd mr me ms
7f0000040000-7f0000041000 r--s 00001000 fe:00 42                         /data/with space.db
Size:                  4 kB
VmFlags: rd sh mr mw me ms
7f0000060000-7f0000061000 r--p 00000000 fe:00 43                         /data/private
Size:                  4 kB
VmFlags: rd mr mw me
"""


def test_maps_give_shared_file_mappings_with_write_from_permissions():
    found = tv.parse_maps(MAPS)
    assert [(m.path, m.ino, m.may_write) for m in found] == [
        ("/usr/lib/gconv/gconv-modules.cache", 338846, False),
        ("/dev/shm/seg", 77, True),
        ("/dev/zero (deleted)", 3, True),
        ("/data/with space.db", 42, False),
        ("/dev/shm/sem.tmp (deleted)", 78, False),
    ]
    assert found[0].dev == os.makedev(0xfe, 0)


def test_smaps_vmflags_mw_decide_may_write():
    found = tv.parse_maps(SMAPS)
    # r--s without mw: opened read-only; r--s with mw: opened for writing
    assert [(m.path, m.may_write) for m in found] == [
        ("/usr/lib/gconv/gconv-modules.cache", False), ("/data/with space.db", True)]


def test_garbage_lines_are_skipped():
    assert tv.parse_maps("nonsense\n\nVmFlags: mw\n7f-7f r--s 0 zz:yy 5 /x\n") == []


def _entry(path, size=100, mtime_ns=1_700_000_000_000_000_000, **more):
    return {"path": path, "size": size, "mtime_ns": mtime_ns, **more}


def test_describe_change_names_size_and_time():
    e = _entry("/d/x", 27028)
    assert sf.describe_change(e, 27028, e["mtime_ns"]) is None
    assert sf.describe_change(e, 27100, e["mtime_ns"]) == \
        "/d/x changed since the checkpoint (size 27028 -> 27100 bytes)"
    later = e["mtime_ns"] + 86_400 * 10**9
    text = sf.describe_change(e, 27100, later)
    assert text.startswith("/d/x changed since the checkpoint (size 27028 -> 27100 bytes, "
                           f"modified {sf._when(later)}, was {sf._when(e['mtime_ns'])})")
    assert "\n" not in text


def test_describe_change_within_one_second_shows_nanoseconds():
    e = _entry("/d/x", mtime_ns=1_700_000_000_000_000_001)
    text = sf.describe_change(e, 100, 1_700_000_000_000_000_002)
    assert ".000000002, was " in text and text.endswith(".000000001)")


def _stat_entry(path: Path) -> dict:
    entry = sf.describe(str(path))
    assert entry is not None
    return entry


def test_changed_sees_gone_grown_and_rewritten(tmp_path):
    f = tmp_path / "data"
    f.write_bytes(b"a" * 100)
    entry = _stat_entry(f)
    assert entry["sha256"] == hashlib.sha256(b"a" * 100).hexdigest()
    assert sf.changed(entry) is None
    f.write_bytes(b"b" * 100)
    os.utime(f, ns=(entry["mtime_ns"] + 5 * 10**9,) * 2)
    assert "modified" in sf.changed(entry)
    f.write_bytes(b"a" * 101)
    assert "size 100 -> 101 bytes" in sf.changed(entry)
    f.unlink()
    assert sf.changed(entry) == f"{f} is gone since the checkpoint"
    f.mkdir()
    assert sf.changed(entry) == f"{f} is no longer a regular file"


def test_same_bytes_at_another_mtime_is_not_a_change(tmp_path):
    """Another host's copy of the same file: same bytes, other mtime."""
    f = tmp_path / "data"
    f.write_bytes(b"same")
    entry = _stat_entry(f)
    os.utime(f, ns=(entry["mtime_ns"] - 10**12,) * 2)
    assert sf.changed(entry) is None
    del entry["sha256"]  # a large file has no digest: the mtime decides
    assert "modified" in sf.changed(entry)


def test_changed_files_skips_paths_another_tree_writes_back(tmp_path):
    f = tmp_path / "seg"
    f.write_bytes(b"x")
    reader = _entry(str(f), size=5)
    assert len(sf.changed_files([reader])) == 1
    writer = {"path": str(f), "data": "shared-0.data", "mode": 0o600, "uid": 0, "gid": 0}
    assert sf.changed_files([reader, writer]) == []


@pytest.fixture
def lockdir(tmp_path, monkeypatch):
    """Write-back lock files go to the run directory: a private one."""
    monkeypatch.setenv("DMTCP_TMPDIR", str(tmp_path / "run"))
    return tmp_path


def _kept(image: Path, path: Path, data: bytes, mode: int = 0o640) -> dict:
    (image / "shared-0.data").write_bytes(data)
    return {"path": str(path), "data": "shared-0.data", "mode": mode,
            "uid": os.getuid(), "gid": os.getgid()}


def test_put_back_same_bytes_writes_nothing(lockdir):
    target = lockdir / "f"
    target.write_bytes(b"data" * 1000)
    os.chmod(target, 0o640)
    entry = _kept(lockdir, target, b"data" * 1000)
    before = os.stat(target)
    time.sleep(0.01)
    assert sf.put_back(entry, lockdir) is False
    after = os.stat(target)
    assert (after.st_ino, after.st_mtime_ns, after.st_ctime_ns) == \
        (before.st_ino, before.st_mtime_ns, before.st_ctime_ns)


@pytest.mark.parametrize("now", [b"", b"short", b"x" * (3 * sf.CHUNK + 5)])
def test_put_back_rewrites_in_place(lockdir, now):
    target = lockdir / "f"
    target.write_bytes(now)
    ino = os.stat(target).st_ino
    want = bytes(range(256)) * (sf.CHUNK // 128)  # two chunks
    entry = _kept(lockdir, target, want, mode=0o604)
    assert sf.put_back(entry, lockdir) is True
    assert target.read_bytes() == want
    st = os.stat(target)
    assert st.st_ino == ino and st.st_mode & 0o7777 == 0o604


def test_put_back_makes_a_missing_file_whole(lockdir):
    target = lockdir / "sub" / "f"
    entry = _kept(lockdir, target, b"payload", mode=0o600)
    assert sf.put_back(entry, lockdir) is True
    assert target.read_bytes() == b"payload" and os.stat(target).st_mode & 0o7777 == 0o600
    assert sorted(p.name for p in target.parent.iterdir()) == ["f"]  # no temporary names


def test_put_back_only_if_missing_leaves_a_file_alone(lockdir):
    target = lockdir / "f"
    target.write_bytes(b"newer")
    entry = _kept(lockdir, target, b"older")
    assert sf.put_back(entry, lockdir, only_if_missing=True) is False
    assert target.read_bytes() == b"newer"


def _write_back(entry: dict, image: str, rounds: int) -> None:
    for _ in range(rounds):
        sf.put_back(entry, Path(image))


def test_trees_writing_back_at_once_never_show_another_size(lockdir):
    """Several agents put the same file back while a CRIU-like reader looks
    at its size: it is only ever the old or the final one (the issue saw 0)."""
    target = lockdir / "cache"
    old = os.urandom(3 * sf.CHUNK + 17)
    final = os.urandom(2 * sf.CHUNK + 5)
    target.write_bytes(old)
    images = []
    for n in range(4):
        image = lockdir / f"image{n}"
        image.mkdir()
        images.append((_kept(image, target, final, mode=0o644), str(image)))
    ctx = multiprocessing.get_context("fork")
    writers = [ctx.Process(target=_write_back, args=(entry, image, 5)) for entry, image in images]
    sizes = set()
    for w in writers:
        w.start()
    try:
        while any(w.is_alive() for w in writers):
            sizes.add(os.stat(target).st_size)
    finally:
        for w in writers:
            w.join(timeout=30)
            if w.is_alive():
                w.kill()
                w.join()
    assert all(w.exitcode == 0 for w in writers)
    assert sizes <= {len(old), len(final)}
    assert target.read_bytes() == final


CHILD = textwrap.dedent("""
    import mmap, os, sys
    d = sys.argv[1]
    def mapped(name, flags, prot):
        fd = os.open(os.path.join(d, name), flags)
        m = mmap.mmap(fd, 4096, mmap.MAP_SHARED, prot)
        os.close(fd)
        return m
    ro = mapped("ro", os.O_RDONLY, mmap.PROT_READ)
    rw_fd = mapped("rw_fd", os.O_RDWR, mmap.PROT_READ)  # may be made writable
    rw = mapped("rw", os.O_RDWR, mmap.PROT_READ | mmap.PROT_WRITE)
    by_fd = mapped("by_fd", os.O_RDONLY, mmap.PROT_READ)
    writer = os.open(os.path.join(d, "by_fd"), os.O_WRONLY)  # written through an fd
    print("ready", flush=True)
    sys.stdin.read()
""")


@pytest.fixture
def mapper(tmp_path):
    """A live process holding four shared mappings of files in tmp_path."""
    for name in ("ro", "rw_fd", "rw", "by_fd"):
        (tmp_path / name).write_bytes(b"z" * 4096)
    with ready_python(CHILD, str(tmp_path)) as pid:
        yield pid


def test_mapped_files_tell_what_the_tree_could_write(tmp_path, mapper):
    found = {Path(f.path).name: f.writable for f in tv.mapped_files(tv.TreeView.read([mapper]))
             if Path(f.path).parent == tmp_path}
    assert found == {"ro": False, "rw_fd": True, "rw": True, "by_fd": True}


def test_save_copies_only_what_may_be_written(tmp_path, monkeypatch):
    monkeypatch.setattr(sf.scratch, "is_scratch", lambda path: False)  # tmp_path: a disk here
    for name in ("ro", "rw", "plain"):
        (tmp_path / name).write_bytes(name.encode())
    image = tmp_path / "image"
    image.mkdir()
    entries = sf.save([tv.MappedFile(str(tmp_path / "ro"), False),
                       tv.MappedFile(str(tmp_path / "rw"), True),
                       str(tmp_path / "plain"),        # a plain path: as before, kept
                       tv.MappedFile(str(tmp_path / "gone"), False)], image)
    by_name = {Path(e["path"]).name: e for e in entries}
    assert set(by_name) == {"ro", "rw", "plain"}
    assert "data" not in by_name["ro"] and by_name["ro"]["size"] == 2
    assert by_name["rw"]["data"] == "shared-1.data" and by_name["plain"]["data"] == "shared-2.data"
    assert sorted(p.name for p in image.iterdir()) == ["shared-1.data", "shared-2.data"]


def test_save_keeps_a_read_only_scratch_file_to_make_if_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(sf.scratch, "ROOTS", (str(tmp_path),))
    (tmp_path / "seg").write_bytes(b"scratch")
    image = tmp_path / "image"
    image.mkdir()
    [entry] = sf.save([tv.MappedFile(str(tmp_path / "seg"), False)], image)
    assert entry["only_if_missing"] is True and (image / entry["data"]).read_bytes() == b"scratch"


def test_restore_writes_back_old_entries_and_never_read_only_ones(lockdir, caplog):
    image = lockdir / "image"
    image.mkdir()
    old_style = lockdir / "old"
    old_style.write_bytes(b"after the checkpoint")
    kept = _kept(image, old_style, b"at the checkpoint")  # an entry made before issue 20
    read_only = lockdir / "ro"
    read_only.write_bytes(b"ro")
    checked = _stat_entry(read_only)
    read_only.write_bytes(b"changed")
    before = os.stat(read_only)
    with caplog.at_level(logging.WARNING, logger="images.shared"):
        sf.restore([kept, checked], image)
    assert old_style.read_bytes() == b"at the checkpoint"
    assert read_only.read_bytes() == b"changed"
    assert os.stat(read_only).st_mtime_ns == before.st_mtime_ns
    assert f"{read_only} changed since the checkpoint" in caplog.text


def test_a_mapping_keeps_seeing_a_rewrite_in_place(lockdir):
    """Kept inode: a process that maps the file sees the bytes put back."""
    target = lockdir / "f"
    target.write_bytes(b"a" * 4096)
    entry = _kept(lockdir, target, b"b" * 4096)
    with open(target, "rb") as f, mmap.mmap(f.fileno(), 4096, mmap.MAP_SHARED, mmap.PROT_READ) as m:
        sf.put_back(entry, lockdir)
        assert m[:4] == b"bbbb"


@pytest.mark.parametrize("kernel", ["copies all", "copies part, then refuses", "refuses"])
def test_a_kept_file_is_copied_whole_by_the_kernel_or_without_it(tmp_path, monkeypatch, kernel):
    data = os.urandom(3 * sf.CHUNK + 123)
    (tmp_path / "kept").write_bytes(data)
    sendfile = os.sendfile

    def partly(out_fd, in_fd, offset, count):
        if offset == 0 and kernel == "copies part, then refuses":
            return sendfile(out_fd, in_fd, offset, 12345)
        if kernel != "copies all":
            raise OSError(errno.EINVAL, "not between these file systems")
        return sendfile(out_fd, in_fd, offset, count)

    monkeypatch.setattr(os, "sendfile", partly)
    fd = os.open(tmp_path / "copy", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        with open(tmp_path / "kept", "rb") as src:
            sf._copy_into(fd, src)
    finally:
        os.close(fd)
    assert (tmp_path / "copy").read_bytes() == data
