"""protocol/handshake.py speaks the protocol without messages.py: what it
sends, messages.py reads as the messages meant; what messages.py sends, it
reads the same; anything else is not a coordinator.  And one real
exchange, with a server of our own on a loopback socket."""
from __future__ import annotations

import socket
import threading
import time

import pytest

from dmtcp_py.errors import CoordinatorUnreachable, UserError
from dmtcp_py.protocol import codec, handshake, messages
from dmtcp_py.protocol.messages import Cmd, Command, Hello, Refused, Reply, Role, Welcome


def _decoded(frame: bytes) -> messages.Message:
    [raw] = codec.Decoder().feed(frame)
    return messages.decode(raw)


def test_hello_and_command_are_read_by_messages_as_meant():
    hello = _decoded(handshake.frame({"type": "hello", "role": "client", "token": 'tö"ken'}))
    assert hello == Hello(role=Role.CLIENT, token='tö"ken')
    for cmd in (Cmd.STATUS, Cmd.LIST):
        assert _decoded(handshake.frame({"type": "command", "cmd": cmd.value})) == Command(cmd=cmd)
    assert _decoded(handshake.frame({"type": "command", "cmd": "checkpoint", "blocking": True})) \
        == Command(cmd=Cmd.CHECKPOINT, blocking=True)


@pytest.mark.parametrize("message", [
    Welcome(comp_id="c0ffee", agent_id=3, ckptdir="/data/ckpt"),
    Welcome(comp_id="c0ffee", agent_id=3),
    Refused(error=Refused.WRONG_TOKEN),
    Reply(ok=True, body={"num_peers": 2, "trees": [{"host": "h", "procs": [[1, "a"]]}]}),
    Reply(ok=False, error="no processes to checkpoint"),
])
def test_what_messages_sends_is_read_the_same(message):
    body = messages.encode(message)[4:]
    assert handshake.parse(body) == messages.to_wire(message)


@pytest.mark.parametrize("body, why", [
    (b"not json", "bad JSON"),
    (b'{"v": 1} x', "bad JSON"),
    (b"[1, 2]", "not a JSON object"),
    (b'{"v": 2, "type": "welcome"}', "protocol version 2"),
    (b'{"v": true, "type": "welcome"}', "protocol version True"),
    (b'{"v": 1, "n": NaN}', "bad JSON"),
    (b"\xff\xfe", "bad JSON"),
])
def test_anything_else_is_not_a_coordinator(body, why):
    with pytest.raises(handshake.NotACoordinator, match=why):
        handshake.parse(body)


class _Server:
    """A loopback server that answers each message it gets with the next
    of answers (bytes), then closes."""

    def __init__(self, *answers: bytes, delay: float = 0.0) -> None:
        self.delay = delay  # before each answer
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.got: list[messages.Message] = []
        self.thread = threading.Thread(target=self._serve, args=(answers,), daemon=True)
        self.thread.start()

    def _serve(self, answers) -> None:
        conn, _ = self.sock.accept()
        with conn:
            decoder = codec.Decoder()
            for answer in answers:
                raw: list = []
                while not raw:
                    data = conn.recv(65536)
                    if not data:
                        return
                    raw = decoder.feed(data)
                self.got += [messages.decode(r) for r in raw]
                time.sleep(self.delay)
                conn.sendall(answer)

    def close(self) -> None:
        self.thread.join(timeout=5)
        self.sock.close()


def test_hello_then_status_against_a_server():
    server = _Server(messages.encode(Welcome(comp_id="abc", agent_id=1, ckptdir="/x")),
                     messages.encode(Reply(ok=True, body={"num_peers": 0})))
    try:
        with handshake.Coordinator("127.0.0.1", server.port) as coordinator:
            welcome = coordinator.hello("secret")
            assert welcome["comp_id"] == "abc" and welcome["ckptdir"] == "/x"
            assert coordinator.command("status", 5.0) == (True, None, {"num_peers": 0})
    finally:
        server.close()
    assert server.got == [Hello(role=Role.CLIENT, token="secret"), Command(cmd=Cmd.STATUS)]


def test_a_launch_names_the_tree_it_starts_in_its_hello():
    server = _Server(messages.encode(Welcome(comp_id="abc", agent_id=1)))
    try:
        with handshake.Coordinator("127.0.0.1", server.port) as coordinator:
            coordinator.hello("secret", launching="0123456789ab")
    finally:
        server.close()
    assert server.got == [Hello(role=Role.CLIENT, token="secret", launching="0123456789ab")]


def test_a_restart_claims_its_tree_and_learns_the_claim_id():
    server = _Server(messages.encode(Welcome(comp_id="abc", agent_id=7)))
    try:
        with handshake.Coordinator("127.0.0.1", server.port) as coordinator:
            key = coordinator.claim_restart("secret", tree_id="0123456789ab", comp_id="old",
                                            generation=12, num_trees=3)
    finally:
        server.close()
    assert key == 7
    assert server.got == [Hello(role=Role.CLIENT, token="secret", restart=True,
                                tree_id="0123456789ab", comp_id="old", generation=12,
                                num_trees=3)]


@pytest.mark.parametrize("answer, error", [
    (Refused(error="this coordinator is busy with computation c1"), UserError),
    (Welcome(comp_id="abc", agent_id=0), CoordinatorUnreachable),  # (0 names no claim)
])
def test_a_claim_refused_or_without_an_id_is_an_error(answer, error):
    server = _Server(messages.encode(answer))
    try:
        with pytest.raises(error, match="busy with computation c1|bad claim id 0"):
            handshake.Coordinator("127.0.0.1", server.port).claim_restart(
                "secret", tree_id="t", comp_id="old", generation=1, num_trees=1)
    finally:
        server.close()


def test_a_launch_waits_for_its_welcome_and_is_told_it_waits(monkeypatch):
    """During a round the coordinator welcomes a launch once it is over."""
    monkeypatch.setattr(handshake, "WAIT_NOTE_AFTER", 0.05)
    server = _Server(messages.encode(Welcome(comp_id="abc", agent_id=1)), delay=0.5)
    told = []
    try:
        with handshake.Coordinator("127.0.0.1", server.port) as coordinator:
            welcome = coordinator.hello("secret", launching="0123456789ab",
                                        waiting=lambda: told.append(True))
    finally:
        server.close()
    assert welcome["comp_id"] == "abc" and told == [True]


def test_a_refusal_says_where_the_token_came_from(monkeypatch):
    monkeypatch.setenv("DMTCP_COORD_TOKEN", "wrong")
    server = _Server(messages.encode(Refused(error=Refused.WRONG_TOKEN)))
    try:
        with pytest.raises(UserError, match=r"refused us: the token given in \$DMTCP_COORD_TOKEN"):
            handshake.Coordinator("127.0.0.1", server.port).hello("wrong")
    finally:
        server.close()


def test_a_server_that_speaks_http_is_not_a_coordinator():
    server = _Server(b"HTTP/1.0 400 Bad Request\r\n\r\n")
    try:
        with pytest.raises(CoordinatorUnreachable, match="is not a dmtcp coordinator"):
            handshake.Coordinator("127.0.0.1", server.port).hello("x")
    finally:
        server.close()


def test_a_welcome_without_comp_id_is_not_one():
    server = _Server(handshake.frame({"type": "welcome"}))
    try:
        with pytest.raises(CoordinatorUnreachable, match="comp_id"):
            handshake.Coordinator("127.0.0.1", server.port).hello("x")
    finally:
        server.close()


def test_nobody_listening():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: refused
        with pytest.raises(CoordinatorUnreachable, match=f"no coordinator at 127.0.0.1:{port}"):
            handshake.Coordinator("127.0.0.1", port)
