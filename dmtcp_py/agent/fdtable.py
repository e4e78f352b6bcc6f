"""The tree's sockets as the agent sees them: which ones leave the processes
for the dump, what each one is, and the names that match two ends.

CRIU may keep a socket only when it can restore it by itself: a Unix
socket whose peer is in the same tree (or that has no peer).  Every
AF_INET/AF_INET6 socket and every Unix socket whose peer is outside the
tree is parked with the agent (DESIGN.md section 3, step 3).

Names ("keys") of endpoints are what the coordinator matches: a connection
is under control when both of its ends are reported, each naming the other.
Addresses that mean something only inside one network namespace (loopback,
the wildcard) and Unix socket inodes carry the namespace's or the boot's
identity, so that two hosts never match each other's loopback connections.
"""
from __future__ import annotations

import ipaddress
import os
import socket
from functools import lru_cache
from typing import Iterable, Iterator, NamedTuple

from dmtcp_py import procfs
from dmtcp_py.agent import sockdiag
from dmtcp_py.frozen import field, mutable_record
from dmtcp_py.images.socket_table import Address, Option, SocketInfo, is_namespace_local

# options that describe how the program set its socket up (restored on a
# new socket after a restart); transient ones (TCP_CORK) are left out
_OPTIONS = [
    (socket.SOL_SOCKET, socket.SO_REUSEADDR, 4), (socket.SOL_SOCKET, socket.SO_REUSEPORT, 4),
    (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 4), (socket.SOL_SOCKET, socket.SO_BROADCAST, 4),
    (socket.SOL_SOCKET, socket.SO_OOBINLINE, 4), (socket.SOL_SOCKET, socket.SO_LINGER, 8),
    (socket.SOL_SOCKET, socket.SO_RCVTIMEO, 16), (socket.SOL_SOCKET, socket.SO_SNDTIMEO, 16),
    (socket.SOL_SOCKET, socket.SO_PRIORITY, 4),
]
_TCP_OPTIONS = [
    (socket.IPPROTO_TCP, socket.TCP_NODELAY, 4), (socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 4),
    (socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 4), (socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 4),
]
_V6_OPTIONS = [(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 4)]


@lru_cache(maxsize=1)
def boot_id() -> str:
    with open("/proc/sys/kernel/random/boot_id") as f:
        return f.read().strip()


def netns_id() -> str:
    return f"{boot_id()}/{os.stat('/proc/self/ns/net').st_ino}"


INOTIFY_LINK = "anon_inode:inotify"


def _fd_links(pids: list[int]) -> Iterator[tuple[int, int, str]]:
    """(pid, fd, what /proc/PID/fd/FD links to) for every open fd of pids."""
    for pid, name in procfs.fds(pids):
        try:
            yield pid, int(name), os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue


def _sockets_of(links: Iterable[tuple[int, int, str]]) -> dict[int, dict[int, int]]:
    out: dict[int, dict[int, int]] = {}
    for pid, fd, link in links:
        ino = procfs.socket_inode(link)
        if ino is not None:
            out.setdefault(pid, {})[fd] = ino
    return out


def tree_sockets(pids: list[int]) -> dict[int, dict[int, int]]:
    """pid -> {fd: socket inode}."""
    return _sockets_of(_fd_links(pids))


def inet_inodes() -> set[int]:
    """Inodes of the TCP and UDP sockets of this network namespace."""
    inodes: set[int] = set()
    for table in ("tcp", "tcp6", "udp", "udp6"):
        try:
            with open(f"/proc/net/{table}") as f:
                next(f)
                for line in f:
                    inodes.add(int(line.split()[9]))
        except (OSError, StopIteration, IndexError, ValueError):
            continue
    return inodes


def to_park(pids: list[int]) -> dict[int, list[int]]:
    """pid -> the fd numbers whose sockets must leave that process."""
    return _leaving(tree_sockets(pids))


class HandOver(NamedTuple):
    """What a suspended tree's fds say, from one read of them."""
    to_park: dict[int, list[int]]   # to_park of them
    inotify: bool                   # a process holds an inotify instance
    links: dict[int, list[tuple[int, str]]]  # pid -> (fd, what it links to)


def to_hand_over(pids: list[int], shim_links: dict[int, int] | None = None) -> HandOver:
    """to_park(pids), and whether a process of pids holds an inotify
    instance (the reader of one that several processes share is elected
    with the sockets, and only it keeps the events queued at a checkpoint:
    hijack/src/inotify.c), from one read of their fds, which the dump's
    look at the tree's files may take again (TreeView.read's links) if
    nothing is parked.  shim_links: pid -> the fd of its shim's link to
    us, as its hello said: passed over, so that a tree with no other
    socket asks no socket table of the kernel, nor reads our own fds."""
    shim_links = shim_links or {}
    found = [(pid, fd, link) for pid, fd, link in _fd_links(pids)
             if shim_links.get(pid) != fd]
    links: dict[int, list[tuple[int, str]]] = {}
    for pid, fd, link in found:
        links.setdefault(pid, []).append((fd, link))
    return HandOver(_leaving(_sockets_of(found)), any(link == INOTIFY_LINK for _, _, link in found),
                    links)


def _leaving(found: dict[int, dict[int, int]]) -> dict[int, list[int]]:
    """to_park of the sockets found (tree_sockets)."""
    if not found:
        return {}
    in_tree = {ino for fds in found.values() for ino in fds.values()}
    # the shims' own links lead to us: never theirs to hand over
    ours = set(tree_sockets([os.getpid()]).get(os.getpid(), {}).values())
    peers = sockdiag.unix_peers(in_tree)  # exact questions, never a dump of the host
    # what is not a Unix socket may be TCP or UDP: /proc/net/{tcp,udp}* list
    # every such socket of the host, read only when a tree has one to find
    inet = inet_inodes() if in_tree - peers.keys() else set()
    out: dict[int, list[int]] = {}
    for pid, fds in found.items():
        for fd, ino in sorted(fds.items()):
            if ino in peers:
                park = peers[ino] != 0 and peers[ino] not in in_tree and peers[ino] not in ours
            else:
                park = ino in inet
            if park:
                out.setdefault(pid, []).append(fd)
    return out


def _plain_ip(ip: str) -> str:
    """An IPv4 peer of a dual-stack socket shows as ::ffff:a.b.c.d; the other
    end of the same connection, an IPv4 socket, says a.b.c.d."""
    try:
        mapped = ipaddress.ip_address(ip.split("%")[0]).ipv4_mapped
    except (ValueError, AttributeError):
        return ip
    return str(mapped) if mapped else ip


def inet_key(kind: str, addr: tuple, netid: str) -> str:
    ip, port = _plain_ip(addr[0]), addr[1]
    if is_namespace_local(ip):
        return f"{kind}:{netid}/{ip}:{port}"
    return f"{kind}:{ip}:{port}"


@mutable_record
class SocketEntry:
    """One parked socket (one inode), what it is, and every (pid, fd) that
    holds it."""
    ino: int
    sock: socket.socket
    info: SocketInfo
    copies: list[tuple[int, int]] = field(default_factory=list)
    leader: bool = False

    @property
    def kind(self) -> str:
        return "stream" if self.sock.type == socket.SOCK_STREAM else "message"


def describe(sock: socket.socket, ino: int, unix_peer: int) -> SocketInfo:
    """What the socket is: the one place a SocketInfo is made of a live socket."""
    family, type_ = sock.family, sock.type
    try:
        listening = bool(sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))
    except OSError:
        listening = False
    try:
        peer = _addr(family, sock.getpeername())
    except OSError:
        peer = None
    wanted = list(_OPTIONS)
    if family in (socket.AF_INET, socket.AF_INET6) and type_ == socket.SOCK_STREAM:
        wanted += _TCP_OPTIONS
    if family == socket.AF_INET6:
        wanted += _V6_OPTIONS
    options = []
    for level, name, size in wanted:
        try:
            options.append((level, name, sock.getsockopt(level, name, size).hex()))
        except OSError:
            pass
    if family == socket.AF_UNIX:
        key = f"unix:{boot_id()}:{ino}"
        peer_key = f"unix:{boot_id()}:{unix_peer}" if unix_peer else None
    else:
        netid = netns_id()
        kind = "tcp" if type_ == socket.SOCK_STREAM else "udp"
        key = inet_key(kind, sock.getsockname(), netid)
        peer_key = inet_key(kind, sock.getpeername(), netid) if peer else None
    return SocketInfo(ino=ino, family=int(family), type=int(type_), proto=sock.proto,
                      listening=listening, local=_addr(family, sock.getsockname()), peer=peer,
                      options=tuple(options), key=key, peer_key=peer_key)


def _addr(family: int, addr) -> Address:
    if family == socket.AF_UNIX:
        if isinstance(addr, bytes):
            return "@" + addr[1:].decode(errors="replace") if addr[:1] == b"\0" else addr.decode(errors="replace")
        return addr or None
    return (addr[0], addr[1])


def set_options(sock: socket.socket, options: Iterable[Option]) -> None:
    for level, name, value in options:
        try:
            sock.setsockopt(level, name, bytes.fromhex(value))
        except OSError:
            pass  # an option this kernel or this address family refuses


def entries(parked) -> dict[int, SocketEntry]:
    """Group the parked copies by socket; describe each socket once."""
    parked = list(parked)
    inodes = [os.fstat(p.sock.fileno()).st_ino for p in parked]
    # the peers of the parked Unix sockets only: one exact question each
    peers = sockdiag.unix_peers(ino for p, ino in zip(parked, inodes)
                       if p.sock.family == socket.AF_UNIX)
    out: dict[int, SocketEntry] = {}
    for p, ino in zip(parked, inodes):
        entry = out.get(ino)
        if entry is None:
            entry = out[ino] = SocketEntry(ino, p.sock, describe(p.sock, ino, peers.get(ino, 0)))
        entry.copies.append((p.pid, p.fd))
        entry.leader = entry.leader or p.leader
    return out
