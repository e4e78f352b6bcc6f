"""agent.time_wait: which connections in TIME_WAIT keep a listener from
its port (its port, on its address, or on any for a wildcard listener),
read from the kernel's inet_diag_msg."""
from __future__ import annotations

import ipaddress
import socket

import pytest

from dmtcp_py.agent import tcpstats, time_wait
from dmtcp_py.agent.sockdiag import _NLMSGHDR


def diag_msg(family: int, local: str, sport: int) -> memoryview:
    """An inet_diag_msg of a connection in TIME_WAIT from local:sport."""
    packed = ipaddress.ip_address(local).packed
    return memoryview(tcpstats.MSG.pack(
        family, time_wait.TCP_TIME_WAIT, 0, 0, sport.to_bytes(2, "big"),
        (40000).to_bytes(2, "big"), packed, packed, 0,
        b"\1" * 8, 0, 0, 0, 0, 0))


@pytest.mark.parametrize("family, local, port, listener, holds", [
    (socket.AF_INET, "127.0.0.1", 8080, "127.0.0.1", True),
    (socket.AF_INET, "127.0.0.1", 8080, "0.0.0.0", True),        # a wildcard meets every address
    (socket.AF_INET, "198.18.0.2", 8080, "127.0.0.1", False),    # another address's port
    (socket.AF_INET, "127.0.0.1", 8081, "127.0.0.1", False),     # another port
    (socket.AF_INET6, "::1", 8080, "::1", True),
    (socket.AF_INET6, "::1", 8080, "::", True),
    (socket.AF_INET6, "fd00::2", 8080, "::1", False),
])
def test_only_the_listeners_own_port_and_address_are_cleared(family, local, port, listener,
                                                             holds):
    assert time_wait._holds(diag_msg(family, local, port), 8080, listener) is holds


def test_the_destroy_request_names_the_connection_by_its_id_and_cookie():
    sockid = bytes(range(48))
    request = time_wait._destroy(socket.AF_INET, sockid, seq=7)
    length, kind, flags, seq, _ = _NLMSGHDR.unpack_from(request)
    assert (length, kind, seq) == (len(request), time_wait.SOCK_DESTROY, 7)
    assert flags & time_wait.NLM_F_ACK
    assert request.endswith(sockid)  # (ports, addresses, interface and cookie as dumped)
