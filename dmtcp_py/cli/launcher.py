"""What dmtcp-launch does, however its command line was read.

The program starts at once (agent/early.py): before it, only what can
refuse it (the program, the shim, CRIU, the coordinator's hello) and
modules that cost almost nothing.  The agent loads beside the running
program, then joins the coordinator.
"""
from __future__ import annotations

import os

from dmtcp_py import criu_access
from dmtcp_py.agent import early
from dmtcp_py.cli import fastargs
from dmtcp_py.cli.coordinators import Starting, exit_code, find_or_start
from dmtcp_py.errors import UserError, say
from dmtcp_py.paths import shim_library, tool, tree_init
from dmtcp_py.tokens import resolve_token

# what loads beside the program
AGENT_MODULE = "dmtcp_py.agent.runner"


class ProgramNotFound(UserError):
    exit_code = 127


class CannotExecute(UserError):
    exit_code = 126  # as a shell says it


def resolve_program(prog: str) -> str:
    if "/" in prog:
        if not os.path.exists(prog):
            raise ProgramNotFound(f"program '{prog}' does not exist")
        if os.path.isdir(prog) or not os.access(prog, os.X_OK):
            raise ProgramNotFound(f"program '{prog}' is not executable")
        return os.path.abspath(prog)
    found = _which(prog)
    if not found:
        raise ProgramNotFound(f"program '{prog}' not found in PATH")
    return found


def _which(prog: str) -> str | None:
    """shutil.which(prog) for a name without '/' (shutil costs 6 ms of import)."""
    for folder in (os.environ.get("PATH") or os.defpath).split(os.pathsep):
        candidate = os.path.join(folder or ".", prog)
        if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
            return candidate
    return None


def _waiting() -> None:
    say("dmtcp-launch: the coordinator is busy with a checkpoint, restart or migration; "
        "the program starts once it is over")


def launch(a: fastargs.LaunchArgs) -> int:
    """Run a.program with a.args under checkpoint control; its exit code."""
    path = resolve_program(a.program)
    argv = [a.program, *a.args]
    if os.path.basename(path) == "srun" and not os.environ.get("DMTCP_SRUN_DIRECT"):
        # the tree's init execs without the shim: take srun over here
        argv, path = ["dmtcp-srun", path, *a.args], tool("dmtcp-srun")
    for part in (shim_library(), tree_init()):
        if not os.path.exists(part):
            raise UserError(f"{part} is not built (run `make setup`)")
    if (why := criu_access.problem()) is not None:
        raise UserError(f"cannot checkpoint: {why}")
    # a coordinator started here gets the token the program is told
    token = resolve_token(a.port) or os.urandom(16).hex()
    tree_id = os.urandom(6).hex()
    found = find_or_start(a.host, a.port, join=a.join, new=a.new_coordinator,
                          interval=a.interval, token=token, keep=a.keep, launching=tree_id)
    offered, starting = None, None
    if isinstance(found, Starting):
        # its port listens before the program starts; it is started beside
        # the program and the agent's load (below)
        port, starting = found.bind(), found
    else:  # a client's hello: is it one, does it take our token?
        # It also announces the tree: until its agent has joined, a
        # checkpoint waits for it (coordinator/launching.py); the connection
        # stays open until then, and its end (this process's) ends that.
        port = a.port
        try:
            offered = found.hello(token, launching=tree_id, waiting=_waiting).get("ckptdir")
        except BaseException:
            found.close()
            raise
    # the images go where asked, else where the coordinator keeps its own,
    # else here; the program's environment says where
    chosen = a.ckptdir or os.environ.get("DMTCP_CHECKPOINT_DIR") or offered or os.getcwd()
    plan = early.Plan(coord_host=a.host, coord_port=port, token=token,
                      ckptdir=os.path.realpath(chosen), tree_id=tree_id,
                      program=a.program, argv=argv, path=path, compress=a.gzip,
                      own_coordinator=isinstance(found, Starting), keep=a.keep,
                      incremental=a.incremental, precopy=a.precopy)
    try:
        started = early.start(plan)
    except BaseException as exc:
        if starting is not None:
            starting.release()
        if isinstance(exc, early.CannotListen):
            raise UserError(exc.strerror) from None
        if isinstance(exc, OSError):
            raise CannotExecute(f"cannot run {tree_init()}: {exc.strerror or exc} "
                                "(run `make setup`)") from None
        raise
    if not isinstance(found, Starting):
        started.announcement = found.sock  # closed once the agent joined (or as we exit)
    if starting is not None:
        # Forked now, before the agent's loading thread exists: it imports
        # its modules on the other core while the agent loads its own, rather
        # than after them (~50 ms of every launch that starts its coordinator)
        starting.begin(sigmask=started.sigmask)
    # a coordinator started here waits for its first tree to exit with its last
    code = early.load_beside(started, AGENT_MODULE, may_leave=not plan.own_coordinator)
    if code is not None:
        return code
    if starting is not None:
        try:
            starting.wait()
        except UserError:
            early.abandon(started)
            raise
    return _run_agent(plan, started)


def _run_agent(plan: early.Plan, started: early.Started) -> int:
    """The agent, loaded by now, joins the coordinator and takes the tree over."""
    import asyncio
    import gc
    from pathlib import Path

    from dmtcp_py import logs
    from dmtcp_py.agent.config import AgentConfig
    from dmtcp_py.agent.runner import Agent

    # What the imports made lives as long as the process: out of the cyclic
    # collector's sight, it is not walked again at every full collection nor
    # at the interpreter's exit (~20 ms of every launch here).  The collector
    # was off while they ran (early.load_beside).
    gc.freeze()
    gc.enable()
    logs.setup(f"agent-{plan.tree_id}")
    cfg = AgentConfig(coord_host=plan.coord_host, coord_port=plan.coord_port, token=plan.token,
                      ckptdir=Path(plan.ckptdir), tree_id=plan.tree_id,
                      program=os.path.basename(plan.program), argv=plan.argv, path=plan.path,
                      compress=plan.compress, keep=plan.keep, incremental=plan.incremental,
                      precopy=plan.precopy)
    return exit_code(asyncio.run(Agent(cfg, started).run()))
