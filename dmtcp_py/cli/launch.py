"""dmtcp-launch: run a program under checkpoint control."""
from __future__ import annotations

import asyncio
import gc
import os
import shutil
import sys
from pathlib import Path

import click

from dmtcp_py import __version__, criu_access, logs
from dmtcp_py.agent.config import AgentConfig
from dmtcp_py.agent.runner import Agent
from dmtcp_py.cli.base import (CONTEXT, INTERVAL, coord_host_option, coord_port_option,
                               keep_option, run)
from dmtcp_py.cli.common import (coordinator_choice_options, ensure_coordinator, exit_code,
                                 gzip_option, incremental_option)
from dmtcp_py.client import resolve_token
from dmtcp_py.errors import UserError
from dmtcp_py.paths import shim_library, tool, tree_init


class ProgramNotFound(UserError):
    exit_code = 127


def resolve_program(prog: str) -> str:
    if "/" in prog:
        if not os.path.exists(prog):
            raise ProgramNotFound(f"program '{prog}' does not exist")
        if os.path.isdir(prog) or not os.access(prog, os.X_OK):
            raise ProgramNotFound(f"program '{prog}' is not executable")
        return os.path.abspath(prog)
    found = shutil.which(prog)
    if not found:
        raise ProgramNotFound(f"program '{prog}' not found in PATH")
    return found


@click.command(context_settings={**CONTEXT, "allow_interspersed_args": False})
@coord_host_option
@coord_port_option
@coordinator_choice_options
@click.option("--ckptdir", metavar="DIR",
              help="Where this tree's images go [env DMTCP_CHECKPOINT_DIR; default: cwd].")
@click.option("-i", "--interval", type=INTERVAL, default=None,
              envvar="DMTCP_CHECKPOINT_INTERVAL", metavar="SECONDS|auto",
              help="Checkpoint interval of a coordinator started here (auto: it chooses).")
@gzip_option
@incremental_option
@keep_option
@click.version_option(__version__, "--version")
@click.argument("program")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def cli(coord_host, coord_port, join, new_coordinator, ckptdir, interval, gzip, incremental, keep,
        program,
        args):
    """Run PROGRAM with ARGS under checkpoint control.

    Starts a coordinator on this host when none answers (unless --join).
    Exits with PROGRAM's exit status.
    """
    path = resolve_program(program)
    argv = [program, *args]
    if os.path.basename(path) == "srun" and not os.environ.get("DMTCP_SRUN_DIRECT"):
        # the tree's init execs without the shim: take srun over here
        argv, path = ["dmtcp-srun", path, *args], tool("dmtcp-srun")
    for part in (shim_library(), tree_init()):
        if not part.exists():
            raise UserError(f"{part} is not built (run `make setup`)")
    if (why := criu_access.problem()) is not None:
        raise UserError(f"cannot checkpoint: {why}")
    # None: the coordinator's directory if it has one, else the cwd
    chosen = ckptdir or os.environ.get("DMTCP_CHECKPOINT_DIR")
    port = ensure_coordinator(coord_host, coord_port, join=join, new=new_coordinator,
                              interval=interval, keep=keep)
    tree_id = os.urandom(6).hex()
    logs.setup(f"agent-{tree_id}")
    cfg = AgentConfig(coord_host=coord_host, coord_port=port, token=resolve_token(port),
                      ckptdir=Path(chosen).resolve() if chosen else None, tree_id=tree_id, program=os.path.basename(program),
                      argv=argv, path=path, compress=gzip, keep=keep,
                      incremental=incremental)
    return exit_code(asyncio.run(Agent(cfg).run()))


def main() -> None:
    # What the imports made lives as long as the process: out of the cyclic
    # collector's sight, it is not walked again at every full collection nor
    # at the interpreter's exit (~20 ms of every launch here).
    gc.freeze()
    sys.exit(run("dmtcp-launch", cli))


if __name__ == "__main__":
    main()
