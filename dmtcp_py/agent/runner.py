"""The agent's asyncio adapter, for a launched tree and for a restored one.

Messages from the coordinator go into the machine (machine.py); the actions
that come back are carried out here, by the modules that know how: the
shims' link, the tree's steps (tree_work.py), the network, the images.
Nothing is decided here; what happens when is the machine's.
"""
from __future__ import annotations

import asyncio
import importlib
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from dmtcp_py import fault_injection
from dmtcp_py.agent import machine as am
from dmtcp_py.agent import (criu_driver, early, hostload, init_dir, signals, start, tcpstats,
                            tree_work)
from dmtcp_py.agent.config import AgentConfig
from dmtcp_py.agent.link import CoordinatorLink
from dmtcp_py.agent.network import Network
from dmtcp_py.agent.peers import PeersReport
from dmtcp_py.agent.records import FATE
from dmtcp_py.agent.replicas import ReplicaServer, send_copy
from dmtcp_py.agent.restoring import Restore
from dmtcp_py.agent.shimlink import ShimLink
from dmtcp_py.agent.spawn import become_subreaper
from dmtcp_py.agent.tree import Tree
from dmtcp_py.agent.tree_work import TreeWork
from dmtcp_py.errors import ImageError, UserError
from dmtcp_py.images import store
from dmtcp_py.paths import hostname
from dmtcp_py.protocol import messages
from dmtcp_py.protocol.messages import ImageInfo
from dmtcp_py.protocol.states import State

log = logging.getLogger("agent")

REJOIN_EVERY = 1.0     # seconds between attempts to reach a coordinator that went away
# What only checkpoints need (pycriu and its protobuf modules: ~40 ms;
# psutil, which looks at the tree's processes: ~10 ms; hashlib, for the
# drain's cookies: ~4 ms; images.checkpoint: ~4 ms) is imported this long
# after the start: off the start-up's path and a restart's (a program that
# ends sooner never pays it), and off the first checkpoint's, where it
# would stop the program that much longer.  So is CRIU's version, which
# every manifest names (`criu --version`, a fork and exec: 6-9 ms here).
# concurrent.futures.thread is the executor run_in_executor starts at an
# agent's first file or CRIU work (~1.5 ms): a restart of many trees loads
# it once before it forks their agents, not once in each.
WARM_UP_AFTER = 0.25
BEATS_PER_PERIOD = 4   # the machine's tick, this many times per heartbeat
CHECKPOINT_MODULES = ("pycriu", "psutil", "hashlib", "dmtcp_py.images.checkpoint",
                      "concurrent.futures.thread")
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def restart_log_name(cfg: AgentConfig) -> str:
    """The log of a restored tree's agent (logs.setup, logs.own_file)."""
    return f"agent-{cfg.tree_id}-restart-{os.getpid()}"


def import_checkpoint_modules() -> None:
    for name in CHECKPOINT_MODULES:
        importlib.import_module(name)


def _identity(cfg: AgentConfig) -> am.Identity:
    m = cfg.manifest
    if m is None:
        return am.Identity(cfg.tree_id, cfg.program, precopy=cfg.precopy)
    image = ImageInfo(path=str(cfg.image), host=hostname(), tree_id=m.tree_id,
                      program=m.program, bytes=m.total_bytes, processes=len(m.pids))
    return am.Identity(cfg.tree_id, cfg.program, restart_comp_id=m.comp_id,
                       restart_generation=m.generation, restart_trees=m.num_trees,
                       restart_image=image, restart_claim=cfg.claim,
                       precopy=cfg.precopy)


class Agent:
    def __init__(self, cfg: AgentConfig, started: early.Started | None = None,
                 begun: Restore | None = None, shared: bool = False,
                 claim_ends: Callable[[], None] | None = None) -> None:
        """started: a launched tree (early.py); else cfg.manifest's image
        is restored, or being restored already (begun: restoring.py).
        shared: other trees' agents run in this process too (together.py).
        claim_ends: closes the connection that holds cfg.claim, once the
        join took the tree over (or failed)."""
        self.cfg = cfg
        self.started = started
        self.begun = begun
        self._claim_ends = claim_ends
        self.tree = Tree(shared_by=cfg.tree_id if shared else None)
        if begun is not None:  # (prepared: its init's directory is made)
            self.tree.hold_reaping = True  # CRIU's processes are not the tree's to reap
            self.tree.init_dir = begun.init_dir
        self.machine = am.AgentMachine(_identity(cfg))
        self.link = CoordinatorLink(cfg.coord_host, cfg.coord_port)
        name = cfg.manifest.agent_socket if cfg.manifest else early.agent_socket_name(cfg.tree_id)
        self.shims = ShimLink(name, on_change=lambda: self.peers.changed(),
                              owes_resume=self.machine.owes_resume,
                              owes_suspend=self.machine.owes_suspend,
                              resume_arg=self.machine.resume_arg,
                              on_ckpt_request=self._ckpt_requested,
                              die_with_agent=lambda: self.machine.die_with_agent,
                              on_child_killed=self._process_killed,
                              on_program_ended=self.tree.program_ended)
        self.tree.on_killed = lambda pid, signum, core: self._process_killed(
            pid, signum, core, self.shims.name_of(pid))
        self.peers = PeersReport(lambda: self.work.members(), self.link.send,
                                 in_round=lambda: not self.machine.running)
        self.net = Network(self.shims, self.link.send)
        self.work = TreeWork(cfg, shims=self.shims, net=self.net, tree=self.tree,
                             send=self.link.send, reach_ip=lambda: self.link.local_ip)
        self.busy = asyncio.Lock()  # one barrier's work at a time, in order
        self.relays: list = []
        self._verdict = asyncio.Event()  # a Publish or Discard was carried out
        self._round_end = asyncio.Event()  # a round's end was heard (SettleExpired)
        self._tasks: set[asyncio.Task] = set()      # kept from the garbage collector
        self._finishing: set[asyncio.Task] = set()  # images being published or dropped
        self._follower: asyncio.Task | None = None
        self.replicas: ReplicaServer | None = None
        self.load = hostload.LoadSampler()  # --rebalance: deltas between samples
        self._signals: list[signals.Subscription] = []  # until run() ends

    async def _tell_shims(self, record: int, arg: int) -> None:
        """A record for every process; FATE 1 also for those that have not
        connected: woken, they hear it with their hello."""
        if record == FATE and arg:
            await self.work.bring_in()
        await self.shims.tell_all(record, arg)

    # ---- entry -----------------------------------------------------------------

    async def run(self) -> int:
        try:
            return await self._run()
        finally:
            # asyncio's loop closes its self-pipe before it removes its
            # signal handlers: a signal in between (the last processes of
            # the tree ending) printed a traceback after a one-line error.
            # Removed here, while the pipe is open.
            for sub in self._signals:
                signals.unsubscribe(sub)
            self._signals.clear()

    def let_go(self) -> None:
        """What the end of this agent's process would let go, for an agent
        that failed in a process it shares with other trees' agents
        (together.py): its tree ends (no agent would checkpoint it again),
        its connections close (the coordinator sees it leave), its tasks
        stop."""
        self.tree.kill()
        if self._follower is not None:
            self._follower.cancel()
        for task in list(self._tasks):
            task.cancel()
        self.shims.stop_listening()
        self.net.close()
        self.link.close()

    async def _run(self) -> int:
        loop = asyncio.get_running_loop()
        become_subreaper()
        self._signals.append(signals.subscribe(signal.SIGCHLD, self.tree.reap_orphans))
        for sig in FORWARDED_SIGNALS:
            self._signals.append(signals.subscribe(sig, self.tree.signal_root, sig))
        # the terminal delivers these to the whole foreground group already,
        # but not to a tree in a PID namespace (and session) of its own
        for sig in (signal.SIGINT, signal.SIGQUIT):
            self._signals.append(signals.subscribe(sig, self._terminal_signal, sig))
        if self.started is not None:
            self._take_over(self.started)
            try:
                await fault_injection.hold(State.RUNNING)  # (the program runs, not joined)
                await self._join()
            except UserError:
                await self._end_unjoined()
                raise
            finally:  # (after the join: the coordinator has the tree by then)
                self.started.announced()
        else:
            try:
                await self._join()
            except UserError:
                if self.begun is not None:
                    await self._end_unjoined()
                raise
            finally:  # (after the join: the coordinator has the tree by then)
                if self._claim_ends is not None:
                    self._claim_ends()
        # following the coordinator already while restoring: connections
        # find their peers through its names
        self._follower = asyncio.create_task(self._follow())
        self._spawn(self._beat())
        self._spawn(self.peers.watch())
        loop.call_later(WARM_UP_AFTER, self._warm_up)
        if self.started is not None:
            # the shims' hellos (and a dmtcp_checkpoint()) queued meanwhile
            await self.shims.listen(self.started.listener)
        else:
            await self._restore()
        await self.tree.exited.wait()
        await self.tree.wait_for_orphans()
        await self.shims.settle()  # a parent's word of a killed child comes before the end
        self.tree.settle_status()  # (and the root's word of the program's end)
        async with self.busy:  # let a reply to the coordinator go out first
            await self._apply(self.machine.tree_exited(self.tree.exit_status))
        self.tree.reap_all()
        if self.tree.init_dir is not None:
            init_dir.release(self.tree.init_dir)
        while self._finishing:  # images are never left half published
            await asyncio.gather(*self._finishing, return_exceptions=True)
        # (the follower hears the end of the round we published in meanwhile)
        await self._apply(self.machine.ending())
        self._follower.cancel()
        while self._finishing:  # (what that round's end settled)
            await asyncio.gather(*self._finishing, return_exceptions=True)
        self.work.bring_back_expired()  # what no round's end settled
        self.work.drop_layer()  # a pre-copy whose dump never came
        for relay in self.relays:
            relay.stop()
        if self.replicas is not None:
            self.replicas.close()
        self.link.close()
        if self.machine.abandoned:
            raise UserError(self.machine.abandoned)
        if self.machine.stop_lost:
            log.warning("%s", self.machine.stop_lost)
            print(f"dmtcp: {self.machine.stop_lost}", file=sys.stderr, flush=True)
        if self.machine.moved_to:
            log.info("the tree moved to %s", self.machine.moved_to)
            print(f"dmtcp: the program moved to {self.machine.moved_to} and runs on there",
                  file=sys.stderr, flush=True)
        return self.machine.exit_code(self.tree.exit_status)

    def _take_over(self, started: early.Started) -> None:
        """The tree dmtcp-launch started before this agent loaded: watched
        from now on (it may have ended already), and the signals held
        since it started are delivered to the handlers now in place."""
        self.tree.own_namespace = started.own_namespace
        self.tree.init_dir = started.init_dir
        self.tree.adopt(started.pid)
        self.shims.bind_to_tree(started.pid)
        started.release_signals()
        log.info("started %s as pid %d%s", self.cfg.argv, started.pid,
                 " in a PID namespace of its own" if started.own_namespace else "")

    async def _end_unjoined(self) -> None:
        """The coordinator would not have the tree: it ends, unseen (a
        launched one, or one whose restore dmtcp-restart began)."""
        if self.started is not None:
            self.started.listener.close()
        await start.end_unran(self.tree, self.begun if self.started is None else None)
        if self.tree.init_dir is not None:
            init_dir.release(self.tree.init_dir)

    def _warm_up(self) -> None:
        """What a first checkpoint would otherwise wait for (WARM_UP_AFTER);
        CRIU's version in a worker thread: a child process to wait for."""
        import_checkpoint_modules()
        asyncio.get_running_loop().run_in_executor(None, criu_driver.version)

    async def _restore(self) -> None:
        m = self.cfg.manifest
        assert m is not None
        try:
            self.relays = await start.restore(self.cfg, self.tree, self.net, self.link.local_ip,
                                              self.begun)
            self.work.relays = self.relays
            await self._listen()
        except UserError as exc:
            await self._apply(self.machine.restored(error=str(exc)))
            self._follower.cancel()
            if self.tree.init_dir is not None:
                init_dir.release(self.tree.init_dir)
            if self.machine.abandoned:  # what failed followed from that
                raise UserError(self.machine.abandoned) from None
            raise
        if tree_work.is_migration_image(self.cfg.image):
            # restored: the image a migration brought the tree here with has served
            self.work.drop_image(self.cfg.image)
        pids = start.restored_pids(m, self.tree)
        self.net.renumber(pids)
        await self._apply(self.machine.restored(frozenset(pids[p] for p in m.shim_pids
                                                          if p in pids),
                                                sockets=self.net.holds_sockets()))

    async def _listen(self) -> None:
        """Listen for the restored tree's processes, under the name of the
        tree and of the PID namespace it now runs in (shimlink.py): known
        only once the tree exists.  Its processes retry until then.  (The
        shims of an image of an older dmtcp_py use the tree's name alone.)"""
        m = self.cfg.manifest
        assert m is not None
        if m.agent_socket_ns:
            self.shims.bind_to_tree(self.tree.root_pid)
        try:
            await self.shims.listen()
        except OSError as exc:
            self.tree.kill()
            raise UserError(f"cannot listen for the tree's processes on @{self.shims.name}: "
                            f"{exc.strerror} (is this tree already running on this host?)") from None

    def _terminal_signal(self, signum: int) -> None:
        """^C or ^\\ of the terminal (or a kill): a tree in a session of its
        own gets it through its root, which sends it to all its processes."""
        if self.tree.own_namespace:
            self.tree.signal_root(signum)

    # ---- the coordinator ---------------------------------------------------------

    async def _join(self) -> None:
        welcome = await self.link.join(self.machine.hello(self.cfg.token, hostname(), os.getpid()))
        if self.cfg.ckptdir is None:  # the coordinator's, else where we run
            self.cfg.ckptdir = Path(welcome.ckptdir or os.getcwd()).resolve()
        if self.cfg.keep is None:  # likewise
            self.cfg.keep = welcome.keep if welcome.keep is not None else store.KEEP_PREVIOUS
        log.info("joined computation %s as agent %s", welcome.comp_id, welcome.agent_id)
        await self._apply(self.machine.welcomed(welcome))

    async def _follow(self) -> None:
        try:
            async for msg in self.link:
                if isinstance(msg, messages.Barrier):
                    # in a task: a barrier's work may wait for messages that
                    # come on this same link (matches, names); the lock keeps
                    # barriers in order
                    self._spawn(self._barrier_in_turn(msg))
                else:
                    await self._apply(self.machine.on_message(msg))
        except Exception:
            log.exception("agent failure")
            raise
        async with self.busy:  # the work under way (a dump) ends first
            await self._apply(self.machine.coordinator_lost())
        self._round_end.set()  # (no round's end will be heard now: WaitForRoundEnd)

    async def _barrier_in_turn(self, msg: messages.Barrier) -> None:
        async with self.busy:
            await self._apply(self.machine.on_message(msg))

    async def _rejoin(self) -> None:
        """Every second, try the coordinator's address again; a coordinator
        started there anew (with the same token) takes this tree back."""
        self.link.close()
        while not self.tree.exited.is_set():
            await asyncio.sleep(REJOIN_EVERY)
            try:
                await self._join()
            except UserError as exc:
                log.debug("rejoin: %s", exc)
                continue
            log.warning("rejoined the coordinator as computation %s", self.machine.comp_id)
            await self._follow()
            return

    async def _beat(self) -> None:
        """The machine's clock: heartbeats, and a coordinator gone silent."""
        while not self.tree.exited.is_set():
            period = self.machine.heartbeat / BEATS_PER_PERIOD if self.machine.heartbeat > 0 else 1.0
            await asyncio.sleep(period)
            await self._apply(self.machine.tick(time.monotonic(), self.link.last_heard))

    async def _send_traffic(self) -> None:
        """The tree's TCP connections and their counters, to the coordinator."""
        def sample() -> list[tcpstats.Flow]:
            return tcpstats.flows(self.tree.pids())
        try:
            flows = await asyncio.get_running_loop().run_in_executor(None, sample)
        except OSError as exc:  # no sock_diag here: the graph goes without this tree
            log.debug("traffic sample failed: %s", exc)
            return
        self.link.send(messages.Traffic(flows=tuple(
            messages.FlowInfo(local=f.local, peer=f.peer, sent=f.sent, received=f.received)
            for f in flows)))

    async def _send_load(self) -> None:
        """How busy the tree's CPUs were since the last sample, and its share."""
        def sample():
            return self.load.sample(self.tree.pids(), time.monotonic())
        try:
            load = await asyncio.get_running_loop().run_in_executor(None, sample)
        except OSError as exc:  # no /proc/stat here: no rebalancing by this tree
            log.debug("load sample failed: %s", exc)
            return
        if load is not None:
            self.link.send(load)

    def _process_killed(self, pid: int, signum: int, core: bool, name: str) -> None:
        self._spawn(self._apply(self.machine.process_killed(pid, signum, core, name)))

    def _ckpt_requested(self, pid: int) -> None:
        log.info("pid %d asked for a checkpoint (dmtcp_checkpoint)", pid)
        self._spawn(self._apply(self.machine.ckpt_requested()))

    # ---- actions --------------------------------------------------------------------

    async def _apply(self, actions: list) -> None:
        for action in actions:
            await self._carry_out(action)

    async def _carry_out(self, action) -> None:
        match action:
            case am.Send(message):
                self.link.send(message)
            case am.DoWork(step):
                began = time.monotonic()
                result = await self.work.carry_out(step)
                log.debug("%s took %.1f ms", step.work.value, (time.monotonic() - began) * 1e3)
                await self._apply(self.machine.work_done(step, result))
            case am.Publish(generation, pending):
                self._verdict.set()
                self._spawn(self._publish(generation, pending), finishing=True)
            case am.Discard(pending=pending):
                self._verdict.set()
                self._spawn(self.work.discard(pending), finishing=True)
            case am.SettleExpired(generation, ok):
                self._spawn(self.work.settle_expired(generation, ok), finishing=True)
                self._round_end.set()
            case am.WaitForRoundEnd(seconds):
                deadline = time.monotonic() + seconds
                while self.machine.unsettled and self.machine.linked \
                        and time.monotonic() < deadline:
                    self._round_end.clear()
                    try:
                        await asyncio.wait_for(self._round_end.wait(),
                                               max(0.0, deadline - time.monotonic()))
                    except asyncio.TimeoutError:
                        break
            case am.TellShims(record, arg):
                self._spawn(self._tell_shims(record, arg))
            case am.GiveBack(expect_pids, resume_arg):
                log.warning("checkpoint abandoned without its coordinator: the program goes on")
                await self.work.give_back(expect_pids, resume_arg)
            case am.WaitForCommit(seconds):
                self._verdict.clear()
                try:
                    await asyncio.wait_for(self._verdict.wait(), seconds)
                except asyncio.TimeoutError:
                    await self._apply(self.machine.commit_timed_out())
            case am.ToNetwork(message):
                self.net.on_message(message)
            case am.KillTree():
                log.info("kill requested by the coordinator")
                self.tree.kill()
            case am.DropMoved():
                self.work.drop_moved()
            case am.AbandonRestart(why):
                log.error("%s", why)
                self.tree.kill()
            case am.Rejoin():  # it follows the new link once it has one
                log.warning("lost the coordinator; the program keeps running without "
                            "checkpoints until one answers on %s again", self.link.where)
                self._follower = asyncio.create_task(self._rejoin())
            case am.ReportPeers():
                self.peers.now()
            case am.ServeReplicas():
                await self._serve_replicas()
            case am.CopyImage(generation, path, targets):
                for target in targets:
                    self._spawn(self._copy(generation, path, target))
            case am.SampleTraffic():
                self._spawn(self._send_traffic())
            case am.SampleLoad():
                self._spawn(self._send_load())
            case am.DropLink(why):
                log.warning("%s; taking it for lost", why)
                self.link.close()
            case _:
                raise TypeError(f"unknown action {action!r}")

    async def _publish(self, generation: int, pending) -> None:
        error = await self.work.publish(pending)
        await self._apply(self.machine.published(generation, error))

    async def _serve_replicas(self) -> None:
        address = self.link.local_ip
        self.replicas = ReplicaServer(self.cfg.token, lambda: self.cfg.ckptdir or Path.cwd())
        try:
            port = await self.replicas.start(address)
        except OSError as exc:
            log.error("cannot take replicas on %s: %s", address, exc.strerror or exc)
            self.replicas = None
            return
        log.info("taking replicas on %s port %d", address, port)
        await self._apply(self.machine.replica_service_started(address, port))

    async def _copy(self, generation: int, path: str, target: messages.ReplicaTarget) -> None:
        try:
            where = await asyncio.to_thread(send_copy, Path(path), generation, target,
                                            self.cfg.token)
        except ImageError as exc:
            log.warning("generation %d not copied to %s: %s", generation, target.host, exc)
            await self._apply(self.machine.replica_copied(generation, target.host, error=str(exc)))
            return
        log.info("generation %d copied to %s:%s", generation, target.host, where)
        await self._apply(self.machine.replica_copied(generation, target.host, where))

    def _spawn(self, coro, finishing: bool = False) -> None:
        tasks = self._finishing if finishing else self._tasks
        task = asyncio.create_task(coro)
        tasks.add(task)
        task.add_done_callback(tasks.discard)
