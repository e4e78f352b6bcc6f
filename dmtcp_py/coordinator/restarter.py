"""Recovery's hands: run the restart of a generation the way a user's
restart script does (the same script, rendered in memory: local trees
with dmtcp_restart, other hosts' over ssh, --map for moved hosts).

Thin: the machine chose the generation and the hosts; this runs the
command and reports when it ended.  The restarted programs write to
<run dir>/recovery-<port>.out (a daemon has no terminal; a console
coordinator prints the file's name), as do the restart's own messages.
"""
from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from pathlib import Path

from dmtcp_py.coordinator import restart_script
from dmtcp_py.coordinator.machine import MoveTrees, RestartGeneration
from dmtcp_py.paths import hostname, run_dir

log = logging.getLogger("coordinator")

ERROR_PREFIX = "error: "


def output_path(port: int, purpose: str = "recovery") -> Path:
    """Where the restarted programs write: recovery-PORT.out, or for the
    trees a migration moved, migration-PORT.out."""
    return run_dir() / f"{purpose}-{port}.out"


def reachable(listen_host: str) -> str:
    """The coordinator's address as a restarted agent dials it."""
    return hostname() if listen_host in ("", "0.0.0.0", "::") else listen_host


async def run(action: RestartGeneration | MoveTrees, *, comp_id: str, listen_host: str,
              port: int, token: str, ended: Callable[[int, str | None], None]) -> None:
    """Start the restart; call ended(serial, error or None) when it exits."""
    host = reachable(listen_host)
    purpose = "migration" if isinstance(action, MoveTrees) else "recovery"
    script = restart_script.render(action.images, comp_id=comp_id,
                                   generation=action.generation, coord_host=host,
                                   coord_port=port, name=purpose)
    args = ["--coord-host", host, "--coord-port", str(port), "--join"]
    for old, new in action.placement:
        if old != new:
            args += ["--map", f"{old}={new}"]
    for lost in action.lost_hosts:
        args += ["--lost", lost]
    out = output_path(port, purpose)
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    try:
        title = (f"migration {action.serial}" if isinstance(action, MoveTrees)
                 else f"recovery attempt {action.attempt}")
        os.write(fd, f"--- {title}: generation {action.generation} ---\n".encode())
        proc = await asyncio.create_subprocess_exec(
            "bash", "-c", script, "recovery", *args,
            stdin=asyncio.subprocess.DEVNULL, stdout=fd, stderr=fd,
            env={**os.environ, "DMTCP_COORD_TOKEN": token}, start_new_session=True)
    except OSError as exc:
        ended(action.serial, f"cannot run the restart: {exc.strerror or exc}")
        return
    finally:
        os.close(fd)
    log.info("%s: restart running as pid %d, output in %s", title, proc.pid, out)
    code = await proc.wait()
    ended(action.serial, None if code == 0 else _last_error(out, code))


def _last_error(out: Path, code: int) -> str:
    """The restart's own one-line error, if it printed one, from its output."""
    try:
        lines = out.read_text(errors="replace").splitlines()[-50:]
    except OSError:
        lines = []
    for line in reversed(lines):
        if ERROR_PREFIX in line:
            return line.split(ERROR_PREFIX, 1)[1].strip()
    return f"the restart exited with status {code} (output in {out})"
