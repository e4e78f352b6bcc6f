"""Framing of coordinator messages: 4-byte big-endian length + JSON object.

Bytes in, messages out; no sockets, no asyncio.  Anything malformed raises
FrameError, and the caller closes that one connection.
"""
from __future__ import annotations

import json
import struct

MAX_FRAME = 1 << 20  # no legitimate message comes close to 1 MiB
_HEADER = struct.Struct(">I")
# one encoder for every frame: json.dumps(..., separators=...) builds a new one per call
_ENCODER = json.JSONEncoder(separators=(",", ":"))


class FrameError(ValueError):
    """A frame that cannot be a message of ours."""


def encode(message: dict) -> bytes:
    body = _ENCODER.encode(message).encode()
    if len(body) > MAX_FRAME:
        raise FrameError(f"message of {len(body)} bytes exceeds {MAX_FRAME}")
    return _HEADER.pack(len(body)) + body


class Decoder:
    """Accumulates bytes and yields complete messages."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[dict]:
        # Fast path, the common case of a barrier: nothing buffered and the
        # data holds whole frames; parse straight out of it, no copies.
        if self._buf:
            self._buf += data
            data = bytes(self._buf)
            self._buf.clear()
        out = []
        view = memoryview(data)
        pos, end = 0, len(data)
        while end - pos >= _HEADER.size:
            (length,) = _HEADER.unpack_from(view, pos)
            if length == 0 or length > MAX_FRAME:
                raise FrameError(f"bad frame length {length}")
            stop = pos + _HEADER.size + length
            if stop > end:
                break
            out.append(_parse(view[pos + _HEADER.size:stop]))
            pos = stop
        if pos < end:
            self._buf += view[pos:]
        return out


def _parse(body: memoryview) -> dict:
    try:
        # str, not bytes: json.loads(bytes) first guesses the encoding
        message = json.loads(str(body, "utf-8"))
    except ValueError as exc:  # bad UTF-8, bad JSON, an integer of 4300+ digits
        raise FrameError(f"bad JSON: {exc}") from None
    if not isinstance(message, dict):
        raise FrameError("message is not a JSON object")
    return message
