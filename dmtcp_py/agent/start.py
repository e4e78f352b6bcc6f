"""How a restored tree comes to be under its agent: a checkpoint image
restored by CRIU (DESIGN.md 4).  (A launched program is started before its
agent loads: early.py.)"""
from __future__ import annotations

import asyncio
import logging
import os
import re
import sys
from pathlib import Path

from dmtcp_py import fault_injection, procfs
from dmtcp_py.agent import criu_driver, init_dir, stdio
from dmtcp_py.agent.config import AgentConfig
from dmtcp_py.agent.network import Network
from dmtcp_py.agent.tree import Tree
from dmtcp_py.errors import ImageError, UserError
from dmtcp_py.images import (chunks, compress, integrity, shared_files, temp_files,
                             written_files)
from dmtcp_py.images.manifest import Manifest
from dmtcp_py.paths import run_dir, unprivileged
from dmtcp_py.protocol.states import State

log = logging.getLogger("agent")
# CRIU's words when a pid it must give is in use
_CRIU_PID_TAKEN = re.compile(r"Can't fork for (\d+): File exists")


def _pid_taken(pid: int, image: Path) -> str:
    """One line: which pid, held by what, why it matters, what to do."""
    name = (procfs.read(f"/proc/{pid}/comm") or "?").strip()
    return (f"cannot restart {image}: pid {pid}, which the image needs, is in use by {name}; "
            "the tree was checkpointed without a PID namespace of its own (launched on a "
            "terminal, not as root, or with DMTCP_PID_NAMESPACE=0), so it restarts only on "
            "its own pids: end that process, or restart on another host")


def _check_pids(m: Manifest, image: Path) -> None:
    """Before anything is touched: can CRIU give the tree its pids?  A tree
    with a namespace of its own gets a new one; one without needs its old
    pids free on this host."""
    if m.pid_namespace:
        if unprivileged():
            raise UserError(f"cannot restart {image}: its tree ran in a PID namespace of its "
                            "own, and only root (CAP_SYS_ADMIN) can make one")
        return
    for pid in sorted(m.pids):
        if os.path.exists(f"/proc/{pid}"):
            raise UserError(_pid_taken(pid, image))


def _criu_failure(m: Manifest, image: Path, message: str) -> str:
    """CRIU's failure, or, for a pid taken meanwhile (say a thread's, which
    the manifest does not list), which one."""
    taken = _CRIU_PID_TAKEN.search(message)
    if taken and not m.pid_namespace:
        return _pid_taken(int(taken.group(1)), image)
    return message


def restored_pids(m: Manifest, tree: Tree) -> dict[int, int]:
    """Each pid of the image (ours at the checkpoint) -> the restored
    process's pid (ours now): the same without a PID namespace of the
    tree's own; with one, CRIU gave the old ids in there only, and each
    process is found by its id in the namespace."""
    if not m.pid_namespace:
        return {pid: pid for pid in m.pids}
    ours = {procfs.ns_pid(p.pid): p.pid for p in tree.processes()}
    found = {pid: ours.get(m.ns_pids.get(str(pid), -1)) for pid in m.pids}
    return {old: new for old, new in found.items() if new is not None}


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
    _check_pids(m, image)
    if m.pid_namespace and m.init_dir:
        tree.init_dir = init_dir.make(Path(m.init_dir))  # (its init's working directory)
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
        with chunks.readable(image, m) as images:
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
        if isinstance(exc, criu_driver.CriuError):
            raise UserError(_criu_failure(m, image, str(exc))) from None
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
