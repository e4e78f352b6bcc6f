"""Replicas of images, agent to agent (--replicas; DESIGN.md section 8).

Every agent of a computation with replicas takes copies: it listens on its
address on the coordinator's network and writes what it receives into its
own checkpoint directory (images.transfer checks each file's sha256 and
publishes the copy atomically, 0600 in a 0700 directory).  A sender first
gives the computation's token; a connection without it is closed unread.

The sending side copies one published image to one host and says how it
went.  Both sides do their file and socket work in threads, as blocking
calls: a copy is a long stream of bytes, and the event loop keeps serving
the tree and its coordinator meanwhile.
"""
from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
from collections.abc import Callable
from pathlib import Path

from dmtcp_py.errors import ImageError
from dmtcp_py.images import transfer
from dmtcp_py.protocol.messages import ReplicaTarget
from dmtcp_py.tokens import same_token

log = logging.getLogger("agent")

CONNECT_TIMEOUT = 10.0
IO_TIMEOUT = 120.0      # a peer that sends or answers nothing for this long is gone
AT_ONCE = 2             # copies written at the same time by one agent
HELLO_MAX = 4096


class ReplicaServer:
    """Takes copies from the other hosts' agents."""

    def __init__(self, token: str, ckptdir: Callable[[], Path]) -> None:
        self._token = token
        self._ckptdir = ckptdir
        self._sock: socket.socket | None = None
        self._task: asyncio.Task | None = None
        self._slots = threading.BoundedSemaphore(AT_ONCE)

    async def start(self, address: str) -> int:
        """Listen on address; the port."""
        sock = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET,
                             socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, 0))
        sock.listen(16)
        sock.setblocking(False)
        self._sock = sock
        self._task = asyncio.create_task(self._accept())
        return sock.getsockname()[1]

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._sock is not None
        while True:
            conn, peer = await loop.sock_accept(self._sock)
            conn.setblocking(True)
            loop.run_in_executor(None, self._serve, conn, peer)

    def _serve(self, conn: socket.socket, peer) -> None:
        with conn, self._slots:
            conn.settimeout(IO_TIMEOUT)
            inp = conn.makefile("rb")
            try:
                hello = json.loads(inp.readline(HELLO_MAX) or b"null")
                token = hello.get("token", "") if isinstance(hello, dict) else ""
                if not same_token(str(token), self._token):
                    log.warning("replica from %s refused: not this computation's token", peer)
                    return
                path = transfer.receive(inp, self._ckptdir())
                answer = {"ok": True, "path": str(path)}
                log.info("replica from %s written: %s", peer[0], path)
            except (ImageError, OSError, ValueError) as exc:
                answer = {"ok": False, "error": str(exc)}
                log.warning("replica from %s not written: %s", peer[0], exc)
            try:
                conn.sendall(json.dumps(answer).encode() + b"\n")
            except OSError:
                pass

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._sock is not None:
            self._sock.close()


def send_copy(image: Path, generation: int, target: ReplicaTarget, token: str) -> str:
    """Copy the image (that generation of it) to target; the path it has
    there.  ImageError says why not.  Blocking: run it in a thread."""
    try:
        with socket.create_connection((target.address, target.port), CONNECT_TIMEOUT) as conn:
            conn.settimeout(IO_TIMEOUT)
            with conn.makefile("wb") as out:
                out.write(json.dumps({"token": token}).encode() + b"\n")
                transfer.send(image, out, generation=generation)
            conn.shutdown(socket.SHUT_WR)
            with conn.makefile("rb") as inp:
                answer = json.loads(inp.readline(HELLO_MAX) or b"null")
    except OSError as exc:
        raise ImageError(f"copying to {target.host} ({target.address}:{target.port}): "
                         f"{exc.strerror or exc}") from None
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise ImageError(f"{target.host} gave no answer for the copy")
    if not answer.get("ok"):
        raise ImageError(f"{target.host}: {answer.get('error') or 'the copy failed'}")
    return str(answer.get("path", ""))
