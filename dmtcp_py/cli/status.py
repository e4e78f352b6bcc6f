"""`dmtcp-command -s` and `-l` (with --json or without), answered without
click or the protocol's messages (protocol/handshake.py): a status asked
in a loop by scripts and schedulers takes a few tens of milliseconds."""
from __future__ import annotations

from dmtcp_py.cli import fastargs
from dmtcp_py.errors import UserError
from dmtcp_py.listing import status_report
from dmtcp_py.protocol.handshake import Coordinator
from dmtcp_py.tokens import resolve_token

COMMAND_TIMEOUT = 30.0  # seconds a status or list may take (as the click path waits)


def _print_status(reply: dict, host: str, port: int, as_json: bool, listing: bool) -> int:
    """reply: the body of a status or list reply (machine.status(), and the trees)."""
    if as_json:
        import json
        print(json.dumps({"host": host, "port": port, **reply}, indent=1, sort_keys=True),
              flush=True)
        return 0
    print("\n".join(status_report(reply, host, port, listing=listing)), flush=True)
    return 0


def status(a: fastargs.StatusArgs) -> int:
    action = "list" if a.listing else "status"
    with Coordinator(a.host, a.port) as coordinator:
        coordinator.hello(resolve_token(a.port))
        ok, error, body = coordinator.command(action, COMMAND_TIMEOUT)
    if not ok:
        raise UserError(error or f"{action} failed")
    return _print_status(body, a.host, a.port, a.as_json, listing=a.listing)
