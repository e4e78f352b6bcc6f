"""The relay link's framing: a channel byte, a 32-bit length, the bytes.

stdin flows to the relay, stdout and stderr back; an empty frame on a data
channel is its end of file; EXIT carries the command's exit status, SIGNAL
a signal for it.  Threads of one process share a link: send() locks.
"""
from __future__ import annotations

import socket
import struct
import threading

from dmtcp_py.sockio import recv_exactly

STDIN, STDOUT, STDERR, EXIT, SIGNAL = range(5)
HEADER = struct.Struct("!BI")
MAX_FRAME = 1 << 20


class Link:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._lock = threading.Lock()

    def send(self, channel: int, data: bytes = b"") -> None:
        with self._lock:
            self.sock.sendall(HEADER.pack(channel, len(data)) + data)

    def send_int(self, channel: int, value: int) -> None:
        self.send(channel, struct.pack("!i", value))

    def _exactly(self, n: int) -> bytes | None:
        """n bytes, or None at the end of the link."""
        data = recv_exactly(self.sock, n)
        return data if len(data) == n else None

    def recv(self) -> tuple[int, bytes] | None:
        """The next frame, or None at the end of the link."""
        head = self._exactly(HEADER.size)
        if head is None:
            return None
        channel, length = HEADER.unpack(head)
        if length > MAX_FRAME:
            raise ConnectionError(f"relay frame of {length} bytes")
        data = self._exactly(length) if length else b""
        return None if data is None else (channel, data)

    @staticmethod
    def as_int(data: bytes) -> int:
        return struct.unpack("!i", data)[0]
