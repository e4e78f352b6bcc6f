"""Message types between coordinator, agents and command clients.

Every message is a JSON object with "v" (protocol version) and "type".  The
first message of every connection is a hello carrying the computation token.
Validation happens here, once, so the machines only see well-formed input.
"""
from __future__ import annotations

PROTOCOL_VERSION = 1

# type -> {field: python type}; fields listed are required
_SCHEMA: dict[str, dict[str, type | tuple[type, ...]]] = {
    # any peer -> coordinator, first message
    "hello": {"role": str, "token": str},
    # coordinator -> peer, answer to hello
    "welcome": {"comp_id": str, "agent_id": int},
    "refused": {"error": str},
    # agent -> coordinator
    "peers": {"count": int, "procs": list},
    "reached": {"state": str, "ok": bool},
    "published": {"generation": int, "ok": bool},
    "sockets": {"generation": int, "endpoints": list},
    "publish": {"key": str, "value": str},
    "lookup": {"key": str},
    # a program under control asked for a checkpoint (dmtcp_checkpoint())
    "ckpt_request": {},
    # agent -> coordinator -> waiting clients that asked for it: image bytes
    # written so far, of about this many (the tree's resident memory)
    "progress": {"generation": int, "written": int, "expected": int},
    # agent <-> agent, through the coordinator
    "relay": {"conn": str, "data": str},
    # coordinator -> agent
    "barrier": {"state": str},
    "kill": {},
    "matched": {"generation": int, "peers": dict},
    "commit": {"generation": int, "ok": bool},
    # a checkpoint round ended: every image published (ok), or it failed
    "generation_done": {"generation": int, "ok": bool},
    "found": {"key": str, "value": str},
    # client -> coordinator
    "command": {"cmd": str},
    # coordinator -> client
    "reply": {"ok": bool},
}

ROLES = ("agent", "client")
COMMANDS = ("status", "list", "checkpoint", "kill", "quit", "interval")


class MessageError(ValueError):
    """A well-framed message that is not one of ours."""


def make(type_: str, **fields) -> dict:
    message = {"v": PROTOCOL_VERSION, "type": type_, **fields}
    validate(message)
    return message


def validate(message: dict) -> dict:
    # exactly the int: JSON true and 1.0 compare equal to 1 in Python
    if type(message.get("v")) is not int or message["v"] != PROTOCOL_VERSION:
        raise MessageError(f"protocol version {message.get('v')!r}, expected {PROTOCOL_VERSION}")
    type_ = message.get("type")
    schema = _SCHEMA.get(type_) if isinstance(type_, str) else None
    if schema is None:
        raise MessageError(f"unknown message type {type_!r}")
    for field, kind in schema.items():
        value = message.get(field)
        # bool is an int in Python; keep the two apart
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise MessageError(f"{type_}: field {field!r} missing or not {getattr(kind, '__name__', kind)}")
    if type_ == "hello" and message["role"] not in ROLES:
        raise MessageError(f"hello: unknown role {message['role']!r}")
    if type_ == "command" and message["cmd"] not in COMMANDS:
        raise MessageError(f"command: unknown command {message['cmd']!r}")
    return message
