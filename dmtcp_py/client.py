"""A blocking client of the coordinator, for dmtcp-command and friends."""
from __future__ import annotations

import socket
from collections.abc import Callable

from dmtcp_py import tokens
from dmtcp_py.errors import CoordinatorUnreachable, UserError
from dmtcp_py.protocol import codec, messages
from dmtcp_py.protocol.messages import Cmd, Command, Hello, Message, Progress, Refused, Reply, Role


def refusal(host: str, port: int, refused: Refused) -> str:
    """One line for a coordinator's refusal of our hello."""
    return tokens.refusal(host, port, refused.error, refused.error == Refused.WRONG_TOKEN)


class CoordinatorClient:
    def __init__(self, host: str, port: int, *, timeout: float | None = 10.0) -> None:
        self.host, self.port = host, port
        try:
            self.sock = socket.create_connection((host, port), timeout=5.0)
        except OSError as exc:
            raise CoordinatorUnreachable(
                f"no coordinator at {host}:{port} ({exc.strerror or exc})") from None
        self.sock.settimeout(10.0)  # a coordinator answers hello at once
        self._reader = messages.Reader()
        welcome = self.request(Hello(role=Role.CLIENT, token=tokens.resolve_token(port)))
        self.sock.settimeout(timeout)
        if isinstance(welcome, Refused):
            self.close()
            raise UserError(refusal(host, port, welcome))

    def request(self, message: Message) -> Message:
        self._send(message)
        return self._next()

    def _send(self, message: Message) -> None:
        try:
            self.sock.sendall(messages.encode(message))
        except OSError as exc:
            raise CoordinatorUnreachable(
                f"lost the coordinator at {self.host}:{self.port}: {exc}") from None

    def _next(self) -> Message:
        try:
            while (message := self._reader.pop()) is None:
                data = self.sock.recv(65536)
                if not data:
                    raise CoordinatorUnreachable(
                        f"coordinator at {self.host}:{self.port} closed the connection")
                self._reader.push(data)
        except socket.timeout:
            raise CoordinatorUnreachable(
                f"coordinator at {self.host}:{self.port} did not answer") from None
        except (codec.FrameError, messages.MessageError) as exc:
            raise CoordinatorUnreachable(
                f"{self.host}:{self.port} is not a dmtcp coordinator ({exc})") from None
        except OSError as exc:
            raise CoordinatorUnreachable(
                f"lost the coordinator at {self.host}:{self.port}: {exc}") from None
        return message

    def _reply(self, message: Message) -> Reply:
        if not isinstance(message, Reply):
            raise CoordinatorUnreachable(
                f"{self.host}:{self.port} answered a command with {message.TYPE!r}")
        return message

    def command_watching(self, cmd: Cmd, on_progress: Callable[[Progress], object],
                         **fields) -> Reply:
        """A command whose answer may be preceded by progress messages, each
        given to on_progress."""
        self._send(self._command(cmd, progress=True, **fields))
        message = self._next()
        while isinstance(message, Progress):
            on_progress(message)
            message = self._next()
        return self._reply(message)

    def command(self, cmd: Cmd, **fields) -> Reply:
        """One command (the fields of messages.Command) and its reply."""
        self._send(self._command(cmd, **fields))
        return self._reply(self._next())

    @staticmethod
    def _command(cmd: Cmd, **fields) -> Command:
        try:
            return Command(cmd=cmd, **fields)
        except messages.MessageError as exc:  # e.g. an interval of inf or nan seconds
            raise UserError(f"cannot send {cmd.value}: {exc}") from None

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
