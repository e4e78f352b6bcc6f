"""Messages between coordinator, agents and command clients: one record
(frozen.py: a frozen dataclass made without the dataclasses module) per
kind, checked when it is built.

On the wire every message is a JSON object with "v" (the protocol version)
and "type".  `encode` and `decode` are the only places that know that form:
a message built here has the right types and ranges, so the machines never
convert or re-check a field, and a peer that sends something else gets a
MessageError, which closes that one connection.

The first message of every connection is a Hello carrying the computation
token.  Fields not named here are ignored on decoding (a newer peer may say
more); a wrong type or range of a named field is refused.
"""
from __future__ import annotations

import collections
import enum
import math
import sys
import types
import typing
from typing import Any, ClassVar

from dmtcp_py.frozen import MISSING, field, fields, is_record, record
from dmtcp_py.protocol import codec
from dmtcp_py.protocol.states import State

PROTOCOL_VERSION = 1


class MessageError(ValueError):
    """A well-framed message that is not one of ours."""


class Role(enum.Enum):
    AGENT = "agent"
    CLIENT = "client"


class Cmd(enum.Enum):
    STATUS = "status"
    LIST = "list"
    GRAPH = "graph"
    CHECKPOINT = "checkpoint"
    KILL = "kill"
    QUIT = "quit"
    INTERVAL = "interval"
    MIGRATE = "migrate"
    VACATE = "vacate"


class Move(enum.Enum):
    """A tree's part in a migration round (issue 16): it moves (dumped,
    restored elsewhere, then its old copy ends), or it stays (never
    dumped; its connections with moving trees are made again)."""
    GO = "go"
    STAY = "stay"


def _at_least(low: float, default: Any = MISSING):
    """A field whose value must be >= low."""
    return field(default=default, metadata={"min": low})


# ---- field checking ---------------------------------------------------------
# Each field's annotation says what it holds: int, float, str, bool, an enum,
# a nested record (one below), tuple[X, ...], dict[str, X], X | None,
# or Json (any JSON object, for what is only passed through).

Json = dict  # a JSON object whose content this module does not look into

_HINTS: dict[type, dict[str, Any]] = {}
_FLOAT_MAX = sys.float_info.max
_UNIONS = (typing.Union, types.UnionType)  # Optional[X] and X | None


def _hints(cls: type) -> dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    return hints


def _name(kind: Any) -> str:
    return getattr(kind, "__name__", str(kind))


def _optional(kind: Any) -> tuple[Any, bool]:
    """X of `X | None`, and whether None is allowed."""
    if typing.get_origin(kind) in _UNIONS:
        options = typing.get_args(kind)
        return next(k for k in options if k is not type(None)), type(None) in options
    return kind, False


def _check(kind: Any, value: Any, where: str) -> None:
    kind, nullable = _optional(kind)
    if value is None and nullable:
        return
    origin = typing.get_origin(kind)
    if origin is tuple:
        if not isinstance(value, tuple):
            raise MessageError(f"{where}: expected a list")
        item = typing.get_args(kind)[0]
        for n, v in enumerate(value):
            _check(item, v, f"{where}[{n}]")
        return
    if origin is dict:
        if not isinstance(value, dict):
            raise MessageError(f"{where}: expected an object")
        item = typing.get_args(kind)[1]
        for k, v in value.items():
            if not isinstance(k, str):
                raise MessageError(f"{where}: keys must be strings")
            _check(item, v, f"{where}[{k!r}]")
        return
    # bool is an int in Python, and JSON true == 1: keep them apart
    if kind is int:
        ok = type(value) is int
    elif kind is float:
        ok = type(value) in (int, float)
        # (an int too large for a float cannot be one either)
        if ok and not (abs(value) <= _FLOAT_MAX if type(value) is int else math.isfinite(value)):
            raise MessageError(f"{where}: not a finite number")
    else:
        ok = isinstance(value, kind)
    if not ok:
        raise MessageError(f"{where}: expected {_name(kind)}, got {type(value).__name__}")


class _Checked:
    """A record (frozen.py) that checks every field against its annotation
    and range when built."""

    def __post_init__(self) -> None:
        where = getattr(self, "TYPE", type(self).__name__)
        for f, kind in zip(fields(self), _field_kinds(type(self))):
            value = getattr(self, f.name)
            _check(kind, value, f"{where}.{f.name}")
            low = f.metadata.get("min")
            if low is not None and value is not None and value < low:
                raise MessageError(f"{where}.{f.name}: {value} is below {low}")


def _field_kinds(cls: type) -> list[Any]:
    hints = _hints(cls)
    return [hints[f.name] for f in fields(cls)]


def look_up_field_types() -> None:
    """Every record's field types, looked up now (typing.get_type_hints:
    ~5 ms for all of them here, at each kind's first use otherwise):
    processes forked after this (the agents of a many-tree restart) share
    them instead of each looking up its own."""
    for value in list(globals().values()):
        if isinstance(value, type) and issubclass(value, _Checked) and is_record(value):
            _hints(value)


# ---- records carried inside messages -----------------------------------------

@record
class ProcInfo(_Checked):
    """One process of a tree, as `dmtcp-command -l` shows it."""
    pid: int = _at_least(0)
    name: str = "?"
    rank: int | None = None  # its MPI rank, when a launcher gave it one


@record
class Endpoint(_Checked):
    """A parked socket as the agent reports it for matching: its own
    address and its peer's; a datagram socket has no connection."""
    local: str
    peer: str = ""
    udp: bool = False


@record
class ConnMatch(_Checked):
    """The answer for one endpoint: the connection it is an end of, and
    which end (the two ends drain and refill together)."""
    conn: str
    side: str

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.side not in ("a", "b"):
            raise MessageError(f"matched: side {self.side!r} is not a or b")


@record
class ImageInfo(_Checked):
    """One tree's image of a generation, as the restart script needs it."""
    path: str
    host: str
    tree_id: str
    program: str
    bytes: int = _at_least(0, 0)
    duration: float = _at_least(0.0, 0.0)
    processes: int = _at_least(0, 0)
    # copies of this image on other hosts (--replicas): where a restart
    # finds it when its own host is gone
    replicas: tuple[Copy, ...] = ()


@record
class Copy(_Checked):
    """Where a replica of an image is: a host, and the path there."""
    host: str
    path: str


@record
class ReplicaTarget(_Checked):
    """An agent that takes replicas: its host, and where it listens."""
    host: str
    address: str
    port: int = _at_least(1)


@record
class KilledProcess(_Checked):
    """A process of a tree that a failure signal killed (SIGKILL, SIGSEGV,
    a core dump...), as its parent saw it reaped."""
    pid: int = _at_least(1)
    signal: int = _at_least(1)
    name: str = "?"
    core: bool = False


@record
class FlowInfo(_Checked):
    """One established TCP connection of a tree: its two ends ("ip:port")
    and its byte counters since it began (sent: acknowledged by the peer)."""
    local: str
    peer: str
    sent: int = _at_least(0)
    received: int = _at_least(0)


# ---- messages ------------------------------------------------------------------

_KINDS: dict[str, type[Message]] = {}


def _message(type_: str):
    def register(cls):
        cls.TYPE = type_
        _KINDS[type_] = cls
        return cls
    return register


@record
class Message(_Checked):
    TYPE: ClassVar[str] = ""


# any peer -> coordinator, first message of a connection
@_message("hello")
@record
class Hello(Message):
    role: Role
    token: str
    host: str = "?"
    pid: int = _at_least(0, 0)
    program: str = "?"
    tree_id: str = "?"
    restart: bool = False      # an agent bringing a tree back from its image
    rejoin: bool = False       # an agent whose coordinator died comes back
    comp_id: str = ""          # restart and rejoin: the computation ...
    generation: int = _at_least(0, 0)  # ... and its generation
    num_trees: int = _at_least(1, 1)  # restart: trees of that generation
    image: ImageInfo | None = None    # restart: the image it restores
    # a client (dmtcp-launch): the tree it is about to start, whose agent
    # checkpoints wait for while this connection lasts (coordinator/launching.py)
    launching: str = ""
    # an agent: its tree wants a pre-copy before each checkpoint's suspend
    # (State.PRECOPIED, images.precopy)
    precopy: bool = False
    # A client with restart set claims the restart of tree_id (comp_id,
    # generation, num_trees as an agent's) before its agent joins, so that
    # CRIU may restore while the agent loads (coordinator/claims.py); that
    # agent's hello names the claim: the id the claim was welcomed with.
    claim: int = _at_least(0, 0)


# coordinator -> peer, the answer to hello
@_message("welcome")
@record
class Welcome(Message):
    comp_id: str
    agent_id: int = _at_least(0)
    generation: int = _at_least(0, 0)
    ckptdir: str | None = None  # offered to trees that did not choose their own
    # agents: a Heartbeat every `heartbeat` seconds (0: none); a coordinator
    # silent for `heartbeat_timeout` seconds is taken for lost
    heartbeat: float = _at_least(0.0, 0.0)
    heartbeat_timeout: float = _at_least(0.0, 0.0)
    # the coordinator restarts lost trees: a tree whose agent dies goes too
    # (its shims end their processes), so that its restored copy can take
    # its place
    auto_restart: bool = False
    # each published generation is copied to this many other hosts: the
    # agent takes copies too (and says where, ReplicaService)
    replicas: int = _at_least(0, 0)
    # previous generations each tree keeps beside its newest (--keep);
    # None: the tree's own choice, else store.KEEP_PREVIOUS
    keep: int | None = _at_least(0, None)


# agent -> coordinator: where it takes replicas of other hosts' images
@_message("replica_service")
@record
class ReplicaService(Message):
    address: str
    port: int = _at_least(1)


# coordinator -> agent: copy the published image of a generation there
@_message("replicate")
@record
class Replicate(Message):
    generation: int = _at_least(1)
    path: str = ""
    targets: tuple[ReplicaTarget, ...] = ()


# agent -> coordinator: a replica was written (or not) on a host
@_message("replicated")
@record
class Replicated(Message):
    generation: int = _at_least(1)
    host: str = "?"
    path: str = ""
    ok: bool = True
    error: str | None = None


# agent <-> coordinator: still here (any message says as much)
@_message("heartbeat")
@record
class Heartbeat(Message):
    pass


# agent -> coordinator, every few seconds while its tree runs: the tree's
# TCP connections and their counters (coordinator/traffic.py)
@_message("traffic")
@record
class Traffic(Message):
    flows: tuple[FlowInfo, ...] = ()


# agent -> coordinator, with each traffic sample: how busy the CPUs the
# tree may use are, and how much of them the tree had (coordinator/rebalance.py)
@_message("load")
@record
class Load(Message):
    interval: float = _at_least(0.0)  # seconds the figures are over
    cpus: tuple[int, ...] = ()        # the CPUs the tree may run on (its affinity)
    busy: float = _at_least(0.0, 0.0)      # busy CPUs among them, over the interval
    tree_cpu: float = _at_least(0.0, 0.0)  # CPUs the tree's processes used
    # the largest share of the interval a thread of the tree spent
    # runnable but waiting for a CPU (schedstat run_delay)
    wait: float = _at_least(0.0, 0.0)
    # which kernel: hosts that share one (containers, namespaces) share
    # their CPUs, and the computation's use of them is its own
    kernel: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.cpus or any(c < 0 for c in self.cpus):
            raise MessageError("load: cpus must name at least one CPU, none negative")


# agent -> coordinator, before it leaves: how its tree ended
@_message("tree_ended")
@record
class TreeEnded(Message):
    code: int                   # the program's exit code, or -N: killed by signal N
    requested: bool = False     # killed on the coordinator's word (Kill)
    checkpointed: bool = False  # ended by its checkpoint (--stop, -kc)
    # the first of its processes a failure signal killed, if any: with a
    # program that then failed too, the tree is lost
    killed: KilledProcess | None = None


@_message("refused")
@record
class Refused(Message):
    error: str

    # the coordinator's answer to a hello with another computation's token;
    # clients recognise it to say where their token came from
    WRONG_TOKEN = "wrong computation token"


# agent -> coordinator: the tree's processes now
@_message("peers")
@record
class Peers(Message):
    procs: tuple[ProcInfo, ...] = ()

    @property
    def count(self) -> int:
        return len(self.procs)


# agent -> coordinator: the tree reached a barrier's state (or failed to)
@_message("reached")
@record
class Reached(Message):
    state: State
    ok: bool
    error: str | None = None
    image: ImageInfo | None = None          # CHECKPOINTED of a checkpoint
    external: tuple[str, ...] = ()          # DRAINED: connections leading outside
    failed_conns: tuple[str, ...] = ()      # DRAINED: connections not drained here
    held: bool = False                      # migration, STAY: its connections to moving
                                            # trees are held; release it now (swap later)
    # SUSPENDED: the tree has sockets to hand over, or an inotify instance
    # whose reader the election names (or it cannot tell).  When no tree
    # has, the round skips the election, the drain and the refill
    sockets: bool = True


# agent -> coordinator: the images of a generation are durable (or not)
@_message("published")
@record
class Published(Message):
    generation: int = _at_least(1)
    ok: bool = True
    error: str | None = None


# agent -> coordinator: parked sockets, for matching their two ends
@_message("sockets")
@record
class Sockets(Message):
    generation: int = _at_least(0)
    endpoints: tuple[Endpoint, ...] = ()


# agent -> coordinator: a name (where a listener or connection end is now)
@_message("publish")
@record
class Publish(Message):
    key: str
    value: str


@_message("lookup")
@record
class Lookup(Message):
    key: str


# a program under control asked for a checkpoint (dmtcp_checkpoint())
@_message("ckpt_request")
@record
class CkptRequest(Message):
    pass


# agent -> coordinator -> clients that asked for it: image bytes written so
# far, of about this many (the trees' resident memory)
@_message("progress")
@record
class Progress(Message):
    generation: int = _at_least(0)
    written: int = _at_least(0)
    expected: int = _at_least(0)
    trees: int = _at_least(0, 0)       # to clients: trees in the round ...
    reporting: int = _at_least(0, 0)   # ... and how many reported so far


# agent <-> agent, through the coordinator: refill data of one connection
@_message("relay")
@record
class Relay(Message):
    conn: str
    data: str  # base64


# coordinator -> agent: go to this state
@_message("barrier")
@record
class Barrier(Message):
    state: State
    generation: int = _at_least(0, 0)
    stop: bool = False                     # the trees end after the dump
    num_trees: int = _at_least(1, 1)
    failed_conns: tuple[str, ...] = ()     # connections not to refill
    move: Move | None = None               # a migration round: this tree's part
    reconnect: tuple[str, ...] = ()        # STAY, CHECKPOINTED: connections to make again
    rollback: bool = False                 # REFILLED: the migration failed; all as it was
    hold: bool = False                     # STAY, CHECKPOINTED: run on, holding them if you can
    swap: bool = False                     # a held tree's second stop: DRAINED and CHECKPOINTED


@_message("kill")
@record
class Kill(Message):
    moved_to: str = ""  # the tree runs on there now: its old copy ends, no failure


# coordinator -> agent: the migration failed; stop making connections
# again (what waits for the moved trees' new copies gives up)
@_message("cancel_move")
@record
class CancelMove(Message):
    pass


# coordinator -> agent: the ends of connections under control
@_message("matched")
@record
class Matched(Message):
    generation: int = _at_least(0)
    peers: dict[str, ConnMatch] = field(default_factory=dict)  # endpoint id -> match
    udp: tuple[str, ...] = ()  # datagram addresses inside the computation


# coordinator -> agent: every tree dumped (ok) or one failed
@_message("commit")
@record
class Commit(Message):
    generation: int = _at_least(1)
    ok: bool = True


# coordinator -> agent: a checkpoint round ended, every image published
# (ok), or it failed
@_message("generation_done")
@record
class GenerationDone(Message):
    generation: int = _at_least(0)
    ok: bool = True


@_message("found")
@record
class Found(Message):
    key: str
    value: str


# client -> coordinator
@_message("command")
@record
class Command(Message):
    cmd: Cmd
    blocking: bool = False     # checkpoint: answer when it is over
    stop: bool = False         # checkpoint: the trees end after the dump
    progress: bool = False     # checkpoint: send Progress while it runs
    seconds: float = _at_least(0.0, 0.0)  # interval
    auto: bool = False         # interval: the coordinator chooses it (seconds unused)
    trees: tuple[str, ...] = ()  # migrate: tree ids, or HOST:PID of a process in each
    to: str = ""               # migrate, vacate: the host they go to ("": their own)
    host: str = ""             # vacate: the host every tree leaves
    with_group: bool = False   # migrate: with the trees each one talks to most


# coordinator -> client.  What a reply holds depends on the command (status
# fields, the trees, a checkpoint's figures); it travels flat beside ok and
# error, and the coordinator is the only one that builds it.
@_message("reply")
@record
class Reply(Message):
    ok: bool
    error: str | None = None
    body: Json = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__post_init__()
        clash = {"v", "type", "ok", "error"} & self.body.keys()
        if clash:
            raise MessageError(f"reply: body repeats {sorted(clash)}")


# ---- the wire ---------------------------------------------------------------------

def to_wire(message: Message) -> dict:
    """The JSON object of a message, with the version and its type."""
    out: dict[str, Any] = {"v": PROTOCOL_VERSION, "type": message.TYPE}
    for f in fields(message):
        value = getattr(message, f.name)
        if isinstance(message, Reply) and f.name == "body":
            out.update(value)
        elif value is not None:
            out[f.name] = _plain(value)
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if is_record(value):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)
                if getattr(value, f.name) is not None}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def encode(message: Message) -> bytes:
    """One frame for the wire."""
    return codec.encode(to_wire(message))


def decode(raw: dict) -> Message:
    """A typed message from a decoded JSON object, or MessageError."""
    # exactly the int: JSON true and 1.0 compare equal to 1 in Python
    if type(raw.get("v")) is not int or raw["v"] != PROTOCOL_VERSION:
        raise MessageError(f"protocol version {raw.get('v')!r}, expected {PROTOCOL_VERSION}")
    type_ = raw.get("type")
    cls = _KINDS.get(type_) if isinstance(type_, str) else None
    if cls is None:
        raise MessageError(f"unknown message type {type_!r}")
    kwargs = _fields_from(cls, raw, type_)
    if cls is Reply:
        kwargs["body"] = {k: v for k, v in raw.items() if k not in ("v", "type", "ok", "error")}
    return cls(**kwargs)


def _fields_from(cls: type, raw: dict, where: str) -> dict:
    kwargs: dict[str, Any] = {}
    for f, kind in zip(fields(cls), _field_kinds(cls)):
        if f.name in raw:
            kwargs[f.name] = _typed(kind, raw[f.name], f"{where}.{f.name}")
        elif f.default is MISSING and f.default_factory is MISSING:
            raise MessageError(f"{where}: field {f.name!r} missing")
    return kwargs


def _typed(kind: Any, value: Any, where: str) -> Any:
    """The wire value as the annotation's type (lists become tuples, objects
    records, strings enums); what cannot be converted is left for the
    check, which names it."""
    kind, nullable = _optional(kind)
    if value is None and nullable:
        return None
    origin = typing.get_origin(kind)
    if origin is tuple and isinstance(value, list):
        item = typing.get_args(kind)[0]
        return tuple(_typed(item, v, f"{where}[{n}]") for n, v in enumerate(value))
    if origin is dict and isinstance(value, dict):
        item = typing.get_args(kind)[1]
        return {k: _typed(item, v, f"{where}[{k!r}]") for k, v in value.items()}
    if kind is float and type(value) is int and abs(value) <= _FLOAT_MAX:
        return float(value)  # JSON 5 for 5.0: a float field holds a float
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        try:
            return kind(value)
        except ValueError:
            raise MessageError(f"{where}: unknown value {value!r}") from None
    if is_record(kind) and isinstance(value, dict):
        try:
            return kind(**_fields_from(kind, value, where))
        except TypeError as exc:
            raise MessageError(f"{where}: {exc}") from None
    return value


class Reader:
    """Bytes in, typed messages out, for one connection.  A FrameError or
    MessageError means the peer is not one of ours: close the connection."""

    def __init__(self) -> None:
        self._decoder = codec.Decoder()
        self._queue: collections.deque[Message] = collections.deque()

    def feed(self, data: bytes) -> list[Message]:
        """The messages completed by data (for a peer driven by callbacks)."""
        return [decode(raw) for raw in self._decoder.feed(data)]

    def push(self, data: bytes) -> None:
        """Queue the messages completed by data (for a peer that reads)."""
        self._queue.extend(self.feed(data))

    def pop(self) -> Message | None:
        """The oldest queued message; None: read more and push it."""
        return self._queue.popleft() if self._queue else None
