"""agent.criu_driver.FilesImage: CRIU's files.img read once per dump as
protobuf messages, fixed and written again only when an entry changes, and
the names of link remaps taken from the same reading.  The bytes it writes
are the ones pycriu's dict round trip wrote before (issue 20)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

pycriu = pytest.importorskip("pycriu")
images = pycriu.images

from dmtcp_py.agent import criu_driver  # noqa: E402

FOWN = {"uid": 0, "euid": 0, "signum": 0, "pid_type": 0, "pid": 0}


def reg(id_: int, name: str, **more) -> dict:
    return {"type": "REG", "id": id_,
            "reg": {"id": id_, "flags": 0, "pos": 0, "fown": FOWN, "name": name,
                    "mode": 0o100644, **more}}


def tfd(id_: int, vsec: int, vnsec: int, isec: int, insec: int) -> dict:
    return {"type": "TIMERFD", "id": id_,
            "tfd": {"id": id_, "flags": 0, "fown": FOWN, "clockid": 1, "ticks": 3,
                    "settime_flags": 0, "vsec": vsec, "vnsec": vnsec, "isec": isec,
                    "insec": insec}}


CLEAN = [
    reg(1, "/usr/bin/prog", size=772240, build_id=[3862441960, 629466760, 4018959781]),
    reg(2, "/dev/null", flags=os.O_RDONLY | os.O_LARGEFILE, mode=0o20666),
    # the stdio file as an earlier fix left it: nothing to change
    reg(3, "file[1b:20e095]", flags=os.O_WRONLY | os.O_APPEND | os.O_LARGEFILE, ext=True),
    {"type": "PIPE", "id": 4, "pipe": {"id": 4, "pipe_id": 3120004, "flags": 1, "fown": FOWN}},
    tfd(5, vsec=0, vnsec=500, isec=1, insec=0),      # armed: left alone
    tfd(6, vsec=0, vnsec=0, isec=0, insec=0),        # one-shot, expired: left alone
]
TO_FIX = [
    # written stdio at a dump-time size and offset, opened with O_EXCL
    reg(7, "file[1b:30]", flags=os.O_WRONLY | os.O_EXCL | os.O_NOFOLLOW, pos=77, size=1234,
        ext=True),
    # read stdio: keeps its offset, loses only its size and open-time flags
    reg(8, "file[1b:31]", flags=os.O_RDONLY | os.O_NOFOLLOW, pos=3, size=5, ext=True),
    tfd(9, vsec=0, vnsec=0, isec=1, insec=0),        # periodic, fired: re-armed
]


def write(directory: Path, entries: list[dict], name: str = "files.img",
          magic: str = "FILES") -> Path:
    path = directory / name
    with open(path, "wb") as f:
        images.dump({"magic": magic, "entries": [dict(e) for e in entries]}, f)
    return path


# ---- the dict round trip this replaced, as the reference for the bytes ------

def _old_unpin(entry: dict) -> bool:
    r = entry.get("reg")
    if not (r and r.get("ext")):
        return False
    r.pop("size", None)
    flags = r.get("flags", 0) & ~criu_driver._OPEN_TIME_ONLY
    if flags & os.O_ACCMODE != os.O_RDONLY:
        flags |= os.O_APPEND
        r["pos"] = 0
    r["flags"] = flags
    return True


def _old_rearm(entry: dict) -> bool:
    t = entry.get("tfd")
    if not t or not (t.get("isec") or t.get("insec")) or t.get("vsec") or t.get("vnsec"):
        return False
    t["vnsec"] = 1
    return True


def old_fix(path: Path) -> bytes:
    with open(path, "rb") as f:
        img = images.load(f)
    for entry in img["entries"]:
        any([fix(entry) for fix in (_old_unpin, _old_rearm)])
    out = path.with_name("reference.img")
    with open(out, "wb") as f:
        images.dump(img, f)
    return out.read_bytes()


# ---- fix -----------------------------------------------------------------------

def test_fixes_write_what_the_dict_round_trip_wrote(tmp_path):
    path = write(tmp_path, CLEAN + TO_FIX)
    expected = old_fix(path)
    assert criu_driver.fix_files_image(tmp_path) == len(TO_FIX)
    assert path.read_bytes() == expected
    by_id = {e["id"]: e for e in images.load(open(path, "rb"))["entries"]}
    assert "size" not in by_id[7]["reg"] and by_id[7]["reg"]["pos"] == 0
    assert by_id[7]["reg"]["flags"] == os.O_WRONLY | os.O_APPEND
    assert by_id[8]["reg"]["pos"] == 3 and by_id[8]["reg"]["flags"] == os.O_RDONLY
    assert by_id[9]["tfd"]["vnsec"] == 1 and by_id[5]["tfd"]["vnsec"] == 500
    assert not (tmp_path / "files.img.tmp").exists()


def test_nothing_to_fix_leaves_the_file_alone(tmp_path):
    path = write(tmp_path, CLEAN)
    before = os.stat(path)
    assert criu_driver.FilesImage(tmp_path).fix() == 0
    after = os.stat(path)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_a_fixed_image_needs_no_second_fix(tmp_path):
    path = write(tmp_path, CLEAN + TO_FIX)
    criu_driver.fix_files_image(tmp_path)
    fixed = path.read_bytes()
    assert criu_driver.fix_files_image(tmp_path) == 0
    assert path.read_bytes() == fixed


def test_messages_written_back_unchanged_are_the_bytes_read(tmp_path):
    path = write(tmp_path, CLEAN)
    files = criu_driver.FilesImage(tmp_path)
    again = files.head + b"".join(criu_driver._INT.pack(len(p)) + p
                                  for p in (e.SerializeToString() for e in files.entries))
    assert again == path.read_bytes()


@pytest.mark.parametrize("data", [b"", b"\x01\x02", b"\x00" * 8])
def test_not_a_files_image(tmp_path, data):
    (tmp_path / "files.img").write_bytes(data)
    with pytest.raises(criu_driver.CriuError, match="not a CRIU FILES image"):
        criu_driver.FilesImage(tmp_path)


def test_a_cut_image(tmp_path):
    path = write(tmp_path, CLEAN)
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(criu_driver.CriuError, match="cut short"):
        criu_driver.FilesImage(tmp_path)


def test_another_image_kind_is_refused(tmp_path):
    write(tmp_path, [{"orig_id": 1, "remap_id": 2}], name="files.img", magic="REMAP_FPATH")
    with pytest.raises(criu_driver.CriuError):
        criu_driver.FilesImage(tmp_path)


# ---- link remaps ------------------------------------------------------------------

def test_no_remap_image_no_remaps(tmp_path):
    write(tmp_path, CLEAN)
    assert criu_driver.link_remaps(tmp_path) == []


def test_link_remaps_name_linked_ones_from_the_same_reading(tmp_path):
    files = CLEAN + [reg(20, "/dev/shm/sem.tmpXYZ"), reg(21, "/dev/shm/link_remap.3"),
                     reg(22, "/dev/shm/ghost"), reg(23, "/dev/shm/other")]
    write(tmp_path, files)
    write(tmp_path, [{"orig_id": 20, "remap_id": 21},                       # LINKED (default)
                     {"orig_id": 23, "remap_id": 21, "remap_type": "LINKED"},
                     {"orig_id": 22, "remap_id": 1, "remap_type": "GHOST"},  # not a link
                     {"orig_id": 20, "remap_id": 99}],                      # unknown id
          name="remap-fpath.img", magic="REMAP_FPATH")
    expected = [("/dev/shm/link_remap.3", "/dev/shm/sem.tmpXYZ"),
                ("/dev/shm/link_remap.3", "/dev/shm/other")]
    assert criu_driver.link_remaps(tmp_path) == expected
    files_img = criu_driver.FilesImage(tmp_path)
    files_img.fix()
    assert files_img.link_remaps() == expected
