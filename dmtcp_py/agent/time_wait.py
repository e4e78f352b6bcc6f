"""A restored listener's port, back from the killed tree's TIME_WAIT.

A tree killed while its server had connections can leave them in
TIME_WAIT on the listener's port for a minute (here at every kill of a
program holding an idle connection to itself: test_network).  A
listener made again meanwhile without SO_REUSEADDR cannot bind that port
(nor with it: the waiting connections inherited the old listener's "no"),
so the restored program would listen on another port than its clients
know; raw `criu restore --tcp-established` fails outright there.  The
agent ends those connections, which belong to the program's previous
life, through the kernel's NETLINK_SOCK_DIAG (SOCK_DESTROY, what `ss -K`
does; CAP_NET_ADMIN), and binds again.

Only connections in TIME_WAIT, only on that port, only on the listener's
address (any address for a wildcard listener).  Layouts:
include/uapi/linux/inet_diag.h (struct inet_diag_req_v2, inet_diag_sockid,
inet_diag_msg); the kernel side is net/ipv4/inet_diag.c: a dump answers
with one message per socket and ends with NLMSG_DONE; a SOCK_DESTROY of
one socket (its id and cookie) is acknowledged with an NLMSG_ERROR whose
error is 0, or the negative errno.
"""
from __future__ import annotations

import ipaddress
import logging
import socket
import struct

from dmtcp_py.agent import tcpstats
from dmtcp_py.agent.sockdiag import NETLINK_SOCK_DIAG, NLM_F_REQUEST, NLMSG_ERROR, _answers

log = logging.getLogger("agent")

SOCK_DESTROY = 21
NLM_F_ACK = 0x4
TCP_TIME_WAIT = 6


def _holds(msg: memoryview, port: int, address: str) -> bool:
    """Whether the connection of inet_diag_msg holds (address, port)."""
    family, _st, _t, _r, sport, _dp, src = tcpstats.MSG.unpack_from(msg)[:7]
    if int.from_bytes(sport, "big") != port:
        return False
    where = ipaddress.ip_address(address)
    local = ipaddress.ip_address(src[:4 if family == socket.AF_INET else 16])
    return where.is_unspecified or local == where


def _destroy(family: int, sockid: bytes, seq: int) -> bytes:
    return tcpstats.request(family, 1 << TCP_TIME_WAIT, kind=SOCK_DESTROY,
                            flags=NLM_F_REQUEST | NLM_F_ACK, seq=seq, sockid=sockid)


def end(family: int, address: str, port: int) -> int:
    """End the connections in TIME_WAIT that keep (address, port) from a
    listener: how many were ended (0 if none, or if the kernel or our
    capabilities do not allow it: the caller then takes another port)."""
    at, size = tcpstats.SOCKID_AT, tcpstats.SOCKID_SIZE
    ended = 0
    try:
        found = [bytes(msg[at:at + size]) for msg in tcpstats.dump(family, 1 << TCP_TIME_WAIT)
                 if _holds(msg, port, address)]
        if not found:
            return 0
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC,
                           NETLINK_SOCK_DIAG) as sock:
            sock.settimeout(5.0)
            for seq, sockid in enumerate(found, start=1):  # (its id and cookie name it)
                sock.sendall(_destroy(family, sockid, seq))
                for kind, _seq, payload in _answers(memoryview(sock.recv(4096))):
                    if kind == NLMSG_ERROR:
                        code = -struct.unpack_from("=i", payload)[0]
                        ended += code == 0
                        if code:  # (gone meanwhile: ENOENT; not allowed: EPERM)
                            log.debug("a TIME_WAIT connection on port %d stays: errno %d",
                                      port, code)
    except OSError as exc:
        log.debug("no TIME_WAIT connection on port %d ended: %s", port, exc)
    if ended:
        log.info("ended %d connection(s) of the killed tree in TIME_WAIT on port %d, "
                 "which its listener gets back", ended, port)
    return ended
