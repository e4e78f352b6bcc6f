"""What dmtcp-restart does, however its command line was read.

Restarting one tree, or several whose agents share this process
(agent/together.py), under a coordinator it starts itself or under one
that runs already and took each tree's claim (coordinator/claims.py),
CRIU restores while the agents' modules load (agent/restoring.py): they
are imported only once it runs.  A tree's sockets are made again by its
agent once it joined, while CRIU restores (agent/start.py): the restored
processes wait in their shims for them.  Until CRIU
runs, this module and what it calls load only what the checks and the
restore need: no asyncio, logging (deferred_log), dataclasses (records
are made without it: frozen.py), typing, concurrent.futures or shutil,
which took ~30 ms here before CRIU could start (tests: unit
test_light_imports, e2e test_restart_start).
"""
from __future__ import annotations

import gc
import importlib
import os
import pwd
from _collections_abc import Callable  # (typing costs ms; this one is loaded already)
from pathlib import Path

from dmtcp_py import deferred_log
from dmtcp_py.agent import stdio
from dmtcp_py.agent.config import AgentConfig, agents_can_share
from dmtcp_py.agent.restoring import Restore
from dmtcp_py.cli import fastargs
from dmtcp_py.cli.coordinators import Starting, exit_code
from dmtcp_py.errors import UserError, say
from dmtcp_py.images import integrity, manifest, shared_files
from dmtcp_py.protocol.handshake import Coordinator
from dmtcp_py.tokens import resolve_token


# What the agent and the coordinator both load (~25 ms here, most of it
# asyncio): a coordinator started here is forked once these are in, after
# CRIU began (and before the check of the pages, a thread), and loads only
# its own modules (~20 ms) while the agent loads the rest of its own
# (~40 ms).  Forked first, it loaded all of this again beside the agent,
# and the two took ~75 ms more CPU from CRIU and from each other.
SHARED_WITH_COORDINATOR = ("asyncio", "dmtcp_py.logs", "dmtcp_py.protocol.messages",
                           "dmtcp_py.images.socket_table")
AGENT = ("dmtcp_py.agent.runner",)


def tree_options(a: fastargs.RestartArgs, m: manifest.Manifest) -> dict[str, bool]:
    """AgentConfig's compress, incremental and precopy: as the restart says
    them, else as the image's tree had them (its manifest), else off; a
    restart from the restart script, or by --auto-restart or a migration,
    goes on as the tree was launched.  --precopy implies --incremental."""
    def chosen(said: bool | None, name: str) -> bool:
        return said if said is not None else bool(m.option(name))

    precopy = chosen(a.precopy, "precopy")
    return {"compress": chosen(a.gzip, "compress"),
            "incremental": chosen(a.incremental, "incremental") or precopy,
            "precopy": precopy}


def restart(a: fastargs.RestartArgs, starting: Starting | None) -> int:
    """Restart the trees in a.images, of one computation, under the
    coordinator that answers on a's port or under starting, which this
    begins (restart_flow.coordinator_for); the exit code."""
    coord_host, coord_port = a.host, a.port
    ckptdir, keep, lazy = a.ckptdir, a.keep, a.lazy
    images, generation = a.images, a.generation
    claimed: list[Coordinator] = []  # the connections that hold the claims
    claims: dict[str, int] = {}      # tree id -> its claim
    begun: list[Restore] = []
    try:
        loaded = _checked_images(a, images, generation)
        port = coord_port
        # CRIU restores while the agents load where this process becomes
        # their parent: one tree's, or several sharing it (together.py)
        early = len(loaded) == 1 or agents_can_share([m for _, m in loaded])
        if starting is None and early:
            # the coordinator says first that it takes each tree's restart
            # (claims.py).  (Connections of their own: the one that found
            # the coordinator may have been closed meanwhile, for a hello
            # that did not come within 10 s of checks.)
            for _, m in loaded:
                claimed.append(Coordinator(coord_host, coord_port))
                claims[m.tree_id] = claimed[-1].claim_restart(
                    resolve_token(port), tree_id=m.tree_id, comp_id=m.comp_id,
                    generation=m.generation, num_trees=m.num_trees)
            deferred_log.hold()  # (what the restore says waits for the agent's log)
            begun = _begin(loaded, lazy)
            _import(SHARED_WITH_COORDINATOR + AGENT)  # while CRIU restores
        if starting is not None:
            starting.bind()  # (a port it cannot have fails the restart before CRIU runs)
            if early:
                # a fresh coordinator refuses no tree: nothing is put back
                # for a restart it then turns down
                deferred_log.hold()  # (what the restore says waits for the agent's log)
                begun = _begin(loaded, lazy, check=False)
            _import(SHARED_WITH_COORDINATOR)
            starting.begin()
            for restore in begun:
                if not restore.lazy:
                    restore.check_pages()
            if begun:
                _import(AGENT)  # while CRIU restores
            try:
                port = starting.wait()
            except UserError:
                for restore in begun:
                    restore.abandon()
                raise
    except BaseException:
        if starting is not None:
            starting.stop()  # no agent joined it: it would wait for one for ever
        for connection in claimed:
            connection.close()  # (the claim ends with it)
        deferred_log.release()  # (no log file: its warnings on stderr)
        raise
    token = resolve_token(port)
    gc.freeze()  # (loaded with the collector off: restart.main)
    gc.enable()

    def config(image: Path, m: manifest.Manifest) -> AgentConfig:
        from dmtcp_py.agent.tree_work import home_dir
        return AgentConfig(coord_host=coord_host, coord_port=port, token=token,
                           ckptdir=Path(ckptdir).resolve() if ckptdir else home_dir(image),
                           tree_id=m.tree_id, program=m.program, argv=m.argv,
                           image=image, manifest=m, lazy=lazy, keep=keep,
                           claim=claims.get(m.tree_id, 0), **tree_options(a, m))

    ends = [connection.close for connection in claimed]
    if len(loaded) == 1:
        return _agent(config(*loaded[0]), begun[0] if begun else None,
                      ends[0] if ends else None)
    if early:
        from dmtcp_py.agent import together
        codes = together.run([config(image, m) for image, m in loaded], begun, ends)
        return next((exit_code(code) for code in codes if code), 0)
    from dmtcp_py.agent.runner import import_checkpoint_modules
    from dmtcp_py.protocol.messages import look_up_field_types
    # one agent process per tree (trees without PID namespaces of their
    # own: together.py), each the parent of its own restored tree.
    # What every agent needs is imported once, here, before they fork: each
    # importing CRIU's bindings (and then pyroute2) by itself cost ~100 ms of
    # CPU per tree, most of a many-tree restart on a small host.  The same
    # for the field types its messages are checked against (~1.5 ms a tree).
    import_checkpoint_modules()
    look_up_field_types()
    gc.freeze()
    children = []
    for image, m in loaded:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _agent(config(image, m))
            except UserError as exc:
                say(f"dmtcp-restart: error: {exc}")
            finally:
                os._exit(code)
        children.append(pid)
    worst = 0
    for pid in children:
        _, status = os.waitpid(pid, 0)
        code = exit_code(os.waitstatus_to_exitcode(status))
        worst = worst or code
    return worst


def _begin(loaded: list[tuple[Path, manifest.Manifest]], lazy: bool,
           check: bool = True) -> list[Restore]:
    """Every tree's files put back, then CRIU begun for each, then (check)
    the check of each one's pages (restoring.Restore): none is begun if
    one cannot be put back, and no CRIU waits for a check's start."""
    restores = [Restore(image, m, lazy=lazy) for image, m in loaded]
    for restore in restores:
        restore.prepare()
    for restore in restores:
        restore.begin(check=False)
    for restore in restores:
        if check and not restore.lazy:
            restore.check_pages()
    return restores


def _checked_images(a: fastargs.RestartArgs, images: list[str],
                    generation: int | None) -> list[tuple[Path, manifest.Manifest]]:
    """(image, manifest) of each image, once everything but the memory
    pages is checked: one computation, one generation, each tree once,
    restartable standard streams, our own images, every small file's
    digest, and the read-only files the program maps unchanged."""
    if generation is not None:
        from dmtcp_py.images import store  # (only for --generation)
        found = [store.load_generation(Path(i), generation) for i in images]
        loaded = [(path.resolve(), m) for path, m in found]
    else:
        loaded = [(Path(i).resolve(), manifest.load(Path(i))) for i in images]
    comps = {m.comp_id for _, m in loaded}
    if len(comps) > 1:
        raise UserError("the images belong to different computations: " + ", ".join(sorted(comps)))
    gens = {m.generation for _, m in loaded}
    if len(gens) > 1:
        raise UserError(f"the images are of different generations ({sorted(gens)}); "
                        "restart one generation")
    for _, m in loaded:
        stdio.check_restartable(m.stdio)
    trees = {m.tree_id for _, m in loaded}
    if len(trees) < len(loaded):
        raise UserError("the same tree is given twice")
    if not a.any_owner:
        for image, _ in loaded:
            _check_owner(image)
    # every byte as published before anything is written or started; the
    # memory pages are checked by each agent while CRIU restores them
    checks = [(image, *integrity.expected(m)) for image, m in loaded]
    integrity.verify_all([(image, algorithm, integrity.split(digests)[0])
                          for image, algorithm, digests in checks])
    if not a.allow_changed_files:
        _check_read_only_files([e for _, m in loaded for e in m.shared_files])
    return loaded


def _check_owner(image: Path) -> None:
    """An image is code and data we will run: another user's is refused."""
    me = os.geteuid()
    for path in (image, *image.iterdir()):
        owner = path.lstat().st_uid
        if owner != me:
            try:
                name = pwd.getpwuid(owner).pw_name
            except KeyError:
                name = f"uid {owner}"
            raise UserError(f"{path} belongs to {name}, not to us: not restarting it "
                            "(--any-owner to restart it anyway)")


def _check_read_only_files(entries: list[dict]) -> None:
    """Files the program maps but only reads are not in the image: a changed
    one would show the restored program other bytes than it had (or make
    CRIU fail on its size), so it is refused, naming the file."""
    try:
        problems = shared_files.changed_files(entries)
    except (KeyError, TypeError, AttributeError):
        raise UserError("an image's manifest is corrupt: bad shared_files entry") from None
    if problems:
        shown = "; ".join(problems[:3])
        more = f"; and {len(problems) - 3} more" if len(problems) > 3 else ""
        raise UserError(f"{shown}{more}: the restored program maps it and would "
                        "see other bytes; --allow-changed-files to restart anyway")


def _import(modules: tuple[str, ...]) -> None:
    for name in modules:
        importlib.import_module(name)


def _agent(cfg: AgentConfig, begun: Restore | None = None,
           claim_ends: Callable[[], None] | None = None) -> int:
    import asyncio

    from dmtcp_py import logs
    from dmtcp_py.agent.runner import Agent, restart_log_name
    logs.setup(restart_log_name(cfg))
    return exit_code(asyncio.run(Agent(cfg, begun=begun, claim_ends=claim_ends).run()))
