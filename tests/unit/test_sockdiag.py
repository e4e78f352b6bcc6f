"""agent.sockdiag: exact NETLINK_SOCK_DIAG questions about given inodes,
against real sockets; and fdtable's use of it (which sockets leave a tree,
their Unix peers), without a dump of the host's sockets and without
pyroute2."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from dmtcp_py.agent import fdtable, sockdiag, tcpstats
from dmtcp_py.agent.shimlink import ParkedFd


def ino(sock: socket.socket) -> int:
    return os.fstat(sock.fileno()).st_ino


@pytest.fixture
def closing():
    """Sockets to close when the test ends."""
    socks: list[socket.socket] = []
    yield socks
    for s in socks:
        s.close()


def keep(closing, *socks):
    closing.extend(socks)
    return socks if len(socks) > 1 else socks[0]


def test_socketpair_peers(closing):
    a, b = keep(closing, *socket.socketpair())
    c, d = keep(closing, *socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM))
    e, f = keep(closing, *socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET))
    got = sockdiag.unix_peers([ino(s) for s in (a, b, c, d, e, f)])
    assert got == {ino(a): ino(b), ino(b): ino(a), ino(c): ino(d), ino(d): ino(c),
                   ino(e): ino(f), ino(f): ino(e)}


def test_listener_and_connection(closing, tmp_path):
    path = str(tmp_path / "l.sock")
    listener = keep(closing, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
    listener.bind(path)
    listener.listen()
    client = keep(closing, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
    client.connect(path)
    server = keep(closing, listener.accept()[0])
    abstract = keep(closing, socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM))
    abstract.bind(b"\0dmtcp-test-sockdiag-%d" % os.getpid())
    unbound = keep(closing, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
    got = sockdiag.unix_peers(map(ino, (listener, client, server, abstract, unbound)))
    assert got == {ino(listener): 0, ino(client): ino(server), ino(server): ino(client),
                   ino(abstract): 0, ino(unbound): 0}


def test_what_is_not_a_unix_socket_is_left_out(closing):
    tcp = keep(closing, socket.create_server(("127.0.0.1", 0)))
    udp = keep(closing, socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
    gone_a, gone_b = socket.socketpair()
    gone = ino(gone_a)
    gone_a.close()
    gone_b.close()
    live_a, live_b = keep(closing, *socket.socketpair())
    with open(os.devnull) as f:
        not_a_socket = os.fstat(f.fileno()).st_ino
    asked = [ino(tcp), ino(udp), gone, not_a_socket, 0, -1, 2**32 + ino(live_a), 2**40,
             ino(live_a)]
    assert sockdiag.unix_peers(asked) == {ino(live_a): ino(live_b)}
    assert sockdiag.unix_peers([]) == {}
    assert sockdiag.unix_peers([ino(tcp)]) == {}


def test_many_inodes_in_one_call(closing):
    """200 Unix inodes and some others, more than one batch; duplicates asked once."""
    pairs = [keep(closing, *socket.socketpair()) for _ in range(100)]
    tcp = [keep(closing, socket.socket()) for _ in range(10)]
    asked = [ino(s) for p in pairs for s in p] + [ino(s) for s in tcp]
    assert len(asked) > 2 * sockdiag.BATCH
    start = time.perf_counter()
    got = sockdiag.unix_peers(asked + asked[:50])
    elapsed = time.perf_counter() - start
    assert got == {**{ino(a): ino(b) for a, b in pairs}, **{ino(b): ino(a) for a, b in pairs}}
    assert elapsed < 1.0  # ~10 us an inode here; a dump would not be slower, a hang would


def test_one_netlink_socket_per_call(closing, monkeypatch):
    """All the questions of a call go through one netlink socket, in
    ceil(n / BATCH) sends (not one round trip an inode)."""
    pairs = [keep(closing, *socket.socketpair()) for _ in range(100)]
    made, sends = [], []
    real = socket.socket

    class Counting(real):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(args)

        def sendall(self, data, *args):
            sends.append(len(data))
            return super().sendall(data, *args)

    monkeypatch.setattr(sockdiag.socket, "socket", Counting)
    got = sockdiag.unix_peers(ino(s) for p in pairs for s in p)
    assert len(got) == 200
    assert len(made) == 1 and made[0][2] == sockdiag.NETLINK_SOCK_DIAG
    assert len(sends) == -(-200 // sockdiag.BATCH)


# ---- fdtable: to_park and entries ----------------------------------------------------

def _sleeper(fds: list[int]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            pass_fds=fds)


@pytest.fixture
def tree_procs():
    procs: list[subprocess.Popen] = []
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def test_to_park(closing, tree_procs):
    inner_a, inner_b = keep(closing, *socket.socketpair())      # both ends in the tree
    out_a, out_b = keep(closing, *socket.socketpair())          # out_b: another tree
    agent_a, agent_b = keep(closing, *socket.socketpair())      # agent_b stays with us
    tcp = keep(closing, socket.create_server(("127.0.0.1", 0)))
    lone = keep(closing, socket.socket(socket.AF_UNIX))         # no peer: CRIU's to keep
    a = _sleeper([inner_a.fileno(), inner_b.fileno(), out_a.fileno(), agent_a.fileno(),
                  tcp.fileno(), lone.fileno()])
    other = _sleeper([out_b.fileno()])
    tree_procs += [a, other]
    leaving = sorted([out_a.fileno(), tcp.fileno()])
    tcp_fd = tcp.fileno()
    for s in (inner_a, inner_b, out_a, out_b, agent_a, tcp, lone):
        closing.remove(s)
        s.close()  # theirs now; agent_b is ours, as the shim's link is the agent's
    assert fdtable.to_park([a.pid]) == {a.pid: leaving}
    # both ends of the connection in the tree: nothing but TCP leaves it
    assert fdtable.to_park([a.pid, other.pid]) == {a.pid: [tcp_fd]}


def test_to_park_reads_no_inet_table_for_unix_only_trees(closing, tree_procs, monkeypatch):
    x, y = keep(closing, *socket.socketpair())
    a, other = _sleeper([x.fileno()]), _sleeper([y.fileno()])
    tree_procs += [a, other]
    fd = x.fileno()
    for s in (x, y):
        closing.remove(s)
        s.close()

    def fail():
        raise AssertionError("/proc/net/tcp* read for a tree without TCP or UDP sockets")

    monkeypatch.setattr(fdtable, "inet_inodes", fail)
    assert fdtable.to_park([a.pid]) == {a.pid: [fd]}


def test_an_inotify_instance_is_found_among_a_trees_fds(closing, tree_procs):
    import ctypes
    x, y = keep(closing, *socket.socketpair())
    fd = ctypes.CDLL(None, use_errno=True).inotify_init1(os.O_CLOEXEC)
    assert fd >= 0, os.strerror(ctypes.get_errno())
    try:
        watcher, plain = _sleeper([fd]), _sleeper([x.fileno(), y.fileno()])
    finally:
        os.close(fd)
    tree_procs += [watcher, plain]
    # (the socketpair's two ends are both in the tree: nothing leaves it)
    both = fdtable.to_hand_over([plain.pid, watcher.pid])
    assert (both.to_park, both.inotify) == ({}, True)
    assert (fdtable.to_hand_over([plain.pid]).inotify, both.links.keys()) \
        == (False, {plain.pid, watcher.pid})
    assert fdtable.INOTIFY_LINK in {link for _, link in both.links[watcher.pid]}


def test_traffic_dumps_no_tcp_table_for_unix_only_trees(closing, tree_procs, monkeypatch):
    x, y = keep(closing, *socket.socketpair())
    a = _sleeper([x.fileno(), y.fileno()])
    tree_procs.append(a)

    def fail(family):
        raise AssertionError("the TCP table dumped for a tree without TCP sockets")

    monkeypatch.setattr(tcpstats, "_dump", fail)
    assert tcpstats.flows([a.pid]) == []


def test_traffic_finds_the_tcp_connections_beside_unix_sockets(closing, tree_procs):
    x, y = keep(closing, *socket.socketpair())
    server = keep(closing, socket.create_server(("127.0.0.1", 0)))
    client = keep(closing, socket.create_connection(server.getsockname()))
    accepted = keep(closing, server.accept()[0])
    client.sendall(b"x" * 1000)
    got = 0
    while got < 1000:
        got += len(accepted.recv(4096))
    a = _sleeper([x.fileno(), client.fileno()])
    tree_procs.append(a)
    local, peer = (f"{h}:{p}" for h, p in (client.getsockname(), client.getpeername()))
    [flow] = [f for f in tcpstats.flows([a.pid]) if f.local == local]
    assert flow.peer == peer and flow.sent >= 1000 and flow.received == 0


def test_entries_name_unix_peers(closing):
    a, b = keep(closing, *socket.socketpair())
    lone = keep(closing, socket.socket(socket.AF_UNIX))
    tcp = keep(closing, socket.create_server(("127.0.0.1", 0)))
    dup = keep(closing, a.dup())
    parked = [ParkedFd(10, 3, True, a), ParkedFd(11, 3, False, dup),
              ParkedFd(10, 4, True, lone), ParkedFd(10, 5, True, tcp)]
    got = fdtable.entries(parked)
    assert set(got) == {ino(a), ino(lone), ino(tcp)}
    boot = fdtable.boot_id()
    assert got[ino(a)].info.peer_key == f"unix:{boot}:{ino(b)}"
    assert got[ino(a)].copies == [(10, 3), (11, 3)] and got[ino(a)].leader
    assert got[ino(lone)].info.peer_key is None
    assert got[ino(tcp)].info.listening and got[ino(tcp)].info.key.startswith("tcp:")
    assert fdtable.entries([]) == {}


def test_the_agent_needs_no_pyroute2():
    code = ("import sys\n"
            "from dmtcp_py.agent import runner, fdtable, sockdiag\n"
            "import socket\n"
            "a, b = socket.socketpair()\n"
            "import os\n"
            "assert sockdiag.unix_peers([os.fstat(a.fileno()).st_ino])\n"
            "assert fdtable.to_park([os.getpid()]) == {}\n"
            "assert 'pyroute2' not in runner.CHECKPOINT_MODULES\n"
            "assert 'pyroute2' not in sys.modules, 'pyroute2 imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
