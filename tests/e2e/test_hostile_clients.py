"""Hostile or broken clients against a live coordinator that controls a
running program: thousands of malformed frames (garbage, bad lengths, bad
JSON, unknown types, wrong versions, wrong or missing tokens, junk after a
good hello), each on its own connection.  Every such connection is closed
by the coordinator, nothing else is disturbed, and a checkpoint still
works afterwards."""
from __future__ import annotations

import json
import socket
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dmtcp_py.tokens import resolve_token
from tests.conftest import need_root
from tests.e2e.harness import running_program

EXAMPLES = 2000


@pytest.fixture(scope="module")
def live(tmp_path_factory, programs):
    need_root()
    with running_program(tmp_path_factory.mktemp("hostile"),
                         [*programs["counter_single"], "1000000", "10"]) as (comp, _proc):
        comp.wait_peers(1)
        yield comp, resolve_token(comp.port)


def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def message(**fields) -> bytes:
    return frame(json.dumps(fields).encode())


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                           max_leaves=8)


# kinds whose bytes may be an incomplete frame: the coordinator rightly
# waits for the rest, so we end our side; every other kind is a complete
# frame the coordinator must refuse on its own
MAY_BE_PARTIAL = {"garbage", "junk_after_hello"}


@st.composite
def malformed(draw, token: str) -> tuple[str, bytes]:
    kind = draw(st.sampled_from(["garbage", "bad_json", "huge", "zero", "object",
                                 "wrong_version", "bad_hello", "junk_after_hello"]))
    return kind, draw(_bytes_of(kind, token))


@st.composite
def _bytes_of(draw, kind: str, token: str) -> bytes:
    if kind == "garbage":
        return draw(st.binary(min_size=1, max_size=64))
    if kind == "bad_json":
        return frame(draw(st.binary(min_size=1, max_size=64)).replace(b"{", b"["))
    if kind == "huge":
        return struct.pack(">I", draw(st.integers((1 << 20) + 1, (1 << 32) - 1))) + b"{}"
    if kind == "zero":
        return struct.pack(">I", 0)
    if kind == "object":  # well framed, not one of our messages
        fields = draw(st.dictionaries(st.text(max_size=6), json_values, max_size=4))
        return frame(json.dumps(fields).encode())
    if kind == "wrong_version":
        return message(v=draw(st.integers().filter(lambda v: v != 1)), type="hello",
                       role="client", token=token)
    if kind == "bad_hello":  # wrong token, unknown role, or not a hello at all
        return draw(st.sampled_from([
            message(v=1, type="hello", role="client", token=draw(st.text(max_size=40))),
            message(v=1, type="hello", token=token,
                    role=draw(st.text(max_size=8).filter(lambda r: r not in ("agent", "client")))),
            message(v=1, type="command", cmd="kill"),
        ]))
    # a good hello, then bytes that are not a message
    return message(v=1, type="hello", role="client", token=token) + \
        draw(st.binary(min_size=1, max_size=64)).replace(b"\x00\x00\x00", b"\xff\xff\xff")


def closed_by_peer(sock: socket.socket) -> bool:
    """Read until the coordinator closes; False if it keeps the connection."""
    sock.settimeout(15)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    except socket.timeout:
        return False
    return True


def test_malformed_frames_close_their_connection_and_nothing_else(live):
    comp, token = live

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=malformed(token))
    def one(case):
        kind, data = case
        with socket.create_connection(("127.0.0.1", comp.port), timeout=5) as sock:
            try:
                sock.sendall(data)
                if kind in MAY_BE_PARTIAL:
                    sock.shutdown(socket.SHUT_WR)
            except (BrokenPipeError, ConnectionResetError):
                return  # refused already
            assert closed_by_peer(sock), (kind, data[:80])

    one()
    assert comp.coordinator.poll() is None, "the coordinator died"
    status = comp.status()
    assert status["num_peers"] == 1 and status["running"], status
    assert "checkpoint 1 done" in comp.checkpoint()
