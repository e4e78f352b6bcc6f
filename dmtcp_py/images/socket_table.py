"""The manifest's socket table: one row per socket the agent parked at the
checkpoint (DESIGN.md sections 3-4), read again at restart to make the
socket anew, and by dmtcp-inspect.

A row is two things: what the socket is (`SocketInfo`, as the agent found
it when the socket was parked: agent.fdtable.describe builds it, nothing
changes it afterwards) and what the agent learned of it during the round
(`SocketRow`'s other fields: which connection it is an end of, whether it
leads out of the computation, where its drained bytes and queued datagrams
were written).

In manifest.json a row is one flat JSON object; `SocketRow.to_json` and
`SocketRow.from_json` are the only places that know that form.  Optional
keys are written only when they say something, as images have always had
them; keys not named here are ignored on reading (a newer writer may say
more); a key of the wrong type is an ImageError naming the row and the key.
"""
from __future__ import annotations

import ipaddress
import socket
from typing import Any

from dmtcp_py.errors import ImageError
from dmtcp_py.frozen import record

# a socket address: (ip, port) for AF_INET/AF_INET6 (an [ip, port] list in
# JSON), a Unix socket's path or "@abstract name", or None (unbound, no peer)
Address = tuple[str, int] | str | None
# a socket option as the program set it: (level, name, value in hex)
Option = tuple[int, int, str]

SIDES = ("a", "b")  # of a connection; at restart side a listens, side b connects


@record
class SocketInfo:
    """What one parked socket is.  Built once, when it is parked (or read
    from the image at restart); never changed."""
    ino: int
    family: int
    type: int
    proto: int
    listening: bool
    local: Address
    peer: Address
    options: tuple[Option, ...]
    key: str                  # this end's name, which the coordinator matches
    peer_key: str | None      # the peer's name; None without a peer

    @property
    def is_udp(self) -> bool:
        return self.type == socket.SOCK_DGRAM and self.family in (socket.AF_INET,
                                                                   socket.AF_INET6)


@record
class Connection:
    """A connection under control: its id, and which end this socket is."""
    conn: str
    side: str


@record
class SocketRow:
    """One row of the manifest's socket table."""
    info: SocketInfo
    copies: tuple[tuple[int, int], ...]     # (pid, fd) of every process holding it
    leader: bool = True                     # its holders include the fd leader
    connection: Connection | None = None    # matched with its peer's end
    external: bool = False                  # a connection leading out of the computation
    peer_known: bool | None = None          # UDP: its peer is in the computation
    drained: str | None = None              # file in the image: bytes in flight (drain.Drained)
    drained_bytes: int = 0
    datagrams: str | None = None            # file in the image: queued datagrams
    datagram_count: int = 0

    def to_json(self) -> dict:
        i = self.info
        out: dict[str, Any] = {
            "ino": i.ino, "family": i.family, "type": i.type, "proto": i.proto,
            "listening": i.listening, "local": address_json(i.local),
            "peer": address_json(i.peer), "options": [list(o) for o in i.options],
            "key": i.key, "peer_key": i.peer_key,
            "copies": [list(c) for c in self.copies], "leader": self.leader,
        }
        if self.external:
            out["external"] = True
        if self.peer_known is not None:
            out["peer_known"] = self.peer_known
        if self.connection is not None:
            out["conn"], out["side"] = self.connection.conn, self.connection.side
        if self.drained is not None:
            out["drained"], out["drained_bytes"] = self.drained, self.drained_bytes
        if self.datagrams is not None:
            out["datagrams"], out["datagram_count"] = self.datagrams, self.datagram_count
        return out

    @classmethod
    def from_json(cls, raw: object, where: str = "socket table row") -> SocketRow:
        """One row of a manifest; ImageError, naming where, if it is not one."""
        r = _Reader(raw, where)
        info = SocketInfo(
            ino=r.count("ino"), family=r.integer("family"), type=r.integer("type"),
            proto=r.integer("proto"), listening=r.flag("listening", False),
            local=r.address("local"), peer=r.address("peer"), options=r.options("options"),
            key=r.text("key"), peer_key=r.text("peer_key", None))
        connection = None
        if r.text("conn", None) is not None:
            side = r.text("side")
            if side not in SIDES:
                r.fail("side", f"must be one of {', '.join(SIDES)}")
            connection = Connection(r.text("conn"), side)
        drained, datagrams = r.file("drained"), r.file("datagrams")
        return cls(
            info=info, copies=r.copies("copies"), leader=r.flag("leader", True),
            connection=connection, external=r.flag("external", False),
            peer_known=r.flag("peer_known", None),
            drained=drained, drained_bytes=r.count("drained_bytes", 0) if drained else 0,
            datagrams=datagrams,
            datagram_count=r.count("datagram_count", 0) if datagrams else 0)


def encode(rows: list[SocketRow]) -> list[dict]:
    return [row.to_json() for row in rows]


def decode(table: object, source: str = "") -> list[SocketRow]:
    """The manifest's "sockets" list as rows; source (the manifest's path)
    goes into the message of the ImageError a corrupt row raises."""
    prefix = f"{source}: " if source else ""
    if not isinstance(table, list):
        raise ImageError(f"{prefix}the socket table is corrupt: not a list")
    return [SocketRow.from_json(raw, f"{prefix}socket table row {n}")
            for n, raw in enumerate(table)]


def address_json(addr: Address) -> list | str | None:
    """An address as the table stores it: [ip, port], a name, or null."""
    return list(addr) if isinstance(addr, tuple) else addr


_MISSING = object()


class _Reader:
    """Typed reads of one row's keys; a missing or mistyped key fails the row."""

    def __init__(self, raw: object, where: str) -> None:
        if not isinstance(raw, dict):
            raise ImageError(f"{where} is corrupt: not an object but {type(raw).__name__}")
        self.raw, self.where = raw, where

    def fail(self, key: str, what: str) -> None:
        value = repr(self.raw.get(key))
        if len(value) > 60:
            value = value[:57] + "..."
        raise ImageError(f"{self.where} is corrupt: {key!r} {what} (it is {value})")

    def _get(self, key: str, default: Any) -> Any:
        value = self.raw.get(key, _MISSING)
        if value is _MISSING:
            if default is _MISSING:
                raise ImageError(f"{self.where} is corrupt: {key!r} is missing")
            return default
        return value

    def integer(self, key: str, default: Any = _MISSING) -> int:
        value = self._get(key, default)
        # JSON true is not a number here, though Python's bool is an int
        if value is not default and type(value) is not int:
            self.fail(key, "must be an integer")
        return value

    def count(self, key: str, default: Any = _MISSING) -> int:
        value = self.integer(key, default)
        if value is not default and value < 0:
            self.fail(key, "must not be negative")
        return value

    def flag(self, key: str, default: Any = _MISSING) -> bool:
        value = self._get(key, default)
        if value is not default and type(value) is not bool:
            self.fail(key, "must be true or false")
        return value

    def text(self, key: str, default: Any = _MISSING) -> str:
        value = self._get(key, default)
        if value is not default and (type(value) is not str or not value):
            self.fail(key, "must be a non-empty string")
        return value

    def address(self, key: str) -> Address:
        value = self._get(key, None)
        if value is None or isinstance(value, str):
            return value or None
        if isinstance(value, list) and len(value) == 2 and type(value[0]) is str \
                and type(value[1]) is int and 0 <= value[1] <= 65535:
            return (value[0], value[1])
        self.fail(key, "must be [ip, port], a Unix socket name or null")

    def options(self, key: str) -> tuple[Option, ...]:
        value = self._get(key, ())
        if not isinstance(value, (list, tuple)):
            self.fail(key, "must be a list of [level, name, hex value]")
        out = []
        for item in value:
            if not (isinstance(item, list) and len(item) == 3 and type(item[0]) is int
                    and type(item[1]) is int and type(item[2]) is str and _is_hex(item[2])):
                self.fail(key, "must be a list of [level, name, hex value]")
            out.append((item[0], item[1], item[2]))
        return tuple(out)

    def copies(self, key: str) -> tuple[tuple[int, int], ...]:
        value = self._get(key, _MISSING)
        if not isinstance(value, list) or not all(
                isinstance(c, list) and len(c) == 2 and all(type(n) is int and n >= 0 for n in c)
                for c in value):
            self.fail(key, "must be a list of [pid, fd]")
        return tuple((pid, fd) for pid, fd in value)

    def file(self, key: str) -> str | None:
        """The name of a file beside the manifest (never a path elsewhere)."""
        name = self.text(key, None)
        if name is not None and ("/" in name or name in (".", "..")):
            self.fail(key, "must name a file of the image")
        return name


def _is_hex(text: str) -> bool:
    try:
        bytes.fromhex(text)
    except ValueError:
        return False
    return True


def is_namespace_local(ip: str) -> bool:
    """An address that means something only inside one network namespace
    (loopback, the wildcard; also what is no IP address at all): every
    host has it, and it names a different place on each."""
    try:
        addr = ipaddress.ip_address(ip.split("%")[0])
    except ValueError:
        return True
    mapped = getattr(addr, "ipv4_mapped", None)
    addr = mapped or addr
    return addr.is_loopback or addr.is_unspecified
