"""Framing: 4-byte big-endian length + JSON object, bytes in, messages out."""
from __future__ import annotations

import itertools
import json
import struct

import pytest

from dmtcp_py.protocol.codec import MAX_FRAME, Decoder, FrameError, encode

MESSAGES = [
    {"v": 1, "type": "hello", "role": "agent", "token": "abc"},
    {"v": 1, "type": "barrier", "state": "SUSPENDED", "generation": 3, "stop": False},
    {"v": 1, "type": "reply", "ok": True, "note": "caf\u00e9 \u2603", "list": [1, [2, {}]]},
]
STREAM = b"".join(encode(m) for m in MESSAGES)


def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def test_encode_layout():
    data = encode({"a": 1})
    assert data == b"\x00\x00\x00\x07" + b'{"a":1}'


@pytest.mark.parametrize("message", MESSAGES)
def test_round_trip_one_frame(message):
    assert Decoder().feed(encode(message)) == [message]


def test_several_frames_in_one_feed():
    assert Decoder().feed(STREAM) == MESSAGES


@pytest.mark.parametrize("cut", range(len(STREAM) + 1))
def test_split_at_every_byte_boundary(cut):
    decoder = Decoder()
    out = decoder.feed(STREAM[:cut])
    out += decoder.feed(STREAM[cut:])
    assert out == MESSAGES


def test_one_byte_at_a_time():
    decoder = Decoder()
    out = []
    ends = set(itertools.accumulate(len(encode(m)) for m in MESSAGES))
    for i in range(len(STREAM)):
        got = decoder.feed(STREAM[i:i + 1])
        # a message comes out exactly when its last byte arrives
        assert len(got) == (1 if i + 1 in ends else 0)
        out += got
    assert out == MESSAGES


def test_empty_feed_and_partial_header_yield_nothing():
    decoder = Decoder()
    assert decoder.feed(b"") == []
    assert decoder.feed(b"\x00\x00") == []
    assert decoder.feed(b"\x00\x02{}") == [{}]


def test_decoder_keeps_state_across_frames():
    decoder = Decoder()
    data = encode(MESSAGES[0]) + encode(MESSAGES[1])[:5]
    assert decoder.feed(data) == [MESSAGES[0]]
    assert decoder.feed(encode(MESSAGES[1])[5:]) == [MESSAGES[1]]
    assert decoder.feed(b"") == []


def test_zero_length_frame():
    with pytest.raises(FrameError, match="bad frame length 0"):
        Decoder().feed(b"\x00\x00\x00\x00")


def test_length_over_max_is_refused_from_the_header_alone():
    with pytest.raises(FrameError, match=f"bad frame length {MAX_FRAME + 1}"):
        Decoder().feed(struct.pack(">I", MAX_FRAME + 1))
    with pytest.raises(FrameError, match="bad frame length"):
        Decoder().feed(b"\xff\xff\xff\xff")


def test_length_of_max_waits_for_the_body():
    assert Decoder().feed(struct.pack(">I", MAX_FRAME) + b"{") == []


def _message_of_size(size: int) -> dict:
    overhead = len(json.dumps({"a": ""}, separators=(",", ":")))
    return {"a": "x" * (size - overhead)}


def test_encode_at_and_over_max_frame():
    largest = _message_of_size(MAX_FRAME)
    data = encode(largest)
    assert len(data) == 4 + MAX_FRAME
    assert Decoder().feed(data) == [largest]
    with pytest.raises(FrameError, match="exceeds"):
        encode(_message_of_size(MAX_FRAME + 1))


@pytest.mark.parametrize("body", [b"{", b"not json", b'{"a":1}x', b"{'a': 1}"])
def test_bad_json(body):
    with pytest.raises(FrameError, match="bad JSON"):
        Decoder().feed(frame(body))


@pytest.mark.parametrize("body", [b"[]", b"[1,2]", b"1", b'"s"', b"null", b"true"])
def test_json_that_is_not_an_object(body):
    with pytest.raises(FrameError, match="not a JSON object"):
        Decoder().feed(frame(body))


@pytest.mark.parametrize("body", [b'{"a":"\xff"}', b'{"a":"\xc3"}', b"\xfe\xff"])
def test_invalid_utf8(body):
    with pytest.raises(FrameError, match="bad JSON"):
        Decoder().feed(frame(body))


def test_bad_frame_after_good_one_in_same_feed_raises():
    with pytest.raises(FrameError):
        Decoder().feed(encode(MESSAGES[0]) + frame(b"[]"))


def test_frame_error_is_a_value_error():
    assert issubclass(FrameError, ValueError)
