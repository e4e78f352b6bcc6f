"""A real shim's HELLO says which fd its link to the agent is, and the
agent's look for sockets that leave a stopped tree passes that fd over:
a process whose only socket is its link asks no socket table of the
kernel.  A program under the real libdmtcphijack.so, woken as the agent
wakes it, against a ShimLink of this process."""
from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

from dmtcp_py.agent import fdtable, records, sockdiag, wake
from dmtcp_py.agent.shimlink import ShimLink

SHIM = Path(__file__).resolve().parents[2] / "hijack" / "build" / "libdmtcphijack.so"


def test_hello_of_reads_what_old_and_new_shims_say():
    assert records.hello_of(1) == (1, None)  # a shim that does not say its fd
    assert records.hello_of(0 | 1017 << records.HELLO_FD_SHIFT) == (0, 1016)
    assert records.hello_of(records.HELLO_RELEASED | 4 << records.HELLO_FD_SHIFT) \
        == (records.HELLO_RELEASED, 3)


async def _connected(link: ShimLink, proc: subprocess.Popen, signum: int) -> None:
    """The process's shim connected, woken by the agent's signal once its
    handler is in place (the shim connects only when woken)."""
    for _ in range(500):
        if proc.pid in link.pids():
            return
        if wake.handles(proc.pid, signum):
            wake.wake([proc.pid], signum)
        await asyncio.sleep(0.01)
    raise AssertionError(f"the shim of {proc.pid} never connected")


def test_the_link_fd_of_the_hello_is_passed_over(monkeypatch):
    assert SHIM.is_file(), "make shim first"
    signum = wake.reserved_signal()

    async def scenario():
        link = ShimLink(f"dmtcp-test-hello-{os.getpid()}")
        link.bind_to_tree(os.getpid())  # (the same PID namespace as the program's)
        await link.listen()
        env = {**os.environ, "LD_PRELOAD": str(SHIM), "DMTCP_AGENT_SOCK": link.address}
        proc = subprocess.Popen(["sleep", "60"], env=env)
        try:
            await _connected(link, proc, signum)
            return proc.pid, link.link_fds(), fdtable.to_hand_over([proc.pid]), \
                await asyncio.to_thread(scan_without_socket_table, proc.pid, link.link_fds())
        finally:
            proc.kill()
            proc.wait()
            link.stop_listening()

    def scan_without_socket_table(pid, link_fds):
        with monkeypatch.context() as m:
            def fail(*a):
                raise AssertionError("a socket table asked for a tree whose only socket "
                                     "is its link")
            m.setattr(sockdiag, "unix_peers", fail)
            m.setattr(fdtable, "inet_inodes", fail)
            m.setattr(fdtable, "tree_sockets", fail)
            return fdtable.to_hand_over([pid], link_fds)

    pid, link_fds, plain, passed = asyncio.run(scenario())
    fd = link_fds[pid]
    # the hello's fd is the process's socket, high in its table
    assert [f for f, target in plain.links[pid] if target.startswith("socket:")] == [fd]
    assert plain.to_park == {} and fd >= 3
    assert fd not in {f for f, _ in passed.links[pid]} and passed.to_park == {}
    assert {f for f, _ in passed.links[pid]} == {f for f, _ in plain.links[pid]} - {fd}
