"""The first steps of a restart, before its own modules load
(restarting.py): CRIU must work here, and a coordinator must answer or
be started (restarting.py forks it once CRIU began)."""
from __future__ import annotations

from dmtcp_py import criu_access
from dmtcp_py.cli import fastargs
from dmtcp_py.cli.coordinators import Starting, find_or_start
from dmtcp_py.errors import UserError


def coordinator_for(a: fastargs.RestartArgs) -> Starting | None:
    """The coordinator of the restart: None when one answers on a's port
    (and a allows joining it), else one to start here."""
    if (why := criu_access.problem()) is not None:
        raise UserError(f"cannot restore: {why}")
    found = find_or_start(a.host, a.port, join=a.join, new=a.new_coordinator, keep=a.keep)
    if isinstance(found, Starting):
        return found
    found.close()  # (it answers: that was the question)
    return None


def run_restart(a: fastargs.RestartArgs) -> int:
    starting = coordinator_for(a)
    try:
        from dmtcp_py.cli.restarting import restart
    except BaseException:
        if starting is not None:
            starting.stop()
        raise
    return restart(a, starting)
