"""agent.peers.PeersReport: the tree's processes, told to the coordinator
once a burst of changes is over, and never looked at while a round stops
the tree."""
from __future__ import annotations

import asyncio
import os
import subprocess
import time

import psutil

from dmtcp_py import procfs
from dmtcp_py.agent import peers
from dmtcp_py.protocol import messages


class Tree:
    """The report's two callbacks, counted: the members (this test's own
    process, which has a /proc entry to describe), and what is sent."""

    def __init__(self) -> None:
        self.looked = 0
        self.sent: list[messages.Peers] = []
        self.in_round = False

    def members(self) -> list[int]:
        self.looked += 1
        return [os.getpid()]

    def report(self) -> peers.PeersReport:
        return peers.PeersReport(self.members, self.sent.append, in_round=lambda: self.in_round)


def test_changes_during_a_round_are_looked_at_once_the_tree_runs():
    async def scenario() -> None:
        tree = Tree()
        report = tree.report()
        tree.in_round = True
        for _ in range(3):  # the dump detaches the processes, they come back...
            report.changed()
            await asyncio.sleep(peers.REPORT_DELAY * 1.5)
        assert tree.looked == 0 and tree.sent == []
        tree.in_round = False
        await asyncio.sleep(peers.REPORT_DELAY * 2.5)
        assert tree.looked == 1
        assert [[p.pid for p in m.procs] for m in tree.sent] == [[os.getpid()]]
        report.changed()  # nothing new: looked at, not sent again
        await asyncio.sleep(peers.REPORT_DELAY * 1.5)
        assert tree.looked == 2 and len(tree.sent) == 1

    asyncio.run(scenario())


def test_a_tree_that_stays_the_same_is_looked_at_less_and_less_often(monkeypatch):
    tree = Tree()
    members = [os.getpid()]
    tree.members = lambda: members  # (a process comes at the fifth look)
    slept: list[float] = []

    class Enough(Exception):
        pass

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 5:
            members.append(os.getppid())
        if len(slept) == 7:
            raise Enough

    async def scenario() -> None:
        monkeypatch.setattr(peers.asyncio, "sleep", sleep)
        try:
            await tree.report().watch()
        except Enough:
            pass

    asyncio.run(scenario())
    every, most = peers.WATCH_EVERY, peers.WATCH_AT_MOST_EVERY
    # first look (sent), then nothing new: 2x, 4x... up to the most; a change: again
    assert slept == [every, every, 2 * every, min(4 * every, most), most, every, 2 * every]
    assert [len(m.procs) for m in tree.sent] == [1, 2]


def test_a_report_asked_for_is_sent_even_during_a_round():
    async def scenario() -> None:
        tree = Tree()
        tree.in_round = True
        tree.report().now()  # (a coordinator we rejoin must hear of them)
        assert tree.looked == 1 and len(tree.sent) == 1

    asyncio.run(scenario())


def test_a_process_is_named_and_ranked_as_psutil_tells_it(tmp_path):
    program = tmp_path / "a_rather_long_program_name"  # (the kernel keeps 15 bytes of it)
    program.symlink_to("/bin/sleep")
    child = subprocess.Popen([str(program), "30"], env={"PMIX_RANK": "3"})
    try:
        def execd() -> bool:
            # the command line too: exec sets the new comm before the new
            # arguments, and the full name comes from them (seen failing)
            return program.name in (procfs.read(f"/proc/{child.pid}/cmdline") or "")
        deadline = time.monotonic() + 10
        while not execd() and time.monotonic() < deadline:
            time.sleep(0.005)
        info = peers.describe(child.pid)
        assert info.name == psutil.Process(child.pid).name() == program.name
        assert info.rank == 3
        assert peers.describe(os.getpid()).rank is None
    finally:
        child.kill()
        child.wait()
    assert peers.describe(child.pid) == messages.ProcInfo(pid=child.pid)  # gone
