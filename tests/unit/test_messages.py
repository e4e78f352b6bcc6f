"""Typed messages: built and checked, to the wire and back, refused when wrong."""
from __future__ import annotations

import dataclasses
import enum
import json
import math
import subprocess
import sys
import types
import typing

import pytest

from dmtcp_py.protocol import codec, messages
from dmtcp_py.protocol.messages import (
    PROTOCOL_VERSION,
    Barrier,
    CancelMove,
    CkptRequest,
    Cmd,
    Command,
    Commit,
    ConnMatch,
    Endpoint,
    Found,
    GenerationDone,
    Hello,
    ImageInfo,
    Kill,
    Lookup,
    Matched,
    MessageError,
    Move,
    Peers,
    ProcInfo,
    Progress,
    Publish,
    Published,
    Reached,
    Refused,
    Relay,
    Reply,
    Role,
    Sockets,
    Welcome,
)
from dmtcp_py.protocol.states import State

IMAGE = ImageInfo(path="/ckpt/ckpt_prog_t1.dmtcp", host="node1", tree_id="t1", program="prog",
                  bytes=4096, duration=0.25, processes=3)

# every kind, with its optional fields and nested records filled in where it has any
EXAMPLES: list[messages.Message] = [
    Hello(role=Role.AGENT, token="t", host="node1", pid=42, program="prog", tree_id="t1",
          restart=True, comp_id="c", generation=3, num_trees=2),
    Hello(role=Role.CLIENT, token="t"),
    Welcome(comp_id="c", agent_id=3, generation=2, ckptdir="/ckpt"),
    Welcome(comp_id="c", agent_id=0),
    Welcome(comp_id="c", agent_id=1, heartbeat=1.0, heartbeat_timeout=5.0, auto_restart=True),
    messages.Heartbeat(),
    messages.TreeEnded(code=-9),
    messages.TreeEnded(code=1, killed=messages.KilledProcess(pid=7, signal=11, name="w",
                                                             core=True)),
    Welcome(comp_id="c", agent_id=2, replicas=2),
    messages.ReplicaService(address="198.18.0.2", port=4000),
    messages.Replicate(generation=3, path="/ck/ckpt_a_1.dmtcp", targets=(
        messages.ReplicaTarget(host="h3", address="198.18.0.3", port=4001),)),
    messages.Replicated(generation=3, host="h3", path="/ck/ckpt_a_1.dmtcp"),
    messages.Replicated(generation=3, host="h3", ok=False, error="disk full"),
    messages.TreeEnded(code=3, requested=True, checkpointed=True),
    Refused(error="no"),
    Peers(procs=(ProcInfo(pid=1, name="a"), ProcInfo(pid=2, name="b", rank=0))),
    Peers(),
    messages.Traffic(flows=(messages.FlowInfo(local="198.18.0.1:5000", peer="198.18.0.2:40000",
                                              sent=10, received=20),)),
    messages.Traffic(),
    messages.Load(interval=5.0, cpus=(0, 1), busy=1.5, tree_cpu=0.5, wait=0.4, kernel="b00t"),
    Reached(state=State.SUSPENDED, ok=True),
    Reached(state=State.DRAINED, ok=False, error="drain failed", external=("tcp:a>tcp:b",),
            failed_conns=("a|b",)),
    Reached(state=State.CHECKPOINTED, ok=True, image=IMAGE),
    Published(generation=1, ok=False, error="disk full"),
    Sockets(generation=1, endpoints=(Endpoint(local="tcp:a", peer="tcp:b"),
                                     Endpoint(local="udp:c", udp=True))),
    Publish(key="k", value="198.18.0.1:5"),
    Lookup(key="k"),
    CkptRequest(),
    Progress(generation=1, written=10, expected=100, trees=2, reporting=1),
    Relay(conn="a|b", data="AAAA"),
    Barrier(state=State.DRAINED, generation=4, stop=True, num_trees=7, failed_conns=("a|b",)),
    Kill(),
    Kill(moved_to="h4"),
    Barrier(state=State.CHECKPOINTED, generation=2, move=Move.STAY, reconnect=("a|b",)),
    Barrier(state=State.REFILLED, generation=2, rollback=True),
    CancelMove(),
    Command(cmd=Cmd.MIGRATE, trees=("t1", "h1:42"), to="h4", with_group=True),
    Command(cmd=Cmd.VACATE, host="h1", to="h2"),
    Matched(generation=1, peers={"tcp:a>tcp:b": ConnMatch(conn="tcp:a|tcp:b", side="a")},
            udp=("udp:c",)),
    Commit(generation=1, ok=False),
    GenerationDone(generation=2, ok=True),
    Found(key="k", value="198.18.0.1:5"),
    Command(cmd=Cmd.CHECKPOINT, blocking=True, stop=True, progress=True),
    Command(cmd=Cmd.INTERVAL, seconds=2.5),
    Reply(ok=True, body={"num_peers": 2, "last_checkpoint": None,
                         "trees": [{"procs": [[1, "a"]]}]}),
    Reply(ok=False, error="no processes to checkpoint"),
]


def kinds() -> list[type]:
    return sorted({type(m) for m in EXAMPLES}, key=lambda k: k.TYPE)


def example(kind: type) -> messages.Message:
    return next(m for m in EXAMPLES if type(m) is kind)


def wire(kind: type, **fields) -> dict:
    """The wire form of kind's first example, with fields replaced."""
    return {**messages.to_wire(example(kind)), **fields}


def registered() -> set[type]:
    return {k for k in vars(messages).values()
            if isinstance(k, type) and issubclass(k, messages.Message) and k.TYPE}


def field_kinds(cls: type) -> list[tuple[str, typing.Any, bool]]:
    """(name, annotation, required) of every field of a message or record."""
    hints = typing.get_type_hints(cls)
    return [(f.name, hints[f.name], f.default is dataclasses.MISSING
             and f.default_factory is dataclasses.MISSING) for f in dataclasses.fields(cls)]


# ---- round trips ------------------------------------------------------------------

def test_every_kind_has_an_example():
    assert set(kinds()) == registered()
    assert len({k.TYPE for k in registered()}) == len(registered())


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: m.TYPE)
def test_round_trip(message):
    raw = messages.to_wire(message)
    assert raw["v"] == PROTOCOL_VERSION and raw["type"] == message.TYPE
    # through JSON as the peer sees it: lists, objects, strings
    assert messages.decode(json.loads(json.dumps(raw))) == message
    assert messages.decode(raw) == message
    reader = messages.Reader()
    assert reader.feed(messages.encode(message)) == [message]


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: m.TYPE)
def test_wire_form_is_plain_json(message):
    raw = messages.to_wire(message)
    assert json.loads(json.dumps(raw, allow_nan=False)) == raw
    assert messages.encode(message) == codec.encode(raw)


def test_wire_form_of_enums_and_records():
    raw = messages.to_wire(EXAMPLES[0])
    assert raw["role"] == "agent"
    raw = messages.to_wire(Reached(state=State.CHECKPOINTED, ok=True, image=IMAGE))
    assert raw["state"] == "CHECKPOINTED" and raw["image"]["path"] == IMAGE.path
    assert "error" not in raw  # None is left out
    raw = messages.to_wire(Peers(procs=(ProcInfo(pid=1, name="a"), ProcInfo(pid=2, rank=3))))
    assert raw["procs"] == [{"pid": 1, "name": "a"}, {"pid": 2, "name": "?", "rank": 3}]
    raw = messages.to_wire(EXAMPLES[[type(m) for m in EXAMPLES].index(Matched)])
    assert raw["peers"] == {"tcp:a>tcp:b": {"conn": "tcp:a|tcp:b", "side": "a"}}
    assert raw["udp"] == ["udp:c"]


def test_defaults_fill_what_the_wire_leaves_out():
    hello = messages.decode({"v": 1, "type": "hello", "role": "agent", "token": "t"})
    assert hello == Hello(role=Role.AGENT, token="t")
    assert (hello.host, hello.pid, hello.num_trees, hello.restart) == ("?", 0, 1, False)
    barrier = messages.decode({"v": 1, "type": "barrier", "state": "SUSPENDED"})
    assert barrier.failed_conns == () and barrier.num_trees == 1


def test_peers_count_is_the_number_of_procs():
    assert Peers(procs=(ProcInfo(pid=1), ProcInfo(pid=2))).count == 2
    assert Peers().count == 0


# ---- the reply's body --------------------------------------------------------------

def test_reply_body_is_flat_on_the_wire():
    reply = Reply(ok=True, body={"num_peers": 2, "running": True, "note": None})
    raw = messages.to_wire(reply)
    assert raw == {"v": 1, "type": "reply", "ok": True, "num_peers": 2, "running": True,
                   "note": None}
    back = messages.decode(raw)
    assert back == reply and back.body == {"num_peers": 2, "running": True, "note": None}


def test_reply_error_is_beside_the_body():
    raw = {"v": 1, "type": "reply", "ok": False, "error": "no", "generation": 3}
    reply = messages.decode(raw)
    assert (reply.ok, reply.error, reply.body) == (False, "no", {"generation": 3})
    assert messages.to_wire(reply) == raw


@pytest.mark.parametrize("key", ["v", "type", "ok", "error"])
def test_reply_body_may_not_repeat_the_envelope(key):
    with pytest.raises(MessageError, match="body repeats"):
        Reply(ok=True, body={key: 1})


# ---- what is refused -----------------------------------------------------------------

@pytest.mark.parametrize("version", [None, 0, 2, "1", True, 1.0, [1]])
def test_wrong_version(version):
    with pytest.raises(MessageError, match="protocol version"):
        messages.decode(wire(Kill, v=version))


def test_missing_version():
    raw = wire(Kill)
    del raw["v"]
    with pytest.raises(MessageError, match="protocol version None"):
        messages.decode(raw)


@pytest.mark.parametrize("type_", ["nope", "", "HELLO", None, 5, ["hello"], {"a": 1}])
def test_unknown_type(type_):
    with pytest.raises(MessageError, match="unknown message type"):
        messages.decode({"v": PROTOCOL_VERSION, "type": type_})


def test_missing_type():
    with pytest.raises(MessageError, match="unknown message type None"):
        messages.decode({"v": PROTOCOL_VERSION})


def _required_fields():
    for kind in kinds():
        for name, _, required in field_kinds(kind):
            if required:
                yield kind, name


@pytest.mark.parametrize("kind,name", list(_required_fields()),
                         ids=lambda x: getattr(x, "TYPE", x))
def test_missing_required_field(kind, name):
    raw = wire(kind)
    del raw[name]
    with pytest.raises(MessageError, match=f"{kind.TYPE}: field '{name}' missing"):
        messages.decode(raw)


def _wrong_values(kind) -> list:
    """Values of the wrong type for a field of this annotation."""
    optional = typing.get_origin(kind) in (typing.Union, types.UnionType)
    if optional:
        kind = next(k for k in typing.get_args(kind) if k is not type(None))
    origin = typing.get_origin(kind)
    wrong: list = [] if optional else [None]
    if origin is tuple:
        return wrong + ["a", {"a": 1}, 1, [[[]]]]
    if origin is dict:
        return wrong + [[1], "a", 1, {"k": [[]]}]
    if kind is bool:
        return wrong + [0, 1, "true", [], {}]
    if kind is int:
        return wrong + [True, False, 1.0, 1.5, "1", [], {}]
    if kind is float:
        return wrong + [True, "1.0", [], {}]
    if kind is str:
        return wrong + [1, True, [], {}]
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return wrong + ["bogus", 1, True, [], {}]
    if dataclasses.is_dataclass(kind):
        return wrong + ["a", 1, [1], True]
    raise AssertionError(f"no wrong values for {kind}")


def _typed_fields():
    for kind in kinds():
        for name, annotation, _ in field_kinds(kind):
            if kind is Reply and name == "body":
                continue  # not a field on the wire: the rest of the object
            for value in _wrong_values(annotation):
                yield kind, name, value


@pytest.mark.parametrize("kind,name,value", list(_typed_fields()),
                         ids=lambda x: getattr(x, "TYPE", repr(x)))
def test_wrong_type_of_field(kind, name, value):
    with pytest.raises(MessageError):
        messages.decode(wire(kind, **{name: value}))


@pytest.mark.parametrize("raw", [
    wire(Welcome, agent_id=True), wire(Progress, written=False), wire(Hello, pid=True),
    wire(Barrier, generation=True), wire(Peers, procs=[{"pid": True}]),
])
def test_bool_is_not_an_int(raw):
    with pytest.raises(MessageError, match="expected int, got bool"):
        messages.decode(raw)


@pytest.mark.parametrize("raw", [wire(Reached, ok=1), wire(Reply, ok=0), wire(Hello, restart=1),
                                 wire(Command, blocking="yes")])
def test_int_is_not_a_bool(raw):
    with pytest.raises(MessageError, match="expected bool"):
        messages.decode(raw)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 10 ** 400, -(10 ** 400)])
def test_not_finite_numbers(value):
    with pytest.raises(MessageError, match="not a finite number"):
        messages.decode(wire(Command, cmd="interval", seconds=value))
    with pytest.raises(MessageError, match="not a finite number"):
        Command(cmd=Cmd.INTERVAL, seconds=value)


@pytest.mark.parametrize("raw", [
    wire(Command, cmd="interval", seconds=-1), wire(Command, cmd="interval", seconds=-0.5),
    wire(Hello, pid=-1), wire(Hello, num_trees=0), wire(Hello, generation=-1),
    wire(Welcome, agent_id=-3), wire(Progress, written=-1), wire(Published, generation=0),
    wire(Commit, generation=0), wire(Barrier, num_trees=0),
    wire(Peers, procs=[{"pid": -1}]),
    wire(Reached, image={**messages.to_wire(Reached(state=State.CHECKPOINTED, ok=True,
                                                    image=IMAGE))["image"], "bytes": -1}),
])
def test_numbers_below_their_range(raw):
    with pytest.raises(MessageError, match="below"):
        messages.decode(raw)


def test_an_int_on_the_wire_for_a_float_is_a_float():
    seconds = messages.decode(wire(Command, cmd="interval", seconds=5)).seconds
    assert seconds == 5.0 and type(seconds) is float


@pytest.mark.parametrize("raw,match", [
    (wire(Hello, role="admin"), "hello.role: unknown value 'admin'"),
    (wire(Hello, role="Agent"), "unknown value"),
    (wire(Command, cmd="restart"), "command.cmd: unknown value 'restart'"),
    (wire(Command, cmd="STATUS"), "unknown value"),
    (wire(Reached, state="BOGUS"), "reached.state: unknown value 'BOGUS'"),
    (wire(Barrier, state="running"), "unknown value"),
])
def test_unknown_enum_values(raw, match):
    with pytest.raises(MessageError, match=match):
        messages.decode(raw)


@pytest.mark.parametrize("raw", [
    wire(Peers, procs=[[1, "a"]]),                          # the old list form
    wire(Peers, procs=[{"name": "a"}]),                      # pid missing
    wire(Peers, procs=[{"pid": 1, "name": 2}]),
    wire(Reached, state="CHECKPOINTED", image={"path": "/x"}),  # host ... missing
    wire(Reached, state="CHECKPOINTED", image="/x"),
    wire(Sockets, endpoints=["tcp:a>tcp:b"]),
    wire(Sockets, endpoints=[{"peer": "tcp:b"}]),
    wire(Sockets, endpoints=[{"local": "tcp:a", "udp": "yes"}]),
    wire(Matched, peers={"e": {"conn": "a|b", "side": "c"}}),
    wire(Matched, peers={"e": {"conn": "a|b"}}),
    wire(Matched, peers={"e": "a|b"}),
    wire(Matched, udp=[1]),
])
def test_wrong_nested_records(raw):
    with pytest.raises(MessageError):
        messages.decode(raw)


def test_unknown_fields_are_ignored():
    raw = wire(Reached, state="CHECKPOINTED", image={**messages.to_wire(
        Reached(state=State.CHECKPOINTED, ok=True, image=IMAGE))["image"], "later": [1]},
        newer_field={"x": 1})
    message = messages.decode(raw)
    assert message.image == IMAGE and not hasattr(message, "newer_field")
    assert messages.decode(wire(Kill, extra=1)) == Kill()
    peers = messages.decode(wire(Peers, procs=[{"pid": 1, "name": "a", "cpu": 3}]))
    assert peers.procs == (ProcInfo(pid=1, name="a"),)


# ---- building ------------------------------------------------------------------------

@pytest.mark.parametrize("build", [
    lambda: Welcome(comp_id="c", agent_id=True),
    lambda: Welcome(comp_id=1, agent_id=1),
    lambda: Hello(role="agent", token="t"),  # the enum, not its value
    lambda: Reached(state="SUSPENDED", ok=True),
    lambda: Reached(state=State.SUSPENDED, ok=1),
    lambda: Peers(procs=[ProcInfo(pid=1)]),  # a tuple, not a list
    lambda: Peers(procs=((1, "a"),)),
    lambda: Matched(generation=1, peers={"e": {"conn": "a|b", "side": "a"}}),
    lambda: ConnMatch(conn="a|b", side="c"),
    lambda: Command(cmd=Cmd.INTERVAL, seconds=-1.0),
    lambda: Progress(generation=1, written=-1, expected=0),
])
def test_building_checks_the_fields(build):
    with pytest.raises(MessageError):
        build()


def test_messages_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Kill().x = 1  # type: ignore[attr-defined]
    with pytest.raises(dataclasses.FrozenInstanceError):
        Refused(error="no").error = "yes"  # type: ignore[misc]


def test_message_error_is_a_value_error():
    assert issubclass(MessageError, ValueError)


# ---- the reader ----------------------------------------------------------------------

def test_reader_takes_bytes_in_any_pieces():
    stream = b"".join(messages.encode(m) for m in EXAMPLES)
    reader = messages.Reader()
    out = []
    for i in range(0, len(stream), 7):
        out += reader.feed(stream[i:i + 7])
    assert out == EXAMPLES


def test_reader_refuses_bad_frames_and_bad_messages():
    with pytest.raises(codec.FrameError):
        messages.Reader().feed(b"\x00\x00\x00\x02[]")
    with pytest.raises(MessageError):
        messages.Reader().feed(codec.encode({"v": 1, "type": "hello", "role": "x", "token": "t"}))


def test_field_types_are_looked_up_before_a_fork_for_every_kind():
    """look_up_field_types (before a many-tree restart forks its agents)
    leaves no kind, nor a record inside one, for a child to look up again."""
    code = ("from dmtcp_py.protocol import messages as m\n"
            "m.look_up_field_types()\n"
            "kinds = {*m._KINDS.values(), m.ProcInfo, m.Endpoint, m.ConnMatch}\n"
            "print(len(kinds - set(m._HINTS)), len(m._HINTS))")
    missing, looked_up = subprocess.run([sys.executable, "-c", code], capture_output=True,
                                        text=True, check=True).stdout.split()
    assert missing == "0" and int(looked_up) > 30
