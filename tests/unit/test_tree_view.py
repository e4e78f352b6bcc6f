"""tree_view.TreeView: what a checkpoint asks of the tree's processes,
read from /proc once (issue 20), and the modules that take it instead of
walking /proc each: shared_files (mapped_files, deleted_aliases),
temp_files.save, written_files.collect."""
from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from dmtcp_py import procfs
from dmtcp_py.agent import fdtable
from dmtcp_py.images import procmap_query, temp_files, written_files
from dmtcp_py.images import tree_view as tv
from tests.conftest import ready_python
from tests.unit.test_shared_files import SMAPS  # one sample of smaps for both



def fd(path: Path | str, flags: int | None = os.O_WRONLY, *, n: str = "3",
       target: str | None = None, pid: int = 1) -> tv.OpenFd:
    """An fd as TreeView.read would see it, of a file that exists."""
    st = os.stat(path) if os.path.exists(path) else None
    return tv.OpenFd(pid, n, str(path) if target is None else target, st, flags)


# ---- consumers on a view made by hand ---------------------------------------------

def test_written_files_from_a_view(tmp_path):
    log, data, ro = tmp_path / "log", tmp_path / "data", tmp_path / "ro"
    log.write_bytes(b"12345")
    data.write_bytes(b"")
    ro.write_bytes(b"r")
    view = tv.TreeView([], [
        fd(log, os.O_WRONLY | os.O_APPEND),
        fd(data, os.O_RDWR, n="4"),
        fd(data, os.O_RDWR, n="5", pid=2),          # one entry per path
        fd(ro, os.O_RDONLY, n="6"),                 # only read
        fd(tmp_path, os.O_RDONLY | os.O_DIRECTORY, n="7"),
        fd(log, None, n="8"),                       # no fdinfo: as before, left out
        fd(log, os.O_WRONLY, n="9", target=f"{log} (deleted)"),
        tv.OpenFd(1, "10", "socket:[5]", None, None),
        tv.OpenFd(1, "11", None, None, None),       # gone meanwhile
    ])
    assert written_files.collect(view, set()) == [
        {"path": str(data), "size": 0, "inode": os.stat(data).st_ino},
        {"path": str(log), "size": 5, "inode": os.stat(log).st_ino}]
    assert [e["path"] for e in written_files.collect(view, {str(log)})] == [str(data)]


def test_temp_files_from_a_view(tmp_path, monkeypatch):
    monkeypatch.setattr(temp_files.scratch, "ROOTS", (str(tmp_path),))
    session = tmp_path / "ompi" / "pid.7"
    session.mkdir(parents=True)
    (session / "topo").write_bytes(b"xml")
    (session / "kept").write_bytes(b"elsewhere")
    os.mkfifo(session / "fifo")
    image = tmp_path / "image"
    image.mkdir()
    view = tv.TreeView([], [
        fd(session / "topo", os.O_RDONLY),
        fd(session / "kept", os.O_RDWR, n="4"),
        fd(session / "fifo", os.O_RDONLY, n="5"),
        tv.OpenFd(1, "6", None, None, None),
    ])
    saved = temp_files.save(view, image, {str(session / "kept")})
    assert [d["path"] for d in saved["dirs"]] == [str(tmp_path / "ompi"), str(session)]
    assert [(f["path"], f["data"]) for f in saved["files"]] == [(str(session / "topo"),
                                                                 "temp-0.data")]
    assert (image / "temp-0.data").read_bytes() == b"xml"
    assert [f["path"] for f in saved["fifos"]] == [str(session / "fifo")]


def test_mapped_files_and_aliases_from_a_view(tmp_path):
    (tmp_path / "seg").write_bytes(b"s")
    (tmp_path / "sem.x").write_bytes(b"m")
    (tmp_path / "ro").write_bytes(b"r")
    sem = os.stat(tmp_path / "sem.x")
    seg = os.stat(tmp_path / "seg")
    gone = str(tmp_path / "sem.tmp")
    view = tv.TreeView([
        tv.Mapping(str(tmp_path / "seg"), seg.st_dev, seg.st_ino, False),
        tv.Mapping(f"{gone} (deleted)", sem.st_dev, sem.st_ino, False),
        tv.Mapping(str(tmp_path / "ro"), seg.st_dev, 1, False),
        tv.Mapping(f"{tmp_path}/lost (deleted)", seg.st_dev, 123456789, True),
    ], [fd(tmp_path / "seg", os.O_RDWR)])
    assert tv.mapped_files(view) == [tv.MappedFile(str(tmp_path / "ro"), False),
                                     tv.MappedFile(str(tmp_path / "seg"), True),
                                     tv.MappedFile(str(tmp_path / "sem.x"), False)]
    assert tv.deleted_aliases(view) == {gone: str(tmp_path / "sem.x")}


def test_a_live_name_is_looked_for_once(tmp_path, monkeypatch):
    (tmp_path / "sem.x").write_bytes(b"m")
    st = os.stat(tmp_path / "sem.x")
    view = tv.TreeView([tv.Mapping(f"{tmp_path}/t (deleted)", st.st_dev, st.st_ino, True)] * 3,
                       [])
    calls = []
    real = tv._live_name
    monkeypatch.setattr(tv, "_live_name", lambda *a: calls.append(a) or real(*a))
    tv.mapped_files(view)
    tv.deleted_aliases(view)
    assert len(calls) == 1


# ---- smaps ----------------------------------------------------------------------------

def test_smaps_headers_keep_what_parse_maps_reads():
    assert tv.parse_maps(tv._smaps_headers(SMAPS)) == tv.parse_maps(SMAPS)
    with open("/proc/self/smaps") as f:
        mine = f.read()
    assert tv.parse_maps(tv._smaps_headers(mine)) == tv.parse_maps(mine)
    assert len(tv._smaps_headers(mine)) < len(mine) / 3
    no_flags = "7f-80 r--s 0 fe:00 5 /x\nSize: 4 kB\n"
    assert tv._smaps_headers(no_flags) == no_flags
    assert tv._smaps_headers("") == ""


def test_a_field_after_vmflags_is_not_taken_for_a_mapping():
    text = SMAPS.replace("VmFlags: rd mr me ms\n", "VmFlags: rd mr me ms\nNewField: 1\n")
    assert tv.parse_maps(tv._smaps_headers(text)) == tv.parse_maps(SMAPS)


# ---- a live process: /proc read once --------------------------------------------------

CHILD = textwrap.dedent("""
    import mmap, os, sys
    d = sys.argv[1]
    def path(name):
        return os.path.join(d, name)
    for name in ("ro", "rw", "rw_read", "tmpname"):
        with open(path(name), "wb") as f:
            f.write(b"z" * 4096)
    def mapped(name, flags, prot):
        fd = os.open(path(name), flags)
        m = mmap.mmap(fd, 4096, mmap.MAP_SHARED, prot)
        os.close(fd)
        return m
    keep = [mapped("ro", os.O_RDONLY, mmap.PROT_READ),
            mapped("rw", os.O_RDWR, mmap.PROT_READ | mmap.PROT_WRITE),
            # read-only now, but mprotect may make it writable: the tree's to write
            mapped("rw_read", os.O_RDWR, mmap.PROT_READ),
            mapped("tmpname", os.O_RDWR, mmap.PROT_READ | mmap.PROT_WRITE)]
    os.link(path("tmpname"), path("sem.real"))  # as glibc's sem_open does
    os.unlink(path("tmpname"))
    log = open(path("log"), "a")
    log.write("x" * 10)
    log.flush()
    os.mkfifo(path("fifo"))
    fifo = os.open(path("fifo"), os.O_RDWR)
    r, w = os.pipe()
    import socket
    os.mkdir(path("run"))
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path("run/sock"))
    print("ready", flush=True)
    sys.stdin.read()
""")


@pytest.fixture
def child(tmp_path):
    with ready_python(CHILD, str(tmp_path)) as pid:
        yield pid


@pytest.mark.parametrize("told_by", ["map_files", "smaps"])
def test_a_view_of_a_live_process(tmp_path, child, monkeypatch, told_by):
    read = []
    real_read = tv.procfs.read
    monkeypatch.setattr(tv.procfs, "read", lambda path: read.append(path) or real_read(path))
    if told_by == "smaps":  # (map_files refused: not root, no CAP_CHECKPOINT_RESTORE)
        monkeypatch.setattr(tv, "_opened_for_writing", lambda pid, where: None)
    view = tv.TreeView.read([child, 999_999_999])  # a pid that is gone: nothing of it
    assert (f"/proc/{child}/smaps" in read) == (told_by == "smaps")
    monkeypatch.undo()
    assert {f.pid for f in view.fds} == {child}
    by_target = {f.target: f for f in view.fds}
    log = by_target[str(tmp_path / "log")].flags
    assert log & os.O_ACCMODE == os.O_WRONLY and log & os.O_APPEND
    # only a regular file can be a written or mapped one: nothing asks a fifo's
    assert by_target[str(tmp_path / "fifo")].flags is None
    # nor a pipe's or a socket's stat (a socket's inode is in its target)
    pipes = [f for f in view.fds if f.target and f.target.startswith(("pipe:", "socket:"))]
    assert len(pipes) >= 3 and all(f.flags is None and f.st is None for f in pipes)

    # what follows reads nothing more of /proc/PID
    def no_proc(*args, **kw):
        raise AssertionError(f"/proc read again: {args}")
    monkeypatch.setattr(tv.procfs, "read", no_proc)
    monkeypatch.setattr(tv, "_fdinfo_flags", no_proc)
    monkeypatch.setattr(tv.procfs, "fds", no_proc)
    monkeypatch.setattr(os, "readlink", no_proc)
    monkeypatch.setattr(temp_files.scratch, "ROOTS", (str(tmp_path),))

    mine = {Path(f.path).name: f.writable for f in tv.mapped_files(view)
            if Path(f.path).parent == tmp_path}
    assert mine == {"ro": False, "rw": True, "rw_read": True, "sem.real": True}
    assert tv.deleted_aliases(view) == {str(tmp_path / "tmpname"): str(tmp_path / "sem.real")}
    written = written_files.collect(view, set())
    assert {"path": str(tmp_path / "log"), "size": 10,
            "inode": os.stat(tmp_path / "log").st_ino} in written
    image = tmp_path / "image"
    image.mkdir()
    saved = temp_files.save(view, image, set())
    assert [f["path"] for f in saved["fifos"]] == [str(tmp_path / "fifo")]
    assert str(tmp_path / "log") in [f["path"] for f in saved["files"]]
    # the directory of a bound Unix socket, found by the socket's inode
    assert [d["path"] for d in saved["dirs"]] == [str(tmp_path / "run")]


def test_fds_read_while_stopped_are_not_read_again(child, monkeypatch):
    """The links the suspend's scan read (fdtable.to_hand_over) give the
    same view, without listing or reading the fds again."""
    fresh = tv.TreeView.read([child])
    links = fdtable.to_hand_over([child]).links
    monkeypatch.setattr(tv.procfs, "fds", lambda pids: iter(()) if not pids else no_more())
    monkeypatch.setattr(os, "readlink", lambda *a, **kw: no_more())

    def no_more():
        raise AssertionError("the fds of a process read again")
    again = tv.TreeView.read([child], links)
    assert sorted(again.fds) == sorted(fresh.fds) and len(fresh.fds) >= 8
    assert again.mappings == fresh.mappings


# ---- the kernel's query (PROCMAP_QUERY) against the text of maps ------------------------

def test_the_kernel_s_query_and_the_text_of_maps_agree(child):
    queried = procmap_query.shared_file_mappings(child)
    assert queried is not None  # (Linux 6.11 and later: this project's machines run 6.18)
    text = tv.parse_maps(procfs.read(f"/proc/{child}/maps"))
    assert len(queried) >= 5  # the child's four files and glibc's gconv cache
    assert [(q.path, q.dev, q.ino, q.writable, q.start, q.end) for q in queried] == [
        (m.path, m.dev, m.ino, m.may_write, *(int(a, 16) for a in m.where.split("-")))
        for m in text]
    assert procmap_query.shared_file_mappings(999_999_999) == []  # gone: nothing


def test_a_kernel_without_the_query_gives_the_same_view(child, monkeypatch):
    def mappings() -> list[tv.Mapping]:  # (maps pads low addresses with zeros)
        return [m._replace(where="") for m in tv.TreeView.read([child]).mappings]
    queried = mappings()
    monkeypatch.setattr(procmap_query, "shared_file_mappings", lambda pid: None)
    assert mappings() == queried and len(queried) >= 5
