"""agent.tree: the tree's processes found by a walk down from the agent
through /proc/PID/task/TID/children, against a real small tree started
here: children of the root's main thread and of another of its threads,
grandchildren, a zombie inside the tree, an orphan that came back to us
(a subreaper), and our own children the walk must leave out (ended, CRIU).
The result must be what psutil's scan of every process of the host says."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest

from dmtcp_py import procfs
from dmtcp_py.agent import tree as tree_mod
from dmtcp_py.agent.spawn import become_subreaper
from dmtcp_py.agent.tree import Tree

# The root: forks A (which forks AA) from its main thread, B from another
# thread (that thread stays), Z (ends, never reaped: a zombie in the tree),
# O (forks OO, ends and is reaped: OO is an orphan that comes back to the
# nearest subreaper, us).  Writes "name pid" lines, then "done".
ROOT = r"""
import os, sys, threading, time
out = int(sys.argv[1])

def say(name, pid):
    os.write(out, f"{name} {pid}\n".encode())

def sleeper(child=None):
    if child:
        pid = os.fork()
        if pid == 0:
            time.sleep(120); os._exit(0)
        say(child, pid)
    time.sleep(120); os._exit(0)

def fork(name, child=None):
    pid = os.fork()
    if pid == 0:
        sleeper(child)
    say(name, pid)
    return pid

fork("A", "AA")
ready = threading.Event()
def other_thread():
    fork("B")
    ready.set()
    time.sleep(120)
threading.Thread(target=other_thread, daemon=True).start()
ready.wait()
z = os.fork()
if z == 0:
    os._exit(0)
say("Z", z)
o = os.fork()
if o == 0:
    oo = os.fork()
    if oo == 0:
        time.sleep(120); os._exit(0)
    say("OO", oo)
    os._exit(0)
os.waitpid(o, 0)
while True:  # Z has ended (a zombie) before we say done
    with open(f"/proc/{z}/stat") as f:
        if f.read().rsplit(")", 1)[1].split()[0] == "Z":
            break
    time.sleep(0.01)
os.write(out, b"done\n")
time.sleep(120)
"""


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def _wait_zombie(pid: int) -> None:
    deadline = time.monotonic() + 10
    while _state(pid) != "Z":
        assert time.monotonic() < deadline, f"{pid} did not end"
        time.sleep(0.01)


def _old_processes() -> set[int]:
    """What Tree.processes() returned before the walk: psutil's scan."""
    out = set()
    for child in psutil.Process().children():
        try:
            if child.status() == psutil.STATUS_ZOMBIE or child.name() == "criu":
                continue
            out.add(child.pid)
            out.update(d.pid for d in child.children(recursive=True))
        except psutil.Error:
            pass
    return out


@pytest.fixture
def small_tree(tmp_path):
    """{name: pid} of the tree above, its root our child; afterwards every
    process started here is killed by pid and every child of ours reaped."""
    become_subreaper()  # as the agent is (conftest makes pytest one too)
    r, w = os.pipe()
    root = subprocess.Popen([sys.executable, "-c", ROOT, str(w)], pass_fds=[w])
    os.close(w)
    pids = {"root": root.pid}
    buf = b""
    deadline = time.monotonic() + 30
    try:
        while not buf.endswith(b"done\n"):
            assert time.monotonic() < deadline, buf
            chunk = os.read(r, 4096)
            assert chunk, f"the tree's root ended early: {buf!r}"
            buf += chunk
        for line in buf.decode().splitlines()[:-1]:
            name, pid = line.split()
            pids[name] = int(pid)
        yield pids
    finally:
        os.close(r)
        for name, pid in pids.items():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        root.wait()
        # with the root gone, what it left (killed, ended) came back to us
        for name, pid in pids.items():
            if name != "root":
                try:
                    os.waitpid(pid, 0)
                except ChildProcessError:
                    pass


def _collect(pid: int) -> None:
    """Reap a child of ours the test made, if no one did."""
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def test_walk_finds_the_tree_and_the_orphans(small_tree):
    t = Tree()
    t.root_pid = small_tree["root"]
    assert set(tree_mod.children_of(os.getpid())) >= {small_tree["root"], small_tree["OO"]}
    # B is a child of the root's second thread, not of its main thread
    main_children = procfs.read(
        f"/proc/{small_tree['root']}/task/{small_tree['root']}/children").split()
    assert str(small_tree["B"]) not in main_children
    assert set(tree_mod.children_of(small_tree["root"])) == {
        small_tree[n] for n in ("A", "B", "Z")}
    found = t.processes()
    assert all(isinstance(p, psutil.Process) for p in found)
    pids = [p.pid for p in found]
    assert len(pids) == len(set(pids))
    assert set(pids) >= set(small_tree.values())  # the zombie Z inside the tree too
    assert set(pids) == _old_processes()
    assert all(p.memory_info().rss >= 0 for p in found if p.pid != small_tree["Z"])
    assert t.pids() == pids
    assert t.has_live_processes()
    # a zombie or a pid that is gone never reconnects
    assert Tree.alive({small_tree["root"], small_tree["Z"], 2**31 - 1}) == {small_tree["root"]}


def test_walk_leaves_out_our_ended_children_and_criu(small_tree, tmp_path):
    ended = os.posix_spawn("/bin/true", ["true"], dict(os.environ))
    criu = tmp_path / "criu"
    shutil.copy(shutil.which("sleep"), criu)
    fake = subprocess.Popen([str(criu), "60"])
    try:
        _wait_zombie(ended)
        deadline = time.monotonic() + 10
        while tree_mod._state_and_name(fake.pid) != ("S", "criu"):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        t = Tree()
        t.root_pid = small_tree["root"]
        pids = {p.pid for p in t.processes()}
        assert ended not in pids and fake.pid not in pids
        assert pids >= set(small_tree.values())
        assert pids == _old_processes()
        # reap_orphans collects our ended child, never the running root
        t.reap_orphans()
        assert not os.path.exists(f"/proc/{ended}")
        assert os.path.exists(f"/proc/{small_tree['root']}")
    finally:
        fake.kill()
        fake.wait()
        _collect(ended)


def test_reap_orphans_keeps_the_root_until_it_has_exited(small_tree):
    t = Tree()
    t.root_pid = root = small_tree["root"]
    os.kill(root, signal.SIGKILL)
    _wait_zombie(root)
    t.reap_orphans()
    assert _state(root) == "Z"  # the root's end is for _root_exited to collect
    t.exited.set()
    # (a process is waitable once its last thread is gone: the agent's
    # next SIGCHLD calls reap_orphans again)
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{root}"):
        assert time.monotonic() < deadline, "the root was not collected"
        t.reap_orphans()
        time.sleep(0.01)


def test_kill_ends_the_tree(small_tree):
    t = Tree()
    t.root_pid = small_tree["root"]
    t.kill()
    deadline = time.monotonic() + 10
    for name, pid in small_tree.items():
        while os.path.exists(f"/proc/{pid}") and _state(pid) != "Z":
            assert time.monotonic() < deadline, f"{name} ({pid}) still runs"
            time.sleep(0.01)


def test_walk_of_what_is_gone():
    assert tree_mod.children_of(2**22 + 12345) == []
    assert tree_mod.descendants([]) == []
    assert tree_mod._state_and_name(2**22 + 12345) is None


def test_the_walk_reads_no_other_process(small_tree, monkeypatch):
    """The point of the walk: it opens /proc files of the tree's processes
    and ours only, however many other processes the host runs."""
    opened: list[str] = []
    real_open, real_listdir = os.open, os.listdir

    def spy_open(path, *args, **kwargs):
        opened.append(str(path))
        return real_open(path, *args, **kwargs)

    def spy_listdir(path="."):
        opened.append(str(path))
        return real_listdir(path)

    monkeypatch.setattr(tree_mod.os, "open", spy_open)
    monkeypatch.setattr(tree_mod.os, "listdir", spy_listdir)
    # the tree, and whatever else is below us (other tests' leftovers)
    allowed = {os.getpid(), *small_tree.values(),
               *tree_mod.descendants(tree_mod.children_of(os.getpid()))}
    t = Tree()
    t.root_pid = small_tree["root"]
    t.processes()
    monkeypatch.undo()
    assert opened
    for path in opened:
        parts = path.split("/")
        assert parts[1] == "proc" and int(parts[2]) in allowed, path


def _fake_criu(tmp_path, mark: str) -> subprocess.Popen:
    """A child named criu whose command line holds mark (as a restore's
    names its image), until killed."""
    criu = tmp_path / "criu"
    if not criu.exists():
        shutil.copy("/bin/sh", criu)
    proc = subprocess.Popen([str(criu), "-c", "sleep 60; :", mark])
    deadline = time.monotonic() + 10
    while (tree_mod._state_and_name(proc.pid) or ("", ""))[1] != "criu" \
            or mark not in (procfs.read(f"/proc/{proc.pid}/cmdline") or ""):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return proc


def test_a_tree_that_shares_its_agents_process_keeps_to_its_own(small_tree, tmp_path):
    """Several trees' agents in one process (agent/together.py): a tree's
    processes are its root's, the process's other children (an ended one,
    an orphan, CRIU) are not its to reap, and it kills only its own CRIU."""
    ended = os.posix_spawn("/bin/true", ["true"], dict(os.environ))
    mine = _fake_criu(tmp_path, "ckpt_prog_tree1.dmtcp")
    other = _fake_criu(tmp_path, "ckpt_prog_tree2.dmtcp")
    try:
        _wait_zombie(ended)
        t = Tree(shared_by="tree1")
        t.root_pid = root = small_tree["root"]
        assert set(t.pids()) == {small_tree[n] for n in ("root", "A", "AA", "B", "Z")}
        t.reap_orphans()
        assert _state(ended) == "Z"  # left to whoever started it
        t.kill()
        assert mine.wait(timeout=10) == -signal.SIGKILL
        assert other.poll() is None
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{root}") and _state(root) != "Z":
            assert time.monotonic() < deadline, "the root still runs"
            time.sleep(0.01)
        assert _state(small_tree["OO"]) != "Z"  # the orphan is no tree's here
    finally:
        for proc in (mine, other):
            proc.kill()
            proc.wait()
        _collect(ended)
