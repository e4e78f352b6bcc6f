"""How a tree comes to be under its agent: a program launched with the
shim, or a checkpoint image restored by CRIU (DESIGN.md 2 and 4)."""
from __future__ import annotations

import asyncio
import logging
import os
import sys

from dmtcp_py import fault_injection
from dmtcp_py.agent import criu_driver, stdio
from dmtcp_py.agent.config import AgentConfig
from dmtcp_py.agent.network import Network
from dmtcp_py.agent.tree import Tree
from dmtcp_py.errors import ImageError, UserError
from dmtcp_py.images import (compress, integrity, shared_files, temp_files,
                             written_files)
from dmtcp_py.paths import run_dir, shim_library, tool, tree_init
from dmtcp_py.protocol.states import State

log = logging.getLogger("agent")


class CannotExecute(UserError):
    exit_code = 126  # as a shell says it


def launch(cfg: AgentConfig, tree: Tree, agent_address: str) -> None:
    """Start the program under the tree's init, with the shim preloaded."""
    env = dict(os.environ)
    lib = str(shim_library())
    env["LD_PRELOAD"] = lib + (":" + env["LD_PRELOAD"] if env.get("LD_PRELOAD") else "")
    env["DMTCP_AGENT_SOCK"] = agent_address
    env["DMTCP_COORD_HOST"] = cfg.coord_host
    env["DMTCP_COORD_PORT"] = str(cfg.coord_port)
    env["DMTCP_CHECKPOINT_DIR"] = str(cfg.ckptdir)
    # `ssh HOST CMD` from the tree: the shim runs this instead (dmtcp_py.ssh),
    # which starts CMD on HOST under this computation with the token
    env["DMTCP_SSH_WRAPPER"] = tool("dmtcp-ssh")
    # and `srun ... CMD` runs as dmtcp-srun (dmtcp_py.slurm), likewise
    env["DMTCP_SRUN_WRAPPER"] = tool("dmtcp-srun")
    # `import dmtcp` for Python programs (hijack/python/dmtcp.py), after theirs
    api_dir = str(shim_library().parent.parent / "python")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), api_dir) if p)
    env["DMTCP_COORD_TOKEN"] = cfg.token
    init = str(tree_init())
    try:
        pid = tree.spawn(init, [init, cfg.path, *cfg.argv], env)
    except OSError as exc:
        raise CannotExecute(f"cannot run {init}: {exc.strerror or exc} "
                            "(run `make setup`)") from None
    log.info("started %s as pid %d", cfg.argv, pid)


_background: set[asyncio.Task] = set()  # kept from the garbage collector


def _beside(coro) -> None:
    task = asyncio.get_running_loop().create_task(coro)
    _background.add(task)
    task.add_done_callback(_background.discard)


async def _lazy_tree(pages_checked: asyncio.Future, pager: criu_driver.LazyPages,
                     tree: Tree) -> None:
    """A lazily restored tree runs while its pages are checked: a damaged
    one kills it, saying which file.  The lazy-pages daemon ends by itself
    once every page is in; at the latest it goes with the tree."""
    try:
        await pages_checked
    except ImageError as exc:
        log.error("%s", exc)
        print(f"dmtcp-restart: error: {exc}", file=sys.stderr, flush=True)
        tree.kill()
    await tree.exited.wait()
    await asyncio.get_running_loop().run_in_executor(None, pager.stop)


async def restore(cfg: AgentConfig, tree: Tree, net: Network, reach_ip: str) -> list:
    """Files, sockets, then CRIU: the image's tree runs again (stopped in
    its shims until the round releases it).  Returns the relays of its
    stdio, to stop when the agent ends.  UserError says what failed."""
    m, image = cfg.manifest, cfg.image
    assert m is not None and image is not None
    temp_files.restore(m.temp_files, image)
    shared_files.restore(m.shared_files, image)
    shared_files.relink(m.link_remaps)
    written_files.rollback(m.written_files)
    if m.sockets:
        try:
            await net.recreate(m.sockets, image, reach_ip)
        except Exception as exc:
            raise UserError(f"cannot make the network connections again: {exc}") from None
    handover = stdio.prepare(m.stdio, run_dir())
    lazy = cfg.lazy and not compress.is_packed(image)
    if cfg.lazy and not lazy:
        print(f"dmtcp-restart: warning: the memory pages of {image} are compressed: "
              "restored whole, not lazily", file=sys.stderr, flush=True)
    work = run_dir()
    if lazy:  # the lazy-pages daemon's socket has a fixed name: a directory each
        work = work / f"lazy-{m.tree_id}-{os.getpid()}"
        work.mkdir(mode=0o700, exist_ok=True)
    log_path = work / f"criu-restore-{m.tree_id}-{os.getpid()}.log"
    loop = asyncio.get_running_loop()
    for relay in handover.relays:
        relay.start(loop)
    # the memory pages are checked while CRIU restores them (the rest was,
    # before the restart began): the restored processes stay stopped in
    # their shims until the round releases them, which waits for this;
    # a lazy restart lets the program run on while they are checked
    algorithm, digests = integrity.expected(m)
    pages_checked = loop.run_in_executor(
        None, integrity.verify, image, integrity.split(digests)[1], algorithm,
        "the program was killed (it ran since its lazy restart)" if lazy
        else "the restored processes were killed before they ran")
    tree.hold_reaping = True
    pager = None
    try:
        with compress.readable(image) as images:
            if lazy:
                pager = await loop.run_in_executor(None, criu_driver.LazyPages, images, work)
            pid = await loop.run_in_executor(
                None, lambda: criu_driver.restore(images, log_path, inherit=handover.pairs,
                                                  terminal=handover.terminal, lazy=lazy))
        # watched before reaping resumes: a root that already ended (a
        # restart round aborted at once) is collected with its status
        tree.adopt(pid)
    except (criu_driver.CriuError, ImageError) as exc:
        if pager is not None:
            await loop.run_in_executor(None, pager.stop)
        # damaged pages explain a failure of CRIU's or of the decompression
        try:
            await pages_checked
        except ImageError as damaged:
            raise UserError(str(damaged)) from None
        raise UserError(str(exc)) from None
    finally:
        tree.hold_reaping = False
        handover.close_after_restore()
    if pager is not None:
        _beside(_lazy_tree(pages_checked, pager, tree))
    else:
        try:
            await pages_checked
        except ImageError:
            tree.kill()
            raise
    log.info("restored %s (generation %d) as pid %d", image, m.generation, pid)
    await fault_injection.hold(State.RESTARTING)  # restored, not yet reported
    return handover.relays
