"""Message schema: make() and validate()."""
from __future__ import annotations

import pytest

from dmtcp_py.protocol import messages
from dmtcp_py.protocol.messages import PROTOCOL_VERSION, MessageError, make, validate

# one valid instance of every message type
VALID = {
    "hello": {"role": "agent", "token": "t"},
    "welcome": {"comp_id": "c", "agent_id": 3},
    "refused": {"error": "no"},
    "peers": {"count": 2, "procs": [[1, "a"], [2, "b"]]},
    "reached": {"state": "SUSPENDED", "ok": True},
    "published": {"generation": 1, "ok": True},
    "progress": {"generation": 1, "written": 10, "expected": 100},
    "ckpt_request": {},
    "generation_done": {"generation": 2, "ok": True},
    "sockets": {"generation": 1, "endpoints": [{"local": "tcp:a", "peer": "tcp:b"}]},
    "publish": {"key": "k", "value": "198.18.0.1:5"},
    "lookup": {"key": "k"},
    "relay": {"conn": "a|b", "data": "AAAA"},
    "matched": {"generation": 1, "peers": {"tcp:a": {"conn": "a|b", "side": "a"}}},
    "found": {"key": "k", "value": "198.18.0.1:5"},
    "commit": {"generation": 1, "ok": True},
    "barrier": {"state": "DRAINED"},
    "kill": {},
    "command": {"cmd": "status"},
    "reply": {"ok": False},
}

# field -> a value of the wrong type for it
WRONG = {str: 1, int: "1", bool: 1, list: {"a": 1}, dict: [1]}


def raw(type_: str, **fields) -> dict:
    return {"v": PROTOCOL_VERSION, "type": type_, **VALID[type_], **fields}


def test_every_schema_type_has_a_valid_example():
    assert set(VALID) == set(messages._SCHEMA)


@pytest.mark.parametrize("type_", sorted(VALID))
def test_make_valid(type_):
    message = make(type_, **VALID[type_])
    assert message == {"v": PROTOCOL_VERSION, "type": type_, **VALID[type_]}
    assert validate(message) is message


def test_make_keeps_extra_fields():
    message = make("reached", state="CHECKPOINTED", ok=True, image={"path": "/x"})
    assert message["image"] == {"path": "/x"}


def test_make_refuses_invalid():
    with pytest.raises(MessageError):
        make("welcome", comp_id="c")


@pytest.mark.parametrize("version", [None, 0, 2, "1", True, 1.0, [1]])
def test_wrong_version(version):
    message = raw("kill", v=version)
    with pytest.raises(MessageError, match="protocol version"):
        validate(message)


def test_missing_version():
    message = raw("kill")
    del message["v"]
    with pytest.raises(MessageError, match="protocol version None"):
        validate(message)


@pytest.mark.parametrize("type_", ["nope", "", "HELLO", None, 5, ["hello"], {"a": 1}])
def test_unknown_type(type_):
    with pytest.raises(MessageError, match="unknown message type"):
        validate({"v": PROTOCOL_VERSION, "type": type_})


def _required_fields():
    for type_, schema in messages._SCHEMA.items():
        for field, kind in schema.items():
            yield type_, field, kind


@pytest.mark.parametrize("type_,field,kind", list(_required_fields()))
def test_missing_field(type_, field, kind):
    message = raw(type_)
    del message[field]
    with pytest.raises(MessageError, match=f"{type_}: field '{field}' missing or not"):
        validate(message)


@pytest.mark.parametrize("type_,field,kind", list(_required_fields()))
def test_mistyped_field(type_, field, kind):
    with pytest.raises(MessageError, match=f"field '{field}'"):
        validate(raw(type_, **{field: WRONG[kind]}))


@pytest.mark.parametrize("type_,field", [("welcome", "agent_id"), ("peers", "count")])
@pytest.mark.parametrize("value", [True, False])
def test_bool_is_not_an_int(type_, field, value):
    with pytest.raises(MessageError, match="not int"):
        validate(raw(type_, **{field: value}))


@pytest.mark.parametrize("type_,field", [("reached", "ok"), ("reply", "ok")])
@pytest.mark.parametrize("value", [0, 1, "true", None])
def test_int_is_not_a_bool(type_, field, value):
    with pytest.raises(MessageError, match="not bool"):
        validate(raw(type_, **{field: value}))


def test_float_is_not_an_int():
    with pytest.raises(MessageError, match="not int"):
        validate(raw("welcome", agent_id=3.0))


@pytest.mark.parametrize("role", messages.ROLES)
def test_known_roles(role):
    assert validate(raw("hello", role=role))["role"] == role


@pytest.mark.parametrize("role", ["admin", "", "Agent"])
def test_unknown_role(role):
    with pytest.raises(MessageError, match=f"unknown role {role!r}"):
        validate(raw("hello", role=role))


@pytest.mark.parametrize("cmd", messages.COMMANDS)
def test_known_commands(cmd):
    assert validate(raw("command", cmd=cmd))["cmd"] == cmd


@pytest.mark.parametrize("cmd", ["restart", "", "STATUS"])
def test_unknown_command(cmd):
    with pytest.raises(MessageError, match=f"unknown command {cmd!r}"):
        validate(raw("command", cmd=cmd))


def test_message_error_is_a_value_error():
    assert issubclass(MessageError, ValueError)
