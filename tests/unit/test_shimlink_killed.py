"""The agent hears of a child killed by a failure signal (CHILD_KILLED, on
a connection of its own) before it tells how the tree ended: settle()
takes what is still in the listener's backlog.  Real abstract Unix sockets,
nothing else."""
from __future__ import annotations

import asyncio
import os
import socket

from dmtcp_py import procfs
from dmtcp_py.agent import records
from dmtcp_py.agent.shimlink import ShimLink


def record(type_: int, arg: int = 0) -> bytes:
    return records.RECORD.pack(records.MAGIC, records.VERSION, type_, os.getpid(),
                               os.getppid(), arg)


def connect(name: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect("\0" + name)
    return sock


async def scenario() -> tuple[list, str]:
    heard: list = []
    link = ShimLink(f"dmtcp-test-killed-{os.getpid()}",
                    on_child_killed=lambda *args: heard.append(args))
    await link.listen()
    try:
        # a process says hello (this one: SO_PEERCRED), and its name is kept
        shim = connect(link.name)
        shim.sendall(record(records.HELLO))
        for _ in range(200):
            if link.pids():
                break
            await asyncio.sleep(0.005)
        # its parent tells of its death and goes: nothing ran in between, the
        # connection is still in the backlog when the tree's end is told
        teller = connect(link.name)
        teller.sendall(record(records.CHILD_KILLED, records.killed_arg(os.getpid(), 9)))
        teller.close()
        await link.settle()
        shim.close()
        return heard, link.name_of(os.getpid())
    finally:
        link.stop_listening()


def test_a_killed_child_is_heard_before_the_end_with_its_name():
    heard, name = asyncio.run(scenario())
    comm = procfs.read(f"/proc/{os.getpid()}/comm").strip()
    assert name == comm
    assert heard == [(os.getpid(), 9, False, comm)]


async def namespaced_scenario() -> tuple[list, list]:
    """As in a tree with a PID namespace of its own: records carry the
    sender's id in there (7 here), SO_PEERCRED ours."""
    heard: list = []
    ended: list = []
    link = ShimLink(f"dmtcp-test-ns-{os.getpid()}",
                    on_child_killed=lambda *args: heard.append(args),
                    on_program_ended=ended.append)
    await link.listen()
    try:
        shim = connect(link.name)
        shim.sendall(records.RECORD.pack(records.MAGIC, records.VERSION, records.HELLO, 7, 1, 0))
        for _ in range(200):
            if link.pids():
                break
            await asyncio.sleep(0.005)
        own = link.own_pids()  # (what a dump's manifest takes as its ns pid)
        teller = connect(link.name)
        teller.sendall(record(records.CHILD_KILLED, records.killed_arg(7, 9)))
        teller.close()
        init = connect(link.name)  # the init, pid 1 in there: the program's wait status
        init.sendall(record(records.PROGRAM_ENDED, 9))  # killed by SIGKILL
        init.close()
        await link.settle()
        shim.close()
        return heard, ended, own
    finally:
        link.stop_listening()


def test_a_namespace_pid_is_told_as_ours_and_the_program_end_is_heard():
    heard, ended, own = asyncio.run(namespaced_scenario())
    assert own == {os.getpid(): 7}
    comm = procfs.read(f"/proc/{os.getpid()}/comm").strip()
    assert heard == [(os.getpid(), 9, False, comm)]
    assert ended == [9]
