"""How a restored tree comes to be under its agent: a checkpoint image
restored by CRIU (DESIGN.md 4).  (A launched program is started before its
agent loads: early.py.)"""
from __future__ import annotations

import asyncio
import logging

from dmtcp_py import fault_injection, procfs
from dmtcp_py.agent import criu_driver
from dmtcp_py.agent.config import AgentConfig
from dmtcp_py.agent.network import Network
from dmtcp_py.agent.restoring import Restore
from dmtcp_py.agent.tree import Tree
from dmtcp_py.errors import ImageError, UserError, say
from dmtcp_py.images.manifest import Manifest
from dmtcp_py.protocol.states import State

log = logging.getLogger("agent")
def restored_pids(m: Manifest, tree: Tree) -> dict[int, int]:
    """Each pid of the image (ours at the checkpoint) -> the restored
    process's pid (ours now): the same without a PID namespace of the
    tree's own; with one, CRIU gave the old ids in there only, and each
    process is found by its id in the namespace."""
    if not m.pid_namespace:
        return {pid: pid for pid in m.pids}
    ours = {procfs.ns_pid(pid): pid for pid in tree.pids()}
    found = {pid: ours.get(m.ns_pids.get(str(pid), -1)) for pid in m.pids}
    return {old: new for old, new in found.items() if new is not None}


END_TIMEOUT = 5.0  # seconds a killed tree that never ran may take to end


async def end_unran(tree: Tree, begun: Restore | None = None) -> None:
    """The tree ends before it ever ran: begun's once CRIU is done with it
    (killed under a restore, its processes would stay zombies CRIU waits
    on), else the one the agent watches already."""
    if begun is not None:
        try:
            tree.adopt(await asyncio.get_running_loop().run_in_executor(None, begun.wait))
        except UserError:
            pass  # nothing restored: nothing to end
        finally:
            tree.hold_reaping = False
    if tree.root_pid is not None:
        tree.kill()
        try:
            await asyncio.wait_for(tree.exited.wait(), END_TIMEOUT)
        except asyncio.TimeoutError:
            pass
        tree.reap_all(timeout=1.0)


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
        say(f"dmtcp-restart: error: {exc}")
        tree.kill()
    await tree.exited.wait()
    await asyncio.get_running_loop().run_in_executor(None, pager.stop)


async def restore(cfg: AgentConfig, tree: Tree, net: Network, reach_ip: str,
                  begun: Restore | None = None) -> list:
    """Files, then CRIU, and the sockets while CRIU restores: the image's
    tree runs again (stopped in its shims until the round releases it), or
    begun's, which dmtcp-restart began before this agent loaded (the
    tree's reaping is held since).  Returns the relays of its stdio, to
    stop when the agent ends.  UserError says what failed."""
    m, image = cfg.manifest, cfg.image
    assert m is not None and image is not None
    loop = asyncio.get_running_loop()
    if begun is None:
        begun = Restore(image, m, lazy=cfg.lazy)
        try:
            begun.prepare()
        finally:
            tree.init_dir = begun.init_dir  # (released by the agent, also on failure)
        tree.hold_reaping = True  # CRIU's processes are not the tree's to reap
        await loop.run_in_executor(None, begun.begin)
    if m.sockets:
        # CRIU needs none of them: the restored processes hold placeholders
        # and wait in their shims for the sockets, which are handed over
        # once the agent listens.  Made while CRIU restores, a connection's
        # wait for its peer's agent no longer comes before the restore.
        try:
            await net.recreate(m.sockets, image, reach_ip)
        except Exception as exc:
            await end_unran(tree, begun)
            raise UserError(f"cannot make the network connections again: {exc}") from None
    assert begun.handover is not None
    for relay in begun.handover.relays:
        relay.start(loop)
    try:
        # watched before reaping resumes: a root that already ended (a
        # restart round aborted at once) is collected with its status
        pid = await loop.run_in_executor(None, begun.wait)
        tree.adopt(pid)
    finally:
        tree.hold_reaping = False
    if begun.pages is None:  # a lazy restore's: from now on
        begun.check_pages()
    pages_checked = asyncio.wrap_future(begun.pages)
    if begun.pager is not None:
        _beside(_lazy_tree(pages_checked, begun.pager, tree))
    else:
        try:
            await pages_checked
        except ImageError:
            tree.kill()
            raise
    log.info("restored %s (generation %d) as pid %d", image, m.generation, pid)
    await fault_injection.hold(State.RESTARTING)  # restored, not yet reported
    return begun.handover.relays
