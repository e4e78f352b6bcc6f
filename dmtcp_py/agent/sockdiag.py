"""Which of some socket inodes are Unix sockets, and their peers: exact
questions to the kernel's NETLINK_SOCK_DIAG, one per inode.

A dump of every Unix socket of the network namespace (what `ss -x` asks,
and what pyroute2's DiagSocket did here) costs in proportion to the whole
host: every tree's agent link is a Unix socket, so at a checkpoint of N
trees each agent paid for all N.  An exact request (SOCK_DIAG_BY_FAMILY
without NLM_F_DUMP, an inode in `udiag_ino`) costs only the sockets asked
about.  Layouts: include/uapi/linux/{netlink,sock_diag,unix_diag}.h; the
kernel side is net/unix/diag.c (unix_diag_get_exact): the answer is one
SOCK_DIAG_BY_FAMILY message with the same sequence number, or an
NLMSG_ERROR (-ENOENT: no Unix socket of this network namespace has that
inode).

The requests go out in batches, each in one sendmsg; the answers of a
batch are read before the next goes, so that the socket's receive buffer
never overflows (the kernel would drop answers, ENOBUFS).
"""
from __future__ import annotations

import errno
import os
import socket
import struct
from collections.abc import Iterable

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLMSG_ERROR = 2
NLM_F_REQUEST = 0x1
UDIAG_SHOW_PEER = 0x4
UNIX_DIAG_PEER = 2
NOCOOKIE = 0xFFFFFFFF  # INET_DIAG_NOCOOKIE: the inode alone names the socket

# struct nlmsghdr {u32 len; u16 type; u16 flags; u32 seq; u32 pid}
_NLMSGHDR = struct.Struct("=IHHII")
# struct unix_diag_req {u8 family, protocol; u16 pad; u32 states, ino, show; u32 cookie[2]}
_REQ = struct.Struct("=BBHIIIII")
# struct unix_diag_msg {u8 family, type, state, pad; u32 ino; u32 cookie[2]}
_MSG = struct.Struct("=BBBBIII")
# struct rtattr {u16 len; u16 type}
_RTA = struct.Struct("=HH")
_ERR = struct.Struct("=i")  # struct nlmsgerr begins with the (negative) errno

BATCH = 64              # requests per sendmsg; answers are ~1 KiB of buffer each
_RCVBUF = 1 << 20       # asked for; the kernel caps it at net.core.rmem_max
_MAX_INO = 0xFFFFFFFF   # udiag_ino is 32 bits: no socket has a larger inode


def _align(n: int) -> int:
    return (n + 3) & ~3


def _request(seq: int, ino: int) -> bytes:
    body = _REQ.pack(socket.AF_UNIX, 0, 0, 0xFFFFFFFF, ino, UDIAG_SHOW_PEER,
                     NOCOOKIE, NOCOOKIE)
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), SOCK_DIAG_BY_FAMILY,
                          NLM_F_REQUEST, seq, 0) + body


def _peer(attrs: memoryview) -> int:
    """UNIX_DIAG_PEER among a message's rtattrs (absent: no peer)."""
    off = 0
    while off + _RTA.size <= len(attrs):
        length, kind = _RTA.unpack_from(attrs, off)
        if length < _RTA.size or off + length > len(attrs):
            break
        if kind == UNIX_DIAG_PEER and length >= _RTA.size + 4:
            return struct.unpack_from("=I", attrs, off + _RTA.size)[0]
        off += _align(length)
    return 0


def _answers(buf: memoryview) -> Iterable[tuple[int, int, memoryview]]:
    """(type, seq, payload) of each netlink message in one datagram."""
    off = 0
    while off + _NLMSGHDR.size <= len(buf):
        length, kind, _flags, seq, _pid = _NLMSGHDR.unpack_from(buf, off)
        if length < _NLMSGHDR.size or off + length > len(buf):
            break
        yield kind, seq, buf[off + _NLMSGHDR.size:off + length]
        off += _align(length)


def _ask(sock: socket.socket, inodes: list[int], first_seq: int,
         out: dict[int, int]) -> None:
    """One batch: every request in one sendmsg, then every answer (matched
    by sequence number: one netlink socket per call, so numbers are unique)."""
    waiting = {first_seq + i: ino for i, ino in enumerate(inodes)}
    sock.sendall(b"".join(_request(seq, ino) for seq, ino in waiting.items()))
    buf = bytearray(32768)  # one answer per datagram, each well under a page
    while waiting:
        n = sock.recv_into(buf)
        for kind, seq, payload in _answers(memoryview(buf)[:n]):
            ino = waiting.pop(seq, None)
            if ino is None:
                continue  # not an answer to a question of this batch
            if kind == SOCK_DIAG_BY_FAMILY and len(payload) >= _MSG.size:
                family, _type, _state, _pad, got, _c0, _c1 = _MSG.unpack_from(payload)
                if family == socket.AF_UNIX and got == ino:
                    out[ino] = _peer(payload[_MSG.size:])
            elif kind == NLMSG_ERROR and len(payload) >= _ERR.size:
                code = -_ERR.unpack_from(payload)[0]
                if code not in (0, errno.ENOENT):
                    raise OSError(code, f"sock_diag: inode {ino}: {os.strerror(code)}")


def unix_peers(inodes: Iterable[int]) -> dict[int, int]:
    """inode -> peer inode (0: none), for those of `inodes` that are Unix
    sockets of this process's network namespace; the others (another kind
    of socket, closed, not a socket at all) are left out."""
    wanted = sorted({i for i in inodes if 0 < i <= _MAX_INO})
    out: dict[int, int] = {}
    if not wanted:
        return out
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC,
                       NETLINK_SOCK_DIAG) as sock:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _RCVBUF)
        except OSError:
            pass
        sock.bind((0, 0))
        sock.settimeout(5.0)  # the kernel answers at once; never hang a checkpoint
        for start in range(0, len(wanted), BATCH):
            _ask(sock, wanted[start:start + BATCH], start + 1, out)
    return out
