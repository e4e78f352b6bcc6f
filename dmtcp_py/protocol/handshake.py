"""A coordinator's first answer, and one command's, without messages.py:
for `dmtcp-launch` before it starts the program and for `dmtcp-command -s`,
`-l`, `-c`, `-bc`, `-kc`, `-k` and `-q`, whose own part of the run is meant
to take a few tens of milliseconds.  Loading
messages.py (its dataclasses and typing) and the json and socket modules
costs more than that budget allows; the C halves of json and socket cost
almost nothing.

The frames are the protocol's (codec.py; tests/unit/test_handshake.py
checks that messages.py reads what is sent here and that what it sends is
read here the same), and what is read is checked as messages.py checks it
before anything is used: a peer that answers something else is not a
dmtcp coordinator.  The coordinator checks our side with messages.py.
"""
from __future__ import annotations

import _json
import _socket
from _collections_abc import Callable  # (typing costs ms; this one is loaded already)

from dmtcp_py import tokens
from dmtcp_py.errors import CoordinatorUnreachable, UserError

PROTOCOL_VERSION = 1   # messages.PROTOCOL_VERSION
MAX_FRAME = 1 << 20    # codec.MAX_FRAME
CONNECT_TIMEOUT = 5.0  # seconds, as client.py waits
HELLO_TIMEOUT = 10.0   # a coordinator answers hello at once
WAIT_NOTE_AFTER = 2.0  # a launch's hello unanswered this long: the caller is told


class _Strict:
    """json.loads' settings, for the C scanner json.decoder itself uses."""
    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    memo: dict = {}

    @staticmethod
    def parse_constant(name: str):
        raise ValueError(f"{name} is not a JSON number")


_scan = _json.make_scanner(_Strict())
_quote = _json.encode_basestring_ascii


class NotACoordinator(ValueError):
    """What came back is not a frame or message of ours."""


def frame(fields: dict[str, str | bool | int]) -> bytes:
    """One frame of a message whose fields are strings, booleans and integers."""
    parts = [f'"v":{PROTOCOL_VERSION}']
    for key, value in fields.items():
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, int):
            text = str(value)
        else:
            text = _quote(value)
        parts.append(f"{_quote(key)}:{text}")
    body = ("{" + ",".join(parts) + "}").encode()
    return len(body).to_bytes(4, "big") + body


def parse(body: bytes) -> dict:
    """A frame's body as codec.Decoder reads it, with the version and type
    checked as messages.decode checks them."""
    try:
        text = str(body, "utf-8")
        message, end = _scan(text, 0)
    except StopIteration as stop:
        raise NotACoordinator(f"bad JSON: at character {stop.value}") from None
    except (ValueError, RecursionError) as exc:
        raise NotACoordinator(f"bad JSON: {exc}") from None
    if text[end:].strip(" \t\n\r"):
        raise NotACoordinator(f"bad JSON: extra data at character {end}")
    if not isinstance(message, dict):
        raise NotACoordinator("message is not a JSON object")
    if type(message.get("v")) is not int or message["v"] != PROTOCOL_VERSION:
        raise NotACoordinator(f"protocol version {message.get('v')!r}, "
                              f"expected {PROTOCOL_VERSION}")
    return message


def _field(message: dict, name: str, kinds: tuple, default=None):
    """A field as messages.py would check it: absent (default) or of kinds."""
    if name not in message:
        return default
    value = message[name]
    if value is None and type(None) in kinds or type(value) in kinds:
        return value
    raise NotACoordinator(f"{message.get('type')}.{name}: expected "
                          f"{' or '.join(k.__name__ for k in kinds)}, got {type(value).__name__}")


class Coordinator:
    """One connection to a coordinator: hello, then commands."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.sock = _connect(host, port)
        self._buf = b""

    def hello(self, token: str, launching: str = "",
              waiting: Callable[[], None] | None = None,
              claim: dict[str, str | int] | None = None) -> dict:
        """Hello as a client; the welcome (comp_id, and the coordinator's
        ckptdir if it has one), or UserError (a refusal) or
        CoordinatorUnreachable.  launching: the tree dmtcp-launch is about
        to start, which checkpoints wait for while this connection lasts
        (coordinator/launching.py); the welcome waits for a round under
        way to end, however long it takes (as a blocking checkpoint's
        answer does), and waiting() is called once it took WAIT_NOTE_AFTER."""
        fields: dict[str, str | bool | int] = {"type": "hello", "role": "client",
                                               "token": token}
        if claim:  # (claim_restart)
            fields.update(restart=True, **claim)
        if launching:
            fields["launching"] = launching
            self.sock.settimeout(WAIT_NOTE_AFTER)
            answer = self.request(fields, waiting=waiting or (lambda: None))
        else:
            self.sock.settimeout(HELLO_TIMEOUT)
            answer = self.request(fields)
        if answer["type"] == "refused":
            error = _field(answer, "error", (str,), "")
            self.close()
            raise UserError(tokens.refusal(self.host, self.port, error,
                                           error == "wrong computation token"))
        if answer["type"] != "welcome":
            self.close()
            raise CoordinatorUnreachable(f"{self.host}:{self.port} is not a dmtcp coordinator "
                                         f"(it answered {answer['type']!r})")
        try:
            if type(_field(answer, "comp_id", (str,))) is not str:
                raise NotACoordinator("welcome: field 'comp_id' missing")
            _field(answer, "ckptdir", (str, type(None)))
        except NotACoordinator as exc:
            self.close()
            raise self._not_ours(exc) from None
        return answer

    def claim_restart(self, token: str, *, tree_id: str, comp_id: str, generation: int,
                      num_trees: int) -> int:
        """Hello as a client that claims the restart of tree_id (of that
        generation of comp_id, num_trees trees in all) before its agent
        joins (coordinator/claims.py): the claim's id, which the agent's
        hello names; UserError if the coordinator would not take the
        restart (busy, the tree taken), or CoordinatorUnreachable.  The
        claim lasts as long as this connection, or until the agent joined."""
        answer = self.hello(token, claim={"tree_id": tree_id, "comp_id": comp_id,
                                          "generation": generation, "num_trees": num_trees})
        key = answer.get("agent_id")
        if type(key) is not int or key < 1:
            self.close()
            raise self._not_ours(NotACoordinator(f"welcome: bad claim id {key!r}"))
        return key

    def command(self, cmd: str, timeout: float | None,
                **flags: bool) -> tuple[bool, str | None, dict]:
        """One command whose fields are flags at most (status, list, a
        checkpoint with blocking or stop...): ok, error, and the reply's
        body (its fields but those four)."""
        self.sock.settimeout(timeout)
        reply = self.request({"type": "command", "cmd": cmd, **flags})
        if reply["type"] != "reply":
            raise CoordinatorUnreachable(f"{self.host}:{self.port} answered a command with "
                                         f"{reply['type']!r}")
        try:
            ok = _field(reply, "ok", (bool,))
            if ok is None:
                raise NotACoordinator("reply: field 'ok' missing")
            error = _field(reply, "error", (str, type(None)))
        except NotACoordinator as exc:
            raise self._not_ours(exc) from None
        body = {k: v for k, v in reply.items() if k not in ("v", "type", "ok", "error")}
        return ok, error, body

    def request(self, fields: dict[str, str | bool | int],
                waiting: Callable[[], None] | None = None) -> dict:
        """Send one message, read the next (a dict with its type checked).
        waiting: the answer may take as long as it takes; called when the
        socket's timeout passed without it."""
        try:
            self.sock.sendall(frame(fields))
            try:
                body = self._next_body()
            except TimeoutError:
                if waiting is None:
                    raise
                waiting()
                self.sock.settimeout(None)
                body = self._next_body()
            message = parse(body)
        except NotACoordinator as exc:
            raise self._not_ours(exc) from None
        except TimeoutError:
            raise CoordinatorUnreachable(
                f"coordinator at {self.host}:{self.port} did not answer") from None
        except OSError as exc:
            raise CoordinatorUnreachable(
                f"lost the coordinator at {self.host}:{self.port}: {exc}") from None
        if not isinstance(message.get("type"), str):
            raise self._not_ours(NotACoordinator(f"unknown message type {message.get('type')!r}"))
        return message

    def _next_body(self) -> bytes:
        while True:
            if len(self._buf) >= 4:
                length = int.from_bytes(self._buf[:4], "big")
                if length == 0 or length > MAX_FRAME:
                    raise NotACoordinator(f"bad frame length {length}")
                if len(self._buf) >= 4 + length:
                    body, self._buf = self._buf[4:4 + length], self._buf[4 + length:]
                    return body
            data = self.sock.recv(65536)
            if not data:
                raise CoordinatorUnreachable(
                    f"coordinator at {self.host}:{self.port} closed the connection")
            self._buf += data

    def _not_ours(self, exc: Exception) -> CoordinatorUnreachable:
        return CoordinatorUnreachable(f"{self.host}:{self.port} is not a dmtcp coordinator ({exc})")

    def close(self) -> None:
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _connect(host: str, port: int):
    """socket.create_connection's way: each address in turn."""
    error: OSError | None = None
    # an ASCII name as bytes: a str goes through the idna codec, whose
    # import (stringprep, unicodedata) costs 6 ms
    name = host.encode("ascii") if host.isascii() else host
    try:
        addresses = _socket.getaddrinfo(name, port, 0, _socket.SOCK_STREAM)
    except OSError as exc:
        error = exc
        addresses = []
    for family, kind, proto, _, address in addresses:
        sock = _socket.socket(family, kind | _socket.SOCK_CLOEXEC, proto)
        try:
            sock.settimeout(CONNECT_TIMEOUT)
            sock.connect(address)
            return sock
        except OSError as exc:
            error = exc
            sock.close()
    reason = (error.strerror or error) if error is not None else "no address"
    raise CoordinatorUnreachable(f"no coordinator at {host}:{port} ({reason})")
