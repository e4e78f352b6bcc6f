"""What each barrier's step does to one tree, carried out (DESIGN.md 3).

The machine names a Step; this module does it, through the shims (records
on their Unix sockets), the network sockets (network.py) and CRIU (through
images.checkpoint), and reports a WorkResult.  It reads top to bottom as
the phases of a round.  It decides nothing about the protocol: which step
comes, and what a failure means, is the machine's.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, NamedTuple

from dmtcp_py import fault_injection, logs, procfs
from dmtcp_py.agent import criu_driver, fdtable, init_dir, records, stdio, sysv, tracking, wake
from dmtcp_py.agent import tree as tree_mod
from dmtcp_py.agent.config import AgentConfig
from dmtcp_py.agent.machine import Step, Work, WorkResult
from dmtcp_py.agent.network import Network
from dmtcp_py.agent.shimlink import ShimLink
from dmtcp_py.agent.tree import Tree
from dmtcp_py.errors import ImageError, say
from dmtcp_py.listing import signal_name
from dmtcp_py.paths import hostname, run_dir, unprivileged
from dmtcp_py.protocol import messages
from dmtcp_py.protocol.states import State

if TYPE_CHECKING:
    from dmtcp_py.images import checkpoint
    from dmtcp_py.images.manifest import Manifest
    from dmtcp_py.images.previous import Previous

log = logging.getLogger("agent")

SHIM_TIMEOUT = 10.0    # a process that does not answer its agent in this time is stuck
WAKE_AGAIN = 0.05      # seconds between wake-ups of a process that has not connected
# after this long unconnected, a process is also woken as a whole (kill()):
# a shim built before the wake-up went to the main thread (restored from an
# older image, or forked from such a process) answers only that (wake.py)
WAKE_PROCESS_AFTER = 1.0
# how long a round waits for a process in its exec (the new program's shim
# handles the signal soon) before it takes it for a program without the shim
EXEC_GRACE = 0.5
# rounds of wake-up and suspension: a process forked as the tree stopped
# is woken by the next (its parent is stopped by then)
SUSPEND_PASSES = 5
PROGRESS_EVERY = 0.25  # seconds between progress reports while CRIU writes
# how long a process may take to hand over its tracker (an older shim that
# does not know TRACK never answers: its pages are all dumped)
TRACK_TIMEOUT = 1.0
# --precopy: a round pre-copies only if at least this much of the tracked
# memory was written since the last dump protected it.  Below, the dump
# alone is short (~0.5 ms per MiB here), shorter than the pre-dump's own
# freeze, which reads the page tables of all the memory (~20-30 ms per
# GiB), and its pass, which the checkpoint would wait for.
PRECOPY_FROM = 64 << 20


def _checkpoint():
    """images.checkpoint, loaded at the first dump or the agent's warm-up
    (runner.CHECKPOINT_MODULES): with what it loads (~4 ms) it stood
    between a restart's CRIU and the release of the restored tree."""
    from dmtcp_py.images import checkpoint
    return checkpoint


def _warm_previous(image: Path) -> Previous | None:
    """The generation published as image, read whole for the next dump."""
    previous = _checkpoint().read_previous(image)
    if previous is None:
        return None
    log.debug("generation %d read for the next dump", previous.manifest.generation)
    return previous.warm()


class _Stopped(NamedTuple):
    """The tree as its suspend found it, for the dump to take instead of
    reading /proc again while the program waits."""
    pids: list[int]                                     # Tree.pids
    links: dict[int, list[tuple[int, str]]] | None      # fdtable.HandOver's, if unchanged


class TreeWork:
    def __init__(self, cfg: AgentConfig, *, shims: ShimLink, net: Network, tree: Tree,
                 send: Callable[[messages.Message], None],
                 reach_ip: Callable[[], str] = lambda: "127.0.0.1") -> None:
        self.cfg = cfg
        self.shims, self.net, self.tree = shims, net, tree
        self.relays: list[stdio.FileRelay] = []  # a restored tree's stdio (start.restore)
        self._send = send
        self._reach_ip = reach_ip  # the address the coordinator knows this host by
        self._sysv_told = False
        self._moved: checkpoint.Checkpoint | None = None  # the image a migration moves
        # CRIU started as the round began, for its dump (criu_driver.begin_dump)
        self._criu: asyncio.Future | None = None
        # the sockets to park (fdtable.to_park), found once the tree stopped
        self._to_park: dict[int, list[int]] | None = None
        # the tree as the suspend left it, if it cannot change before the dump
        self._stopped: _Stopped | None = None
        # generation -> the previous generations its publication moved
        # aside, until its round is over (settle_expired)
        self._expired: dict[int, list[Path]] = {}
        # --incremental: the processes' userfaultfds (agent/tracking.py),
        # and the generation whose dump last protected their pages (None:
        # none did, or its images are not the published ones: the next
        # dump has no parent)
        self._trackers = tracking.Trackers()
        self._tracked_since: int | None = None
        # the generation _tracked_since names, read for the next dump once
        # its round was over (images.previous), while the program runs
        self._previous: asyncio.Future | None = None
        # --precopy: this round's pre-copy (images.precopy.Layer), until a
        # dump takes it as its parent (or drops it)
        self._layer = None
        self._told_no_precopy = False  # (the log says once why there is none)
        self._tracking_refused = False  # CRIU could not track: dumps are whole again
        # the next publication may share chunks with the published generation
        # (not after one found that generation damaged)
        self._share = True

    def _tracks(self) -> bool:
        """Dumps with write tracking: incremental generations of chunks,
        by root (CRIU's --unprivileged is not tried with it), on a kernel
        that has it."""
        return (self.cfg.incremental and not self.cfg.compress and not unprivileged()
                and not self._tracking_refused and tracking.available())

    async def _precopy(self, step: Step) -> WorkResult:
        """The running tree's memory pre-dumped into a layer (images.precopy)
        that the round's dump then takes as its parent.  Never fails the
        round: without a layer the dump writes every page it would have."""
        if self.cfg.precopy and self._tracks() and self.tree.root_pid is not None:
            loop = asyncio.get_running_loop()
            image = self._image()
            assert image is not None, "the coordinator's welcome sets the directory"
            published = await loop.run_in_executor(None, _checkpoint().shareable_previous,
                                                   image)
            written = await loop.run_in_executor(None, self._written_since_protected,
                                                 published)
            if written is not None and written < PRECOPY_FROM:
                log.info("generation %d: not pre-copied: %d bytes written since generation "
                         "%d", step.generation, written, self._tracked_since)
            else:
                await self._take_layer(step, image, published if self._share else None)
        elif self.cfg.precopy and not self._told_no_precopy:
            self._told_no_precopy = True
            log.warning("--precopy needs write tracking (root, no --gzip, Linux 6.7 or "
                        "later, CRIU able to track): this tree's checkpoints are not "
                        "pre-copied")
        await fault_injection.hold(State.PRECOPIED)
        return WorkResult()

    def _written_since_protected(self, published: Manifest | None) -> int | None:
        """The bytes of the tree's tracked memory written since the dump of
        the published generation (its manifest: published) protected it
        (counted up to PRECOPY_FROM; a process it did not protect counts
        whole); None if no dump did."""
        since = self._tracked_since
        if since is None or published is None or published.generation != since:
            return None  # (its dump would be whole)
        total = 0
        for pid in self.tree.pids():
            try:
                total += tracking.written_bytes(pid, PRECOPY_FROM - total)
            except (tracking.TrackerGone, OSError):
                continue  # (gone: nothing to dump; unreadable: the dump will say)
            if total >= PRECOPY_FROM:
                break
        return total

    async def _take_layer(self, step: Step, image: Path, previous: Manifest | None) -> None:
        """Trackers for every process (asked of running shims), then CRIU's
        pre-dump stored as self._layer beside image (sharing the chunks of
        previous, the published generation's manifest, if not None); a
        failure is logged and leaves none."""
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        await loop.run_in_executor(None, self.drop_layer)  # (a round given up before its dump)
        try:
            await self.bring_in()  # (the trackers are asked of connected shims)
            await self._track()
        except Exception as exc:  # (an asyncio error of a shim that went away)
            log.warning("pre-copy skipped: the processes could not be tracked: %r", exc)
            return
        # from here on the pages the published generation left protected
        # are protected again by the pre-dump: only its layer holds them
        since, self._tracked_since = self._tracked_since, None
        from dmtcp_py.images import precopy  # (checkpoints with --precopy only)
        root, store = self.tree.root_pid, _checkpoint().store
        ticker = None
        try:
            directory = await loop.run_in_executor(None, precopy.directory_for, image.parent,
                                                   image.name, step.generation)
            ticker = asyncio.create_task(self._report_progress(
                step.generation, lambda: store.directory_bytes(directory), self.tree.pids()))
            self._layer = await loop.run_in_executor(None, lambda: precopy.take(
                directory, image, step.generation, root,
                run_dir() / f"criu-predump-{self.cfg.tree_id}.log", since, self._parent_view(),
                previous))
        except (criu_driver.CriuError, OSError, ImageError) as exc:
            log.warning("pre-copy failed (the dump writes every page): %s", exc)
            if any(words in str(exc) for words in tracking.CRIU_REFUSALS):
                log.warning("write tracking turned off for this tree: %s", exc)
                self._tracking_refused = True
            return
        finally:
            if ticker is not None:
                ticker.cancel()
        stored = self._layer.stored
        log.info("generation %d: pre-copied %d bytes (%d shared) in %.3f s", step.generation,
                 stored.written, stored.shared, time.monotonic() - started)

    def drop_layer(self) -> None:
        """The pre-copy no dump took (its round was given up, or the tree ended)."""
        layer, self._layer = self._layer, None
        if layer is not None:
            _checkpoint().delete([layer.directory])

    async def carry_out(self, step: Step) -> WorkResult:
        """One barrier's work; a bug of ours never leaves the tree stopped."""
        try:
            return await _STEPS[step.work](self, step)
        except Exception as exc:
            log.exception("%s failed", step.work.value)
            return WorkResult(error=f"internal error: {exc!r} (see {logs.current()})")

    # ---- the phases of a round ----------------------------------------------------

    # the shim's reserved signal, the agent's wake-up (wake.py)
    _signum = wake.reserved_signal()

    def unconnected(self, pids: list[int] | None = None) -> list[int]:
        """The tree's processes whose shim has not connected (yet); pids:
        the tree's, if walked just now."""
        connected = set(self.shims.pids())
        return [pid for pid in (self.tree.pids() if pids is None else pids)
                if pid not in connected]

    def members(self) -> list[int]:
        """The tree's processes that run the shim, connected or not."""
        connected = set(self.shims.pids())
        return sorted(connected | {p for p in self.unconnected()
                                   if wake.handles(p, self._signum)})

    def _left_out(self, exec_deadline: float,
                  pids: list[int] | None = None) -> tuple[list[int], list[int]]:
        """The unconnected processes that run the shim, and (until
        exec_deadline) those in their exec; pids: the tree's, if walked
        just now."""
        unconnected = self.unconnected(pids)
        running = [p for p in unconnected if wake.handles(p, self._signum)]
        execing = ([p for p in unconnected if wake.in_exec(p, self._signum)]
                   if asyncio.get_running_loop().time() < exec_deadline else [])
        return running, execing

    async def bring_in(self, timeout: float = SHIM_TIMEOUT,
                       exec_deadline: float | None = None) -> None:
        """Every process of the tree that runs the shim connects: woken,
        and woken again until it does (one may be in a fork that holds it
        off), or until it ends; one in its exec is waited for until
        exec_deadline (default: EXEC_GRACE from now)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        whole = loop.time() + WAKE_PROCESS_AFTER
        if exec_deadline is None:
            exec_deadline = loop.time() + EXEC_GRACE
        while True:
            running, execing = self._left_out(exec_deadline)
            sent = wake.wake(running, self._signum, whole_process=loop.time() >= whole)
            if not sent and not execing:
                return
            if loop.time() >= deadline:
                log.warning("processes %s did not connect when woken", sorted(sent + execing))
                return
            await self.shims.wait_for(set(sent + execing), WAKE_AGAIN)

    async def _suspend(self, step: Step) -> WorkResult:
        """Every process connected, then stopped; those forked or exec'd
        meanwhile are woken by the next pass (their parents are stopped
        by then, so the passes end)."""
        loop = asyncio.get_running_loop()
        exec_deadline = loop.time() + EXEC_GRACE
        self._to_park = self._stopped = None
        if self._criu is None:  # while the tree stops (a staying tree's goes unused)
            self._criu = loop.run_in_executor(None, criu_driver.begin_dump, self._dump_log(),
                                              self._tracks())
        walked: list[int] = []
        for _ in range(SUSPEND_PASSES):
            await self.bring_in(exec_deadline=exec_deadline)
            stuck = await self.shims.request_all(records.SUSPEND, records.SUSPENDED, SHIM_TIMEOUT)
            if stuck:
                break
            walked = self.tree.pids()
            if self._left_out(exec_deadline, walked) == ([], []):
                break
        elect = True
        if not stuck:  # (stopped: their fds stay as they are until the drain parks them)
            # without sockets to park or an inotify instance whose reader
            # is elected, the round may skip the election, the drain and
            # the refill
            shim_pids = self.shims.pids()
            scan = await loop.run_in_executor(None, fdtable.to_hand_over, shim_pids,
                                              self.shims.link_fds())
            self._to_park = scan.to_park
            # (a test that holds the agents in DRAINED needs the round to have one)
            elect = bool(scan.to_park) or scan.inotify or self.net.holds_sockets() \
                or fault_injection.hold_seconds(State.DRAINED) > 0
            # every process but the root (which forks once, the program)
            # stopped by its shim: none can fork, exec or end before the
            # dump but by a kill, so the dump takes this walk, and where
            # nothing is to be parked these fds, instead of reading /proc
            # again while the program waits
            if shim_pids and set(walked) - {self.tree.root_pid} <= set(shim_pids):
                self._stopped = _Stopped(walked, None if elect else scan.links)
            if self._tracks():
                await self._track()
        await fault_injection.hold(State.SUSPENDED)
        if stuck:
            return WorkResult(error=f"processes {stuck} did not answer the suspend request")
        return WorkResult(sockets=elect)

    async def _track(self) -> None:
        """Every process's memory registered for write tracking (its
        tracker asked for first if we hold none), while it is stopped."""
        loop = asyncio.get_running_loop()
        pids = set(self.shims.pids())
        self._trackers.keep_only(pids)
        for _ in range(2):  # a stale tracker (the process exec'd) is asked for again
            wanted = self._trackers.wanted(pids)
            if wanted:
                got = await self.shims.trackers(wanted, TRACK_TIMEOUT)
                for pid, why in self._trackers.take(got).items():
                    log.info("process %d: its written pages cannot be tracked (%s): "
                             "all of them are dumped", pid, why)
            if not await loop.run_in_executor(None, self._trackers.register, pids):
                break

    async def _elect(self, step: Step) -> WorkResult:
        stuck = await self.shims.request_all(records.ELECT, records.ELECTED, SHIM_TIMEOUT)
        return WorkResult(error=f"processes {stuck} did not answer the election request"
                          if stuck else None)

    async def _drain(self, step: Step) -> WorkResult:
        error = None
        try:
            if step.swap:  # a held tree stopped again: only its held connections
                await self.net.swap_park(self.shims.pids(), step.generation, step.comp_id,
                                         SHIM_TIMEOUT)
            else:
                await self.net.park_and_drain(self.shims.pids(), step.comp_id, step.generation,
                                              SHIM_TIMEOUT, self._take_to_park())
            await fault_injection.hold(State.DRAINED)
        except Exception as exc:
            log.exception("drain failed")
            error = f"draining the network connections failed: {exc!r}"
        return WorkResult(error=error, external=tuple(self.net.external),
                          failed_conns=tuple(self.net.failed_conns))

    async def _dump(self, step: Step) -> WorkResult:
        """CRIU dumps the tree into a partial directory; the images wait
        there for the coordinator's commit.  In a migration, a staying tree
        is not dumped (_stay), and a moving one is dumped into a directory
        of its own, kept running (frozen), and its image published at once
        for its new copy to restore."""
        if step.move is messages.Move.STAY:
            return await self._stay(step)
        cfg = self.cfg
        assert cfg.ckptdir is not None, "the coordinator's welcome sets it"
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        moving = step.move is messages.Move.GO
        ckpt = _checkpoint().Checkpoint.begin(
            migration_dir(cfg.ckptdir, cfg.tree_id, step.generation) if moving else cfg.ckptdir,
            cfg.program, cfg.tree_id, step.generation)
        # a process must not reconnect mid-dump: CRIU would meet a socket
        # leading out of the tree
        self.shims.stop_listening()
        # but may as soon as CRIU wrote every image (its post-dump, the
        # tree still frozen): the processes are back as CRIU lets them
        # go, not a poll after the dump's end.  Where the round lets them
        # go then (step.let_go), at the round's release address too
        token = (int.from_bytes(os.urandom(4), "little") or 1) if step.let_go else 0
        early: list[socket.socket] = []
        released: list[socket.socket] = []

        queues: list[int] = []  # (their processes must all be back before any runs)

        def listen_early() -> None:
            try:
                early.append(self.shims.listener())
                if token and not queues:
                    released.append(self.shims.listener(token))
            except OSError as exc:
                log.debug("listening again at CRIU's post-dump failed: %s", exc)
        parked = frozenset(self.shims.pids())  # REFILLED waits for these, also on failure
        own = self.shims.own_pids()  # (before they detach)
        gone = False  # the tree ended with its dump (a stopping checkpoint)
        files: _Beside | None = None  # the read of the tree's files
        dumping: asyncio.Future | None = None  # CRIU's dump, on a worker thread

        async def settle() -> None:
            """Until nothing writes into the partial directory any more:
            it goes once the dump failed."""
            if dumping is not None:
                await asyncio.wait([dumping])
                if not dumping.cancelled():
                    dumping.exception()  # (said by the failure that brought us here)
            if files is not None:
                await files.settled()
        try:
            # Three things need the tree stopped, and the program waits for
            # all of them: the shims detach, the tree's files are read, CRIU
            # starts and seizes the tree.  CRIU is asked at once and waits
            # for the shims before it seizes anything (its pre-dump: a
            # seized shim cannot close its link); the files are read once
            # they detached, while CRIU seizes, and CRIU waits for them
            # before it looks into any process (on_seized).  The read and
            # the shims' answers take turns at the GIL, so side by side they
            # took as long as one after the other.
            parking = asyncio.ensure_future(self.shims.park_all(SHIM_TIMEOUT, token))
            detached = _Gate()
            stopped, self._stopped = self._stopped, None
            try:
                pids = stopped.pids if stopped is not None else self.tree.pids()
                facts = self._facts(step, pids, sorted(parked), own)
                refusal = sysv.shared_memory_refusal(self.tree.root_pid, set(facts.pids))
                if refusal:  # (CRIU's own words for it are cryptic)
                    raise criu_driver.CriuError(refusal)
                if self.tree.init_dir is not None:
                    init_dir.clear_stale(self.tree.init_dir)
                files = _Beside(_read_files, ckpt, facts, pids, token,
                                stopped.links if stopped is not None else None)
                session = await self._started_criu()
                track = self._tracks()
                since, self._tracked_since = self._tracked_since, None
                layer, self._layer = self._layer, None  # (any dump takes it: images.precopy)
                if layer is not None and not (track and not moving):  # (not its parent)
                    await loop.run_in_executor(None, _checkpoint().delete, [layer.directory])
                    layer = None
                parent = None
                if layer is not None:
                    ckpt.layer = layer  # (finish stores the pages with it as the previous)
                    parent = await loop.run_in_executor(None, _checkpoint().parent_view,
                                                        layer.directory, self._parent_view())
                elif track and not moving and since is not None:
                    prepared = await self._read_previous()
                    parent = await loop.run_in_executor(None, ckpt.tracking_parent, since,
                                                        self._parent_view(), prepared)
                # (with a pre-copy, what it wrote counts as written by this checkpoint)
                before = layer.stored.written if layer is not None else 0
                reading = files  # (the same, never None: for the closure below)

                def before_seizing() -> None:  # (CRIU's thread, at its pre-dump)
                    detached.wait()
                    reading.start()
                self.tree.hold_reaping = True
                ticker = asyncio.create_task(self._report_progress(
                    step.generation, lambda: before + ckpt.written(), pids))
                dumping = loop.run_in_executor(None, lambda: ckpt.dump(
                    self.tree.root_pid, self._dump_log(),
                    leave_running=moving or not step.stop, external=facts.external,
                    follow=self._early_writeback(step, moving), session=session,
                    track=track, parent=parent,
                    on_dumped=None if step.stop and not moving else listen_early,
                    before_seizing=before_seizing, on_seized=reading.done.result))
            finally:
                why: str | None = "the checkpoint was given up"
                try:
                    stuck, queues[:] = await parking
                    ckpt.steps["park"] = time.monotonic()
                    why = f"processes {stuck} did not detach from the agent" if stuck else None
                finally:
                    detached.open(why)  # (CRIU, if asked, gives up with that)
            try:
                await dumping
            finally:
                self.tree.hold_reaping = False
                ticker.cancel()
            await asyncio.wrap_future(files.done)  # (read by now: CRIU waited for it)
            if early:  # the processes come back while the socket table is taken
                await self.shims.listen(early.pop(), released.pop() if released else None)
            if track:  # (the pages it protected are those of this generation's images)
                self._tracked_since = step.generation
            if not step.stop and not token:  # (with --stop CRIU ends the tree itself)
                _no_failure_inside(pids)
            # (the manifest is made as the image is published, the program running)
            dumped = await loop.run_in_executor(None, ckpt.take_sockets, self.net.table)
            if moving:
                # (not durable: if this host fails meanwhile, its tree is gone anyway)
                await loop.run_in_executor(None, lambda: ckpt.finish(compressed=False,
                                                                     durable=False))
                self._moved = ckpt
                self.net.release_listeners()
            gone = step.stop and not moving
            self._tell_sysv_left_out(set(facts.pids))
        except (criu_driver.CriuError, OSError) as exc:
            log.error("checkpoint failed: %s", exc)
            if any(words in str(exc) for words in tracking.CRIU_REFUSALS):
                log.warning("write tracking turned off for this tree: %s", exc)
                self._tracking_refused = True
            await settle()
            await loop.run_in_executor(None, ckpt.discard)
            return WorkResult(error=str(exc), parked=parked)
        except BaseException:
            await settle()
            await loop.run_in_executor(None, ckpt.discard)
            raise
        finally:
            # a failed dump leaves the tree running, stopping or not: its
            # processes come back (also those already at the release address)
            if not gone and not self.shims.listening:
                await self.shims.listen(early.pop() if early else None,
                                        released.pop() if released else None)
            for sock in early + released:  # (a tree that ended with its dump)
                sock.close()
        duration = time.monotonic() - started
        log.info("generation %d: dumped %d bytes in %.3f s", step.generation,
                 dumped, duration)
        log.debug("dump steps (ms): %s", _checkpoint().step_times(started, ckpt.steps))
        self._send(messages.Progress(generation=step.generation, written=before + dumped,
                                     expected=before + dumped))
        image = messages.ImageInfo(path=str(ckpt.final), host=hostname(), tree_id=cfg.tree_id,
                                   program=cfg.program, bytes=dumped,
                                   duration=duration, processes=len(parked))
        await fault_injection.hold(State.CHECKPOINTED)
        return WorkResult(image=image, pending=None if moving else ckpt, parked=parked)

    async def _read_previous(self) -> Previous | None:
        """The published generation as read once the last round was over,
        if it was (the dump takes it if it is still the one published)."""
        reading, self._previous = self._previous, None
        if reading is None:
            log.debug("the published generation was not read ahead")
            return None
        try:
            return await reading
        except (OSError, ImageError) as exc:  # (the dump reads it again, and says)
            log.debug("the published generation was not read ahead: %s", exc)
            return None

    def _image(self) -> Path | None:
        """Where the tree's image is published (None before the
        coordinator's welcome names the directory)."""
        cfg = self.cfg
        if cfg.ckptdir is None:
            return None
        return cfg.ckptdir / _checkpoint().store.image_name(cfg.program, cfg.tree_id)

    def _dump_log(self) -> Path:
        return run_dir() / f"criu-dump-{self.cfg.tree_id}.log"

    def _parent_view(self) -> Path:
        """Where CRIU is shown the previous generation's pagemaps."""
        return run_dir() / f"criu-parent-{self.cfg.tree_id}"

    async def _started_criu(self) -> criu_driver.DumpSession | None:
        """The CRIU begun with the round, if it could start (else the dump
        starts its own, and says why it cannot)."""
        started, self._criu = self._criu, None
        if started is None:
            return None
        try:
            return await started
        except (criu_driver.CriuError, OSError) as exc:
            log.warning("CRIU could not start ahead of the dump: %s", exc)
            return None

    async def _unused_criu(self) -> None:
        """A round without a dump of ours ends: its CRIU goes."""
        session = await self._started_criu()
        if session is not None:
            await asyncio.get_running_loop().run_in_executor(None, session.close)

    def _early_writeback(self, step: Step, moving: bool) -> bool:
        """Hash and write back the page files while CRIU writes them
        (images.follow): the images are durable sooner after the dump, but
        the dump, and with it the program's stop, takes longer.  So only
        when the program's stop does not matter: it ends with its dump
        (-kc), or the user asked (DMTCP_EARLY_WRITEBACK=1).  Not for pages
        that change before the seal (--gzip, --incremental), nor for a
        migration's image, which is not made durable."""
        cfg = self.cfg
        if moving or cfg.compress or cfg.incremental:
            return False
        return step.stop or os.environ.get("DMTCP_EARLY_WRITEBACK") == "1"

    async def _stay(self, step: Step) -> WorkResult:
        """A staying tree in a migration: not dumped; each connection it
        shares with a moving tree is made again toward that tree's new
        copy (which waits for it before its restore).  Asked to hold, it
        runs on meanwhile if its connections can be held (holding.py), and
        is stopped again to swap them (step.swap)."""
        try:
            if step.swap:
                await self.net.swap_in(step.rollback)
                return WorkResult()
            if step.hold and self.net.hold(step.reconnect, self._reach_ip()):
                self.net.publish_datagram_sockets(self._reach_ip())
                return WorkResult(held=True)
            await self.net.remake(step.reconnect, self._reach_ip())
        except Exception as exc:
            log.error("migration: %s", exc)
            return WorkResult(error=str(exc))
        return WorkResult()

    def _tell_sysv_left_out(self, pids: set[int]) -> None:
        """Once per tree: SysV objects its images do not hold (sysv.py)."""
        if self._sysv_told or self.tree.root_pid is None:
            return
        warning = sysv.left_out(self.tree.root_pid, pids)
        if warning:
            self._sysv_told = True
            log.warning("%s", warning)
            say(f"dmtcp: warning: {warning}")

    def _facts(self, step: Step, pids: list[int], shim_pids: list[int],
               own: dict[int, int]) -> checkpoint.TreeFacts:
        cfg, m = self.cfg, self.cfg.manifest
        io = stdio.describe(self.relays)
        return _checkpoint().TreeFacts(
            comp_id=step.comp_id, tree_id=cfg.tree_id, program=cfg.program,
            argv=list(cfg.argv or (m.argv if m else [])), host=hostname(),
            agent_socket=self.shims.base, num_trees=step.num_trees, root_pid=self.tree.root_pid,
            pids=pids, shim_pids=shim_pids, stdio=io, external=stdio.external_ids(io),
            ns_pids=self._ns_pids(pids, own),
            init_dir=str(self.tree.init_dir) if self.tree.init_dir is not None else "",
            agent_socket_ns=m is None or m.agent_socket_ns,
            options={"compress": cfg.compress, "incremental": cfg.incremental,
                     "precopy": cfg.precopy})

    def _ns_pids(self, pids: list[int], said: dict[int, int]) -> dict[str, int]:
        """Each pid's id in the tree's own PID namespace (none: {}); said:
        those the processes' hellos told (no /proc read for them)."""
        if not self.tree.own_namespace:
            return {}
        own = {pid: said.get(pid) or procfs.ns_pid(pid) for pid in pids}
        return {str(pid): n for pid, n in own.items() if n is not None}

    async def _report_progress(self, generation: int, written: Callable[[], int],
                               pids: list[int]) -> None:
        """While CRIU writes: bytes written (in the partial directory, or
        the pre-copy's), of about the tree's resident memory, every quarter
        of a second.  Nothing before
        the first quarter: a /proc read per process as CRIU starts would
        take the GIL from the thread that asks it to (~0.1 ms a process),
        and a small dump is over by then."""
        import psutil
        await asyncio.sleep(PROGRESS_EVERY)
        expected = 0
        for pid in pids:
            try:
                expected += psutil.Process(pid).memory_info().rss
            except psutil.Error:
                pass
        while True:
            now = written()
            self._send(messages.Progress(generation=generation, written=now,
                                         expected=max(expected, now)))
            await asyncio.sleep(PROGRESS_EVERY)

    def _take_to_park(self) -> dict[int, list[int]] | None:
        """What the suspend found to park, once (None: look again)."""
        wanted, self._to_park = self._to_park, None
        return wanted

    async def _processes_back(self, step: Step) -> None:
        """The processes the dump detached have connected again."""
        missing = await self.shims.wait_for(self.tree.alive(set(step.expect_pids)), SHIM_TIMEOUT)
        if missing:
            log.warning("processes %s did not reconnect", sorted(missing))

    async def _refill(self, step: Step) -> WorkResult:
        if step.rollback:  # a failed migration: everything as it was
            self.net.roll_back()
            self.drop_moved()
        await self._processes_back(step)
        try:
            await self.net.refill_and_unpark(SHIM_TIMEOUT, step.failed_conns)
            await fault_injection.hold(State.REFILLED)
            return WorkResult()
        except Exception as exc:
            log.exception("refill failed")
            return WorkResult(error=f"refilling the network connections failed: {exc!r}")

    async def _resume(self, step: Step) -> WorkResult:
        if step.bring_back:  # (a socketless round: no REFILL, nothing parked)
            await self._processes_back(step)
            await fault_injection.hold(State.REFILLED)  # (where REFILL would end)
        await self.shims.request_all(records.RESUME, records.RESUMED, SHIM_TIMEOUT,
                                     arg=step.resume_arg)
        await self._unused_criu()
        return WorkResult()

    # ---- outside the barriers -----------------------------------------------------------

    async def give_back(self, expect_pids: frozenset[int], resume_arg: int) -> None:
        """A round without its coordinator: processes back, sockets back,
        threads released.  Never keeps the program stopped."""
        if not self.shims.listening:  # a dump that ended without reopening it
            await self.shims.listen()
        await self.shims.wait_for(self.tree.alive(set(expect_pids)), SHIM_TIMEOUT)
        try:
            await self.net.abandon(SHIM_TIMEOUT)
        except Exception:
            log.exception("giving the sockets back failed")
        await self.shims.request_all(records.RESUME, records.RESUMED, SHIM_TIMEOUT,
                                     arg=resume_arg)
        await self._unused_criu()

    def drop_moved(self) -> None:
        """The image a migration moved this tree with is not needed any
        more (the tree runs on elsewhere, or did not move)."""
        ckpt, self._moved = self._moved, None
        if ckpt is not None:
            _checkpoint().delete([ckpt.final.parent])

    @staticmethod
    def drop_image(image: Path) -> None:
        """A migration image restored here (its directory of its own)."""
        _checkpoint().delete([image.parent])

    async def publish(self, ckpt: checkpoint.Checkpoint) -> str | None:
        """Make the images durable and give them their name while the
        program runs again (the fsync is about a second per GiB here); old
        generations are deleted last.  The error, if it failed."""
        loop = asyncio.get_running_loop()
        share, self._share = self._share, True
        started = time.monotonic()
        try:
            expired = await loop.run_in_executor(None, lambda: ckpt.finish(
                compressed=self.cfg.compress, keep=self.cfg.keep,
                incremental=self.cfg.incremental, share=share))
        except Exception as exc:  # (ImageError: CRIU's pages do not fit the parent)
            # whatever went wrong, the round hears it (an exception that
            # ended this task would leave the coordinator waiting)
            from dmtcp_py.images.chunks import DamagedParent  # (loaded by the publication)
            if isinstance(exc, DamagedParent):
                # the next generation shares nothing with it (its dump is
                # whole: these pages were protected for this one)
                self._share = False
            if isinstance(exc, (OSError, ImageError)):
                log.error("generation %d not published: %s", ckpt.generation, exc)
            else:
                log.exception("generation %d not published", ckpt.generation)
            await loop.run_in_executor(None, ckpt.discard)
            return f"publishing {ckpt.final}: {exc}"
        log.info("generation %d published as %s", ckpt.generation, ckpt.final)
        log.debug("publish steps (ms): %s", _checkpoint().step_times(
            started, {k: v for k, v in ckpt.steps.items()
                      if k in ("manifest", "chunks", "seal", "publish")}))
        if ckpt.stored is not None:
            log.info("generation %d memory: %d bytes written, %d shared with the previous "
                     "generation", ckpt.generation, ckpt.stored.written, ckpt.stored.shared)
        if expired:
            self._expired[ckpt.generation] = expired
        return None

    async def settle_expired(self, generation: int, ok: bool) -> None:
        """The round of `generation` is over.  Every tree published it (ok):
        the generations our publication moved aside go, and those of older
        rounds whose end we never heard of.  Not deleted before: each
        deletion's disk work competed with the trees still writing their
        images.  A failed round: they take their names back, for the newest
        complete generation may be among them (`--keep 0`: the only copy of
        it)."""
        if ok:
            done = [g for g in self._expired if g <= generation]
            paths = [p for g in done for p in self._expired.pop(g)]
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, _checkpoint().delete, paths)
            image = self._image()
            if self._tracked_since == generation and image is not None:
                self._previous = loop.run_in_executor(None, _warm_previous, image)
        elif generation in self._expired:
            self.bring_back_expired([generation])

    def bring_back_expired(self, generations: list[int] | None = None) -> None:
        """Generations moved aside whose round's end we will not hear of
        (the agent ends), or that failed: back under their names (the next
        publication prunes them as it should)."""
        for g in list(self._expired) if generations is None else generations:
            _checkpoint().bring_back(self._expired.pop(g, []))

    async def discard(self, ckpt: checkpoint.Checkpoint) -> None:
        log.warning("generation %d failed or was abandoned; its images here are dropped",
                    ckpt.generation)
        await asyncio.get_running_loop().run_in_executor(None, ckpt.discard)


MIGRATION_DIR = ".dmtcp-migration"


def migration_dir(ckptdir: Path, tree_id: str, generation: int) -> Path:
    """Where a migration dumps a moving tree: apart from its generations,
    which a migration does not touch (0700, as every image directory)."""
    top = Path(ckptdir) / MIGRATION_DIR
    top.mkdir(mode=0o700, parents=True, exist_ok=True)  # (no checkpoint made it yet)
    where = top / f"{tree_id}-{generation}-{os.getpid()}"
    where.mkdir(mode=0o700, exist_ok=True)
    return where


def is_migration_image(image: Path) -> bool:
    return image.parent.parent.name == MIGRATION_DIR


def home_dir(image: Path) -> Path:
    """The checkpoint directory a restored tree goes on with: its image's,
    or, for a migration's image (dropped once restored), the directory that
    holds the migration's: the tree's later checkpoints and migrations go
    there, not into a directory that is gone."""
    return image.parent.parent.parent if is_migration_image(image) else image.parent


class _Gate:
    """Where a worker thread waits until the event loop lets it through,
    or says why not (CriuError)."""

    def __init__(self) -> None:
        self._opened = threading.Event()
        self._why: str | None = None

    def open(self, why: str | None = None) -> None:
        self._why = why
        self._opened.set()

    def wait(self) -> None:
        self._opened.wait()
        if self._why is not None:
            raise criu_driver.CriuError(self._why)


class _Beside:
    """work(*args) on a worker thread of the running loop, once start() is
    called (from any thread); done: its future, which any thread may wait
    for.  No thread waits for the start."""

    def __init__(self, work: Callable[..., None], *args) -> None:
        self.done: concurrent.futures.Future = concurrent.futures.Future()
        self._loop = asyncio.get_running_loop()
        self._work = lambda: work(*args)
        self._lock = threading.Lock()
        self._started = False

    def _claim(self) -> bool:
        with self._lock:
            first, self._started = not self._started, True
        return first

    def start(self) -> None:
        if self._claim():
            self._loop.call_soon_threadsafe(self._loop.run_in_executor, None, self._run)

    def _run(self) -> None:
        try:
            self.done.set_result(self._work())
        except BaseException as exc:
            self.done.set_exception(exc)

    async def settled(self) -> None:
        """Until it has ended, whatever its outcome; if it had not
        started, it never does."""
        if self._claim():
            self.done.set_result(None)
        ended = asyncio.wrap_future(self.done)
        await asyncio.wait([ended])
        if not ended.cancelled():
            ended.exception()  # (said by the failure that brought us here, if it failed)


def _read_files(ckpt: checkpoint.Checkpoint, facts: checkpoint.TreeFacts, pids: list[int],
                token: int, links: dict[int, list[tuple[int, str]]] | None) -> None:
    """What the dump reads of the stopped tree beside CRIU's seizing of it
    (TreeWork._dump): the files CRIU leaves out, and, for a tree let go
    at the dump's end, that none of its processes was killed by a failure."""
    if token:  # (let go at the dump's end, a process may fail after it)
        _no_failure_inside(pids)
    ckpt.save_files(facts, links)


def _no_failure_inside(pids: list[int]) -> None:
    """A process of the tree that a failure signal killed before or during
    the dump is in the image as a zombie: its parent would reap it after
    every restart, and a restart from this generation would fail the same
    way.  Such a generation is no checkpoint: CriuError, and the one before
    stays (the tree's end then tells the coordinator what was lost)."""
    for pid in pids:
        killed = tree_mod.killed_zombie(pid)
        if killed is not None and records.failure_signal(killed[1], killed[2]):
            name, signum, core = killed
            raise criu_driver.CriuError(
                f"process {name} (pid {pid}) was killed by {signal_name(signum)}"
                + (" (core dumped)" if core else "") + " before the dump ended")


_STEPS = {
    Work.PRECOPY: TreeWork._precopy,
    Work.SUSPEND: TreeWork._suspend,
    Work.ELECT: TreeWork._elect,
    Work.DRAIN: TreeWork._drain,
    Work.DUMP: TreeWork._dump,
    Work.REFILL: TreeWork._refill,
    Work.RESUME: TreeWork._resume,
}
