"""A blocking client of the coordinator, for dmtcp-command and friends."""
from __future__ import annotations

import os
import socket

from dmtcp_py.errors import CoordinatorUnreachable, UserError
from dmtcp_py.paths import token_file
from dmtcp_py.protocol import codec, messages


def resolve_token(port: int) -> str:
    """The computation token: $DMTCP_COORD_TOKEN, else the local token file."""
    token = os.environ.get("DMTCP_COORD_TOKEN")
    if token:
        return token
    try:
        return token_file(port).read_text().strip()
    except OSError:
        return ""


class CoordinatorClient:
    def __init__(self, host: str, port: int, *, timeout: float | None = 10.0) -> None:
        self.host, self.port = host, port
        try:
            self.sock = socket.create_connection((host, port), timeout=5.0)
        except OSError as exc:
            raise CoordinatorUnreachable(
                f"no coordinator at {host}:{port} ({exc.strerror or exc})") from None
        self.sock.settimeout(10.0)  # a coordinator answers hello at once
        self._decoder = codec.Decoder()
        self._pending: list[dict] = []
        welcome = self.request(messages.make("hello", role="client", token=resolve_token(port)))
        self.sock.settimeout(timeout)
        if welcome["type"] == "refused":
            self.close()
            raise UserError(f"coordinator at {host}:{port} refused us: {welcome['error']}")

    def request(self, message: dict) -> dict:
        self._send(message)
        return self._next()

    def _send(self, message: dict) -> None:
        try:
            self.sock.sendall(codec.encode(message))
        except OSError as exc:
            raise CoordinatorUnreachable(
                f"lost the coordinator at {self.host}:{self.port}: {exc}") from None

    def _next(self) -> dict:
        try:
            while not self._pending:
                data = self.sock.recv(65536)
                if not data:
                    raise CoordinatorUnreachable(
                        f"coordinator at {self.host}:{self.port} closed the connection")
                self._pending.extend(self._decoder.feed(data))
        except socket.timeout:
            raise CoordinatorUnreachable(
                f"coordinator at {self.host}:{self.port} did not answer") from None
        except (codec.FrameError, messages.MessageError) as exc:
            raise CoordinatorUnreachable(
                f"{self.host}:{self.port} is not a dmtcp coordinator ({exc})") from None
        except OSError as exc:
            raise CoordinatorUnreachable(
                f"lost the coordinator at {self.host}:{self.port}: {exc}") from None
        try:
            return messages.validate(self._pending.pop(0))
        except messages.MessageError as exc:
            raise CoordinatorUnreachable(
                f"{self.host}:{self.port} is not a dmtcp coordinator ({exc})") from None

    def command_watching(self, cmd: str, on_progress, **fields) -> dict:
        """A command whose answer may be preceded by progress messages, each
        given to on_progress."""
        self._send(messages.make("command", cmd=cmd, progress=True, **fields))
        while True:
            message = self._next()
            if message["type"] != "progress":
                return message
            on_progress(message)

    def command(self, cmd: str, **fields) -> dict:
        return self.request(messages.make("command", cmd=cmd, **fields))

    def close(self) -> None:
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def coordinator_alive(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False
