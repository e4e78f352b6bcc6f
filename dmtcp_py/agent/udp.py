"""Datagrams queued on a UDP socket at checkpoint time.

At a checkpoint they are copied with MSG_PEEK (SO_PEEK_OFF walks the queue
without consuming it), so a checkpoint that continues leaves the queue as
it was.  After a restart they go back into the new socket's queue from
their sender's address, so recvfrom() reports the same sender and a
connected socket does not filter them out: an IPv4 datagram is written
whole through a raw socket (any source address and port, even one bound
on this host), an IPv6 one through a socket bound with IP_TRANSPARENT.
Both need CAP_NET_RAW / CAP_NET_ADMIN, which the agent has as root.
"""
from __future__ import annotations

import ipaddress
import socket
import struct

from dmtcp_py import sockio
from dmtcp_py.agent import fdtable

IP_TRANSPARENT = 19
IP_FREEBIND = 15
IPV6_TRANSPARENT = 75
MAX_DATAGRAM = 65536


def peek_queue(sock: socket.socket, netid: str) -> list[tuple[bytes, tuple, str]]:
    """Every queued datagram: (data, source address, source key)."""
    blocking = sock.getblocking()
    try:
        sock.setblocking(False)
        queued = sockio.peek_queue(sock, MAX_DATAGRAM)
    finally:
        sock.setblocking(blocking)
    return [(data, tuple(src[:2]), fdtable.inet_key("udp", src, netid)) for data, src in queued]


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def _ipv4_packet(data: bytes, src: tuple, dst: tuple) -> bytes:
    s, d = socket.inet_aton(src[0]), socket.inet_aton(dst[0])
    udp_len = 8 + len(data)
    pseudo = s + d + struct.pack("!BBH", 0, socket.IPPROTO_UDP, udp_len)
    header = struct.pack("!HHHH", src[1], dst[1], udp_len, 0)
    csum = _checksum(pseudo + header + data) or 0xFFFF
    udp_part = struct.pack("!HHHH", src[1], dst[1], udp_len, csum) + data
    # version/IHL, TOS, total length, id, flags/fragment, TTL, protocol,
    # checksum (the kernel fills it and the length in for IP_HDRINCL)
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + udp_len, 0, 0x4000, 64,
                     socket.IPPROTO_UDP, 0, s, d)
    return ip + udp_part


def _is_v4(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).version == 4
    except ValueError:
        return False


def inject(data: bytes, src: tuple, target: tuple) -> bool:
    """Queue data on the socket bound at target as sent from src; True when
    the sender's address is kept, False when it had to be ours."""
    dst = ("127.0.0.1" if target[0] == "0.0.0.0" else target[0], target[1])
    if _is_v4(src[0]) and _is_v4(dst[0]):
        raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
        try:
            raw.sendto(_ipv4_packet(data, src, dst), (dst[0], 0))
            return True
        except OSError:
            pass
        finally:
            raw.close()
    family = socket.AF_INET6 if ":" in dst[0] else socket.AF_INET
    out = socket.socket(family, socket.SOCK_DGRAM)
    try:
        kept = True
        try:
            if family == socket.AF_INET6:
                out.setsockopt(socket.IPPROTO_IPV6, IPV6_TRANSPARENT, 1)
            else:
                out.setsockopt(socket.SOL_IP, IP_TRANSPARENT, 1)
                out.setsockopt(socket.SOL_IP, IP_FREEBIND, 1)
            out.bind(src)
        except OSError:
            kept = False
        out.sendto(data, dst)
        return kept
    finally:
        out.close()
