"""Byte counters of a tree's TCP connections, from NETLINK_SOCK_DIAG.

One dump of the network namespace's established TCP sockets with
INET_DIAG_INFO (struct tcp_info: tcpi_bytes_acked, tcpi_bytes_received,
Linux 4.1+), kept for the inodes the tree holds.  The counters are totals
since each connection began; the coordinator turns them into rates
(coordinator/traffic.py).  A dump costs in proportion to the namespace's
TCP sockets, so it is asked every few seconds, never at a checkpoint, and
not at all for a tree that holds no socket but Unix ones.
Layouts: include/uapi/linux/{inet_diag,tcp}.h.
"""
from __future__ import annotations

import ipaddress
import socket
import struct
from collections.abc import Iterable, Iterator
from typing import NamedTuple

from dmtcp_py.agent import fdtable, sockdiag
from dmtcp_py.agent.sockdiag import (NETLINK_SOCK_DIAG, NLM_F_REQUEST, NLMSG_ERROR,
                                     SOCK_DIAG_BY_FAMILY, _NLMSGHDR, _RTA, _align, _answers)

NLM_F_DUMP = 0x300
NLMSG_DONE = 3
TCP_ESTABLISHED = 1
INET_DIAG_INFO = 2
# struct inet_diag_req_v2 {u8 family, protocol, ext, pad; u32 states;} and then its
#   struct inet_diag_sockid {be16 sport, dport; be32 src[4], dst[4]; u32 if; u32 cookie[2]}
_REQ_HEAD = struct.Struct("=BBBBI")
# struct inet_diag_msg {u8 family, state, timer, retrans; sockid; u32 expires,
#   rqueue, wqueue, uid, inode}
MSG = struct.Struct("=BBBB2s2s16s16sI8sIIIII")
SOCKID_AT, SOCKID_SIZE = 4, 48  # (where in MSG the inet_diag_sockid is, and its size)
# struct tcp_info: tcpi_bytes_acked and tcpi_bytes_received (u64) at 120, 128
_BYTES = struct.Struct("=QQ")
_BYTES_AT = 120


class Flow(NamedTuple):
    """One established TCP connection of the tree: its ends ("ip:port"),
    and the bytes the peer acknowledged and the bytes received so far."""
    local: str
    peer: str
    sent: int
    received: int


def _address(family: int, raw: bytes, port: bytes) -> str:
    size = 4 if family == socket.AF_INET else 16
    ip = ipaddress.ip_address(raw[:size])
    if ip.version == 6 and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return f"{ip}:{int.from_bytes(port, 'big')}"


def request(family: int, states: int, *, ext: int = 0, kind: int = SOCK_DIAG_BY_FAMILY,
            flags: int = NLM_F_REQUEST | NLM_F_DUMP, seq: int = 1,
            sockid: bytes = bytes(SOCKID_SIZE)) -> bytes:
    """A netlink message carrying inet_diag_req_v2 for TCP: by default the
    dump of every socket in states; with kind, flags and the sockid of one
    socket (as a dump gave it: its id and cookie), a request about it."""
    body = _REQ_HEAD.pack(family, socket.IPPROTO_TCP, ext, 0, states) + sockid
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), kind, flags, seq, 0) + body


def _info(attrs: memoryview) -> tuple[int, int] | None:
    off = 0
    while off + _RTA.size <= len(attrs):
        length, kind = _RTA.unpack_from(attrs, off)
        if length < _RTA.size or off + length > len(attrs):
            break
        if kind == INET_DIAG_INFO and length >= _RTA.size + _BYTES_AT + _BYTES.size:
            return _BYTES.unpack_from(attrs, off + _RTA.size + _BYTES_AT)
        off += _align(length)
    return None


def dump(family: int, states: int, ext: int = 0) -> Iterator[memoryview]:
    """The inet_diag_msg (MSG, then its attributes, asked for with ext) of
    every TCP socket of this network namespace in states (a mask of
    1 << TCP state), of family.  OSError."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC,
                       NETLINK_SOCK_DIAG) as sock:
        sock.bind((0, 0))
        sock.settimeout(5.0)
        sock.sendall(request(family, states, ext=ext))
        buf = bytearray(65536)
        while True:
            n = sock.recv_into(buf)
            if n == 0:
                return
            for kind, _seq, payload in _answers(memoryview(buf)[:n]):
                if kind == NLMSG_DONE:
                    return
                if kind == NLMSG_ERROR:
                    raise OSError(-struct.unpack_from("=i", payload)[0], "sock_diag dump refused")
                if kind == SOCK_DIAG_BY_FAMILY and len(payload) >= MSG.size:
                    yield payload


def _dump(family: int) -> Iterator[tuple[int, Flow]]:
    for payload in dump(family, 1 << TCP_ESTABLISHED, 1 << (INET_DIAG_INFO - 1)):
        fam, _st, _t, _r, sport, dport, src, dst, _if, _c, _e, _rq, _wq, _uid, ino = \
            MSG.unpack_from(payload)
        counters = _info(payload[MSG.size:])
        if counters is not None:
            yield ino, Flow(_address(fam, src, sport), _address(fam, dst, dport), *counters)


def flows(pids: Iterable[int]) -> list[Flow]:
    """The established TCP connections the processes hold, with their
    counters (a connection shared by several processes once)."""
    mine = {ino for fds in fdtable.tree_sockets(list(pids)).values() for ino in fds.values()}
    # Unix sockets (every process's link to its agent, at least) are asked
    # about one by one: a dump walks the kernel's whole TCP table, ~7 ms here
    # even with almost no connection, every few seconds in every agent
    mine -= sockdiag.unix_peers(mine).keys()
    if not mine:
        return []
    out: dict[int, Flow] = {}
    for family in (socket.AF_INET, socket.AF_INET6):
        for ino, flow in _dump(family):
            if ino in mine:
                out[ino] = flow
    return sorted(out.values())
