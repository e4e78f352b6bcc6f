"""The first steps of a restart, before its own modules load
(restarting.py): CRIU must work here, and a coordinator must answer or
be started (restarting.py forks it once CRIU began)."""
from __future__ import annotations

from dmtcp_py import criu_access
from dmtcp_py.cli import fastargs
from dmtcp_py.cli.coordinators import Starting, find_or_start
from dmtcp_py.errors import UserError
from dmtcp_py.protocol.handshake import Coordinator


def coordinator_for(a: fastargs.RestartArgs) -> Coordinator | Starting:
    """The coordinator of the restart: a connection to the one that answers
    on a's port (when a allows joining it), else one to start here."""
    if (why := criu_access.problem()) is not None:
        raise UserError(f"cannot restore: {why}")
    return find_or_start(a.host, a.port, join=a.join, new=a.new_coordinator, keep=a.keep)


def run_restart(a: fastargs.RestartArgs) -> int:
    found = coordinator_for(a)
    try:
        from dmtcp_py.cli.restarting import restart
    except BaseException:
        if isinstance(found, Starting):
            found.stop()
        else:
            found.close()
        raise
    return restart(a, found)
