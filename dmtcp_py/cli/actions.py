"""`dmtcp-command -c`, `-bc`, `-kc`, `-k` and `-q`, sent and answered
without click or the protocol's messages (protocol/handshake.py).

Why: loading click and messages.py costs about 50 ms, which a blocking
checkpoint waited for before it even asked (issue 17: `-bc` until durable
is meant to cost little more than CRIU's dump and the fsync).  The line
printed for an answer is summary()'s on both paths; a blocking checkpoint
asked on a terminal goes to command_click.py, for its progress line.
"""
from __future__ import annotations

from dmtcp_py.cli import fastargs
from dmtcp_py.errors import CoordinatorUnreachable, UserError
from dmtcp_py.protocol.handshake import Coordinator
from dmtcp_py.tokens import resolve_token

COMMAND_TIMEOUT = 30.0  # seconds a command that does not block may take (as click's path)


def summary(action: str, body: dict) -> str | None:
    """The line printed for a successful reply's body to a checkpoint,
    kill or quit (here and by command_click.py), or None for none (quit).  KeyError, TypeError or ValueError: a body no
    coordinator of ours sends."""
    if action in ("bcheckpoint", "kcheckpoint"):
        return (f"checkpoint {body['generation']} done: {body['trees']} trees, "
                f"{body.get('processes', 0)} processes, "
                f"{body['bytes']} bytes, {body['duration']:.3f} s"
                + (", computation stopped" if action == "kcheckpoint" else ""))
    if action == "checkpoint":
        return body.get("note") or f"checkpoint {body.get('generation')} requested"
    if action == "kill":
        return f"killed {body.get('killed', 0)} trees"
    return None


def run(a: fastargs.ActionArgs) -> int:
    flags = {}
    if a.action in ("checkpoint", "bcheckpoint", "kcheckpoint"):
        cmd = "checkpoint"
        flags = {"blocking": a.blocking, "stop": a.action == "kcheckpoint"}
    else:
        cmd = a.action
    with Coordinator(a.host, a.port) as coordinator:
        coordinator.hello(resolve_token(a.port))
        ok, error, body = coordinator.command(cmd, None if a.blocking else COMMAND_TIMEOUT,
                                              **flags)
    if not ok:
        raise UserError(error or f"{a.action} failed")
    try:
        line = summary(a.action, body)
    except (KeyError, TypeError, ValueError) as exc:
        raise CoordinatorUnreachable(f"{a.host}:{a.port} answered {a.action} with an "
                                     f"unexpected reply ({exc!r})") from None
    if line is not None:
        print(line, flush=True)
    return 0
