"""The agent's asyncio program, for a launched tree and for a restored one.

It talks to the coordinator (barriers), to the shims of its tree (records),
and runs CRIU.  The order of states comes from protocol.states; this module
only says what each state means for one tree.
"""
from __future__ import annotations

import asyncio
import importlib
import logging
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from dmtcp_py import logs
from dmtcp_py.agent import criu_driver, shimlink, stdio
from dmtcp_py.agent.machine import AgentMachine, Barrier, Verdict, Work
from dmtcp_py.agent.network import Network
from dmtcp_py.agent.shimlink import ShimLink
from dmtcp_py.agent.tree import Tree, become_subreaper
from dmtcp_py.errors import UserError
from dmtcp_py.images import manifest as manifest_mod
from dmtcp_py.images import compress, integrity, shared_files, store, temp_files, written_files
from dmtcp_py.paths import hostname, run_dir, shim_library, tool, tree_init
from dmtcp_py.protocol import codec, messages

log = logging.getLogger("agent")

JOIN_TIMEOUT = 10.0
SHIM_TIMEOUT = 10.0    # a process that does not answer its agent in this time is stuck
COMMIT_TIMEOUT = 30.0  # a stopped tree's agent waits this long for the commit
# The coordinator hears of the tree's processes at most this often: a
# program that forks and execs in a loop makes and ends several shim
# connections per child, and describing every process and telling the
# coordinator each time cost more than the fork itself.
PEERS_REPORT_DELAY = 0.05
REJOIN_EVERY = 1.0     # seconds between attempts to reach a coordinator that went away
# What only checkpoints need (pycriu, pyroute2: ~150 ms of imports) is
# imported this long after the start: off the start-up's path (a program
# that ends sooner never pays it), and off the first checkpoint's, where it
# would stop the program that much longer.
WARM_UP_AFTER = 0.25
CHECKPOINT_MODULES = ("pycriu", "pyroute2")
PROGRESS_EVERY = 0.25  # seconds between progress reports while CRIU writes
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


async def _test_hold(state: str) -> None:
    """For tests: stay in a state for DMTCP_TEST_HOLD_<STATE> seconds, so
    that a test can look at the processes while they are there."""
    seconds = float(os.environ.get(f"DMTCP_TEST_HOLD_{state}", "0") or 0)
    if seconds > 0:
        await asyncio.sleep(seconds)


# where Open MPI, PMIx and MPICH's Hydra tell a process its rank
_RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK")


def _step_times(start: float, marks: dict[str, float]) -> str:
    """'a 3.1, b 40.2': the time each marked step took after the previous."""
    out, prev = [], start
    for name, at in marks.items():
        out.append(f"{name} {(at - prev) * 1e3:.1f}")
        prev = at
    return ", ".join(out)


def _import_checkpoint_modules() -> None:
    for name in CHECKPOINT_MODULES:
        importlib.import_module(name)


def _describe(pid: int) -> list:
    """[pid, name] or [pid, name, MPI rank], as `dmtcp-command -l` shows it."""
    try:
        proc = psutil.Process(pid)
        entry = [pid, proc.name()]
    except psutil.Error:
        return [pid, "?"]
    rank = _mpi_rank(proc)
    return entry if rank is None else entry + [rank]


def _mpi_rank(proc: psutil.Process) -> int | None:
    """The MPI rank of a process, from the environment its launcher gave it."""
    try:
        env = proc.environ()
    except psutil.Error:
        return None
    for name in _RANK_VARIABLES:
        if env.get(name, "").isdigit():
            return int(env[name])
    return None


class CannotExecute(UserError):
    exit_code = 126  # as a shell says it


@dataclass
class AgentConfig:
    coord_host: str
    coord_port: int
    token: str
    ckptdir: Path | None   # None: the coordinator's, else the cwd
    tree_id: str
    program: str
    argv: list[str] = field(default_factory=list)
    path: str = ""                      # resolved program path (launch)
    image: Path | None = None           # restart
    manifest: manifest_mod.Manifest | None = None
    compress: bool = False              # memory pages in zstd (images.compress)


class Agent:
    def __init__(self, cfg: AgentConfig) -> None:
        self.cfg = cfg
        self.tree = Tree()
        name = cfg.manifest.agent_socket if cfg.manifest else f"dmtcp-agent-{cfg.tree_id}"
        self.shims = ShimLink(name, on_change=self._peers_changed,
                              owes_resume=lambda suspended: self.machine.owes_resume(suspended),
                              resume_arg=lambda: self.machine.resume_arg(),
                              on_ckpt_request=self._ckpt_requested)
        self.net = Network(self.shims, self._send)
        self.machine = AgentMachine(restarting=cfg.manifest is not None)
        self.comp_id = ""
        self.writer: asyncio.StreamWriter | None = None
        self.expected_pids: set[int] = set()
        self.busy = asyncio.Lock()
        self._peers_report: asyncio.TimerHandle | None = None  # a report of the processes, due
        self.relays: list[stdio.FileRelay] = []
        # dumped, waiting for the coordinator's word that every tree dumped
        self._to_publish: tuple[int, Path, Path] | None = None
        self._commit = asyncio.Event()
        self._publishing: asyncio.Task | None = None
        self._link: asyncio.Task | None = None  # the coordinator connection's reader
        # the last complete generation, told to a coordinator we rejoin
        self.published_generation = cfg.manifest.generation if cfg.manifest else 0

    # ---- entry -----------------------------------------------------------

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        become_subreaper()
        loop.add_signal_handler(signal.SIGCHLD, self.tree.reap_orphans)
        for sig in FORWARDED_SIGNALS:
            loop.add_signal_handler(sig, self.tree.signal_root, sig)
        # the terminal delivers these to the whole foreground group already
        loop.add_signal_handler(signal.SIGINT, lambda: None)
        loop.add_signal_handler(signal.SIGQUIT, lambda: None)
        try:
            await self.shims.listen()
        except OSError as exc:
            raise UserError(f"cannot listen for the tree's processes on @{self.shims.name}: "
                            f"{exc.strerror} (is this tree already running on this host?)") from None
        reader = await self._join_coordinator()
        # listening already while restoring: connections find their peers
        # through the coordinator's names
        self._link = asyncio.create_task(self._coordinator_loop(reader))
        loop.call_later(WARM_UP_AFTER, _import_checkpoint_modules)
        if self.cfg.manifest is None:
            self._start_tree()
        else:
            try:
                await self._restore()
            except BaseException:
                self._link.cancel()
                raise
        await self.tree.exited.wait()
        await self.tree.wait_for_orphans()
        async with self.busy:  # let a reply to the coordinator go out first
            pass
        if self._to_publish is not None:  # a stopped tree's images, say
            try:
                await asyncio.wait_for(self._commit.wait(), COMMIT_TIMEOUT)
            except asyncio.TimeoutError:
                self._on_commit({"generation": self._to_publish[0], "ok": False})
        self._link.cancel()
        self.tree.reap_all()
        if self._publishing is not None:
            await self._publishing
        for relay in self.relays:
            relay.stop()
        if self.writer:
            self.writer.close()
        if self.machine.stopped_by_checkpoint:
            return 0
        return self.tree.exit_status if self.tree.exit_status is not None else 0

    # ---- coordinator -------------------------------------------------------

    async def _join_coordinator(self, rejoin: bool = False) -> asyncio.StreamReader:
        cfg = self.cfg
        try:
            reader, self.writer = await asyncio.open_connection(cfg.coord_host, cfg.coord_port)
        except OSError as exc:
            raise UserError(f"no coordinator at {cfg.coord_host}:{cfg.coord_port} "
                            f"({exc.strerror or exc})") from None
        hello = dict(role="agent", token=cfg.token, host=hostname(), pid=os.getpid(),
                     program=cfg.program, tree_id=cfg.tree_id)
        m = cfg.manifest
        if rejoin:  # the coordinator we had died: this one takes us back
            hello.update(rejoin=True, comp_id=self.comp_id, generation=self.published_generation)
        elif m is not None:
            hello.update(restart=True, comp_id=m.comp_id, generation=m.generation,
                         num_trees=m.num_trees)
        self._send(messages.make("hello", **hello))
        self._decoder = codec.Decoder()
        self._pending: list[dict] = []
        try:
            reply = await asyncio.wait_for(self._recv(reader), JOIN_TIMEOUT)
        except asyncio.TimeoutError:
            raise UserError(f"{cfg.coord_host}:{cfg.coord_port} did not answer as a dmtcp "
                            f"coordinator within {JOIN_TIMEOUT:g} s") from None
        except (codec.FrameError, messages.MessageError) as exc:
            raise UserError(f"{cfg.coord_host}:{cfg.coord_port} is not a dmtcp coordinator "
                            f"({exc})") from None
        if reply is None:
            raise UserError(f"coordinator at {cfg.coord_host}:{cfg.coord_port} closed the connection")
        if reply["type"] == "refused":
            raise UserError(f"coordinator at {cfg.coord_host}:{cfg.coord_port} refused: {reply['error']}")
        self.comp_id = reply["comp_id"]
        if cfg.ckptdir is None:
            cfg.ckptdir = Path(reply.get("ckptdir") or os.getcwd()).resolve()
        log.info("joined computation %s as agent %s", self.comp_id, reply["agent_id"])
        return reader

    async def _recv(self, reader: asyncio.StreamReader) -> dict | None:
        while not self._pending:
            data = await reader.read(65536)
            if not data:
                return None
            self._pending.extend(self._decoder.feed(data))
        return messages.validate(self._pending.pop(0))

    def _send(self, message: dict) -> None:
        if self.writer is not None and not self.writer.is_closing():
            self.writer.write(codec.encode(message))

    async def _coordinator_loop(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                msg = await self._recv(reader)
                if msg is None:
                    break
                if msg["type"] == "barrier":
                    # in a task: a barrier may wait for messages that come
                    # on this same connection (matches, names); the lock
                    # keeps barriers in order
                    asyncio.create_task(self._barrier_in_turn(msg))
                elif msg["type"] == "commit":
                    self._on_commit(msg)
                elif msg["type"] == "generation_done":
                    if msg["ok"]:
                        self.published_generation = msg["generation"]
                    arg = msg["generation"] | (0 if msg["ok"] else shimlink.DONE_FAILED)
                    asyncio.create_task(self.shims.tell_all(shimlink.DONE, arg))
                elif self.net.on_message(msg):
                    pass
                elif msg["type"] == "kill":
                    log.info("kill requested by the coordinator")
                    self.tree.kill()
        except (codec.FrameError, messages.MessageError, ConnectionError) as exc:
            log.error("coordinator link broken: %s", exc)
        except Exception:
            log.exception("agent failure")
            raise
        log.warning("lost the coordinator; the program keeps running without checkpoints "
                    "until one answers on %s:%d again", self.cfg.coord_host, self.cfg.coord_port)
        await self._abandon_round()
        self._link = asyncio.create_task(self._rejoin())

    async def _rejoin(self) -> None:
        """Every second, try the coordinator's address again; a coordinator
        started there anew (with the same token) takes this tree back."""
        if self.writer is not None:
            self.writer.close()
        while not self.tree.exited.is_set():
            await asyncio.sleep(REJOIN_EVERY)
            try:
                reader = await self._join_coordinator(rejoin=True)
            except UserError as exc:
                log.debug("rejoin: %s", exc)
                continue
            log.warning("rejoined the coordinator as computation %s", self.comp_id)
            self._report_peers()
            await self._coordinator_loop(reader)
            return

    async def _abandon_round(self) -> None:
        """A checkpoint under way when the coordinator went: finish it here,
        so that the program never stays stopped.  Waits for the barrier
        work in progress (a dump) to end first."""
        async with self.busy:
            if not self.machine.abandon():
                return
            log.warning("checkpoint abandoned without its coordinator: the program goes on")
            if self._to_publish is not None:
                _gen, partial, _final = self._to_publish
                self._to_publish = None
                await asyncio.get_running_loop().run_in_executor(None, store.discard, partial)
            if not self.shims.listening:  # a dump that ended without reopening it
                await self.shims.listen()
            await self.shims.wait_for(self.tree.alive(self.expected_pids), SHIM_TIMEOUT)
            try:
                await self.net.abandon(SHIM_TIMEOUT)
            except Exception:  # never keep the program stopped for this
                log.exception("giving the sockets back failed")
            await self.shims.request_all(shimlink.RESUME, shimlink.RESUMED, SHIM_TIMEOUT,
                                         arg=self.machine.resume_arg())

    async def _barrier_in_turn(self, msg: dict) -> None:
        async with self.busy:
            try:
                await self._barrier(msg)
            except Exception:
                log.exception("agent failure at barrier %s", msg.get("state"))
                self._send(messages.make("reached", state=msg["state"], ok=False,
                                         error=f"internal error of the agent (see {logs.current()})"))

    def _ckpt_requested(self, pid: int) -> None:
        log.info("pid %d asked for a checkpoint (dmtcp_checkpoint)", pid)
        self._send(messages.make("ckpt_request"))

    def _peers_changed(self) -> None:
        """Report the processes once the burst of changes is over."""
        if self._peers_report is None:
            self._peers_report = asyncio.get_running_loop().call_later(
                PEERS_REPORT_DELAY, self._report_peers)

    def _report_peers(self) -> None:
        if self._peers_report is not None:
            self._peers_report.cancel()
            self._peers_report = None
        procs = []
        for shim in sorted(self.shims.shims, key=lambda s: s.pid):
            if shim.label is None:   # once per connection: a process that execs connects anew
                shim.label = _describe(shim.pid)
            procs.append(shim.label)
        self._send(messages.make("peers", count=len(procs), procs=procs))

    # ---- the tree ------------------------------------------------------------

    def _start_tree(self) -> None:
        cfg = self.cfg
        env = dict(os.environ)
        lib = str(shim_library())
        env["LD_PRELOAD"] = lib + (":" + env["LD_PRELOAD"] if env.get("LD_PRELOAD") else "")
        env["DMTCP_AGENT_SOCK"] = self.shims.address
        env["DMTCP_COORD_HOST"] = cfg.coord_host
        env["DMTCP_COORD_PORT"] = str(cfg.coord_port)
        env["DMTCP_CHECKPOINT_DIR"] = str(cfg.ckptdir)
        # `ssh HOST CMD` from the tree: the shim runs this instead (dmtcp_py.ssh),
        # which starts CMD on HOST under this computation with the token
        env["DMTCP_SSH_WRAPPER"] = tool("dmtcp-ssh")
        # `import dmtcp` for Python programs (hijack/python/dmtcp.py), after theirs
        api_dir = str(shim_library().parent.parent / "python")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), api_dir) if p)
        env["DMTCP_COORD_TOKEN"] = cfg.token
        init = str(tree_init())
        try:
            pid = self.tree.spawn(init, [init, cfg.path, *cfg.argv], env)
        except OSError as exc:
            raise CannotExecute(f"cannot run {init}: {exc.strerror or exc} "
                                "(run `make setup`)") from None
        log.info("started %s as pid %d", cfg.argv, pid)

    async def _restore(self) -> None:
        cfg, m = self.cfg, self.cfg.manifest
        assert m is not None and cfg.image is not None
        temp_files.restore(m.temp_files, cfg.image)
        shared_files.restore(m.shared_files, cfg.image)
        shared_files.relink(m.link_remaps)
        written_files.rollback(m.written_files)
        if m.sockets:
            reach_ip = self.writer.get_extra_info("sockname")[0] if self.writer else "127.0.0.1"
            try:
                await self.net.recreate(m.sockets, cfg.image, reach_ip)
            except Exception as exc:
                self._send(self.machine.restored(error=str(exc)))
                raise UserError(f"cannot make the network connections again: {exc}") from None
        handover = stdio.prepare(m.stdio, run_dir())
        log_path = run_dir() / f"criu-restore-{m.tree_id}-{os.getpid()}.log"
        loop = asyncio.get_running_loop()
        self.relays = handover.relays
        for relay in self.relays:
            relay.start(loop)
        self.tree.hold_reaping = True
        try:
            with compress.readable(cfg.image) as images:
                pid = await loop.run_in_executor(
                    None, lambda: criu_driver.restore(images, log_path, inherit=handover.pairs,
                                                      terminal=handover.terminal))
            # watched before reaping resumes: a root that already ended (a
            # restart round aborted at once) is collected with its status
            self.tree.adopt(pid)
        except (criu_driver.CriuError, UserError) as exc:
            self._send(self.machine.restored(error=str(exc)))
            raise UserError(str(exc)) from None
        finally:
            self.tree.hold_reaping = False
            handover.close_after_restore()
        self.expected_pids = set(m.shim_pids)
        log.info("restored %s (generation %d) as pid %d", cfg.image, m.generation, pid)
        self._send(self.machine.restored())

    # ---- barriers --------------------------------------------------------------

    async def _barrier(self, msg: dict) -> None:
        barrier, refusal = self.machine.barrier(msg)
        if barrier is None:
            log.error("coordinator: %s", refusal["error"])
            self._send(refusal)
            return
        log.debug("barrier %s: %d processes connected", barrier.target.value,
                  len(self.shims.shims))
        reply: dict = {}
        try:
            error = await self._work(barrier, reply)
        except Exception as exc:  # a bug of ours must not leave the tree suspended
            error = f"internal error: {exc!r} (see {logs.current()})"
            log.exception("%s failed", barrier.work.value)
        log.debug("reached %s%s", barrier.target.value, f" with error: {error}" if error else "")
        self._send(self.machine.done(barrier, error, **reply))

    async def _work(self, barrier: Barrier, reply: dict) -> str | None:
        """Carry out one barrier's work; the error to report, if any."""
        work = barrier.work
        if work is Work.SUSPEND:
            stuck = await self.shims.request_all(shimlink.SUSPEND, shimlink.SUSPENDED, SHIM_TIMEOUT)
            await _test_hold("SUSPENDED")
            return f"processes {stuck} did not answer the suspend request" if stuck else None
        if work is Work.ELECT:
            stuck = await self.shims.request_all(shimlink.ELECT, shimlink.ELECTED, SHIM_TIMEOUT)
            return f"processes {stuck} did not answer the election request" if stuck else None
        if work is Work.DRAIN:
            try:
                await self.net.park_and_drain(self.shims.pids(), self.comp_id,
                                              barrier.generation, SHIM_TIMEOUT)
                await _test_hold("DRAINED")
                return None
            except Exception as exc:
                log.exception("drain failed")
                return f"draining the network connections failed: {exc!r}"
            finally:
                reply["external"] = list(self.net.external)
                if self.net.failed_conns:
                    reply["failed_conns"] = list(self.net.failed_conns)
        if work is Work.DUMP:
            try:
                reply["image"] = await self._checkpoint(barrier)
                return None
            except (criu_driver.CriuError, OSError) as exc:
                log.error("checkpoint failed: %s", exc)
                return str(exc)
        if work is Work.REFILL:
            missing = await self.shims.wait_for(self.tree.alive(self.expected_pids), SHIM_TIMEOUT)
            if missing:
                log.warning("processes %s did not reconnect", sorted(missing))
            try:
                await self.net.refill_and_unpark(SHIM_TIMEOUT, barrier.failed_conns)
                return None
            except Exception as exc:
                log.exception("refill failed")
                return f"refilling the network connections failed: {exc!r}"
        await self.shims.request_all(shimlink.RESUME, shimlink.RESUMED, SHIM_TIMEOUT,
                                     arg=self.machine.resume_arg(barrier))
        return None

    def _on_commit(self, msg: dict) -> None:
        """Every tree dumped (ok) or one failed: publish our images, or drop
        them, so that a failed checkpoint never replaces a good one."""
        verdict = self.machine.commit(msg)
        job, self._to_publish = self._to_publish, None
        if verdict is None or job is None:
            self._to_publish = job
            return
        self._commit.set()
        if verdict is Verdict.PUBLISH:
            self._publishing = asyncio.create_task(self._publish(*job))
        else:
            log.warning("generation %d failed elsewhere; its images here are dropped", job[0])
            self._publishing = asyncio.ensure_future(
                asyncio.get_running_loop().run_in_executor(None, store.discard, job[1]))

    async def _publish(self, generation: int, partial: Path, final: Path) -> None:
        """Make the dumped images durable and give them their name, while
        the program runs again (the fsync is about a second per GiB here),
        then tell the coordinator; old generations go last."""
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, self._finish_images, partial)
            expired = await loop.run_in_executor(None, store.publish, partial, final)
        except OSError as exc:
            await loop.run_in_executor(None, store.discard, partial)
            log.error("generation %d not published: %s", generation, exc)
            self._send(messages.make("published", generation=generation, ok=False,
                                     error=f"publishing {final}: {exc}"))
            return
        log.info("generation %d published as %s", generation, final)
        self._send(messages.make("published", generation=generation, ok=True))
        await loop.run_in_executor(None, lambda: [store.discard(e) for e in expired])

    def _finish_images(self, partial: Path) -> None:
        """While the program runs again: compress (if asked), then the
        checksums the restart checks, in the manifest."""
        changes: dict = {}
        if self.cfg.compress and compress.compress(partial):
            changes.update(files=store.file_sizes(partial), compression=compress.NAME)
        # the disk writes the files while they are hashed from the page
        # cache: the two overlap instead of adding up (publish flushes again
        # what changed since, the manifest)
        with ThreadPoolExecutor(max_workers=1) as pool:
            flushed = pool.submit(store.flush_files, partial)
            changes["sha256"] = integrity.digests(partial)
            flushed.result()
        manifest_mod.rewrite(partial, **changes)

    async def _checkpoint(self, barrier: Barrier) -> dict:
        cfg = self.cfg
        generation, stop = barrier.generation, barrier.stop
        name = store.image_name(cfg.program, cfg.tree_id)
        final = cfg.ckptdir / name
        partial = store.make_partial(cfg.ckptdir, name, generation)
        loop = asyncio.get_running_loop()
        log_path = run_dir() / f"criu-dump-{cfg.tree_id}.log"
        started = time.monotonic()
        self.shims.stop_listening()
        try:
            parked = set(self.shims.pids())
            # REFILLED waits for these to come back, also when the dump fails
            self.expected_pids = parked
            stuck = await self.shims.park_all(SHIM_TIMEOUT)
            steps = {"park": time.monotonic()}
            if stuck:
                raise criu_driver.CriuError(f"processes {stuck} did not detach from the agent")
            procs = self.tree.processes()
            io = stdio.describe()
            external = stdio.external_ids(io)
            self.tree.hold_reaping = True
            ticker = asyncio.create_task(self._report_progress(generation, partial, procs))
            try:
                await loop.run_in_executor(None, lambda: criu_driver.dump(
                    self.tree.root_pid, partial, log_path, leave_running=not stop,
                    external=external))
            finally:
                self.tree.hold_reaping = False
                ticker.cancel()
            steps["criu"] = time.monotonic()
            # the program's threads are still stopped (they go on at
            # RUNNING): the mapped files are as the dumped memory sees them
            pids = [p.pid for p in procs]
            shared = await loop.run_in_executor(None, shared_files.save,
                                                shared_files.mapped_files(pids), partial)
            handed_over = {d["path"] for d in io.values()}
            kept = handed_over | {s["path"] for s in shared}
            temp = await loop.run_in_executor(None, temp_files.save, pids, partial, kept)
            written = written_files.collect(pids, kept)
            steps["files"] = time.monotonic()
            criu_driver.fix_files_image(partial)
            aliases = shared_files.deleted_aliases(pids)
            remaps = [{"remap": remap, "live": aliases[orig]}
                      for remap, orig in criu_driver.link_remaps(partial) if orig in aliases]
            files = store.file_sizes(partial)
            m = manifest_mod.Manifest(
                comp_id=self.comp_id, tree_id=cfg.tree_id, program=cfg.program,
                argv=list(cfg.argv or (cfg.manifest.argv if cfg.manifest else [])),
                host=hostname(), generation=generation, time=time.time(),
                root_pid=self.tree.root_pid, pids=sorted(p.pid for p in procs),
                peers=len(parked), shim_pids=sorted(parked), shared_files=shared,
                written_files=written, sockets=self.net.table(partial), link_remaps=remaps,
                temp_files=temp,
                agent_socket=self.shims.name,
                num_trees=barrier.num_trees, stdio=io, external=external,
                criu_version=criu_driver.version(), files=files)
            m.write(partial)
            steps["manifest"] = time.monotonic()
        except BaseException:
            store.discard(partial)
            if not stop:
                await self.shims.listen()
            raise
        if not stop:
            await self.shims.listen()
        duration = time.monotonic() - started
        log.info("generation %d: dumped %d bytes in %.3f s", generation, m.total_bytes, duration)
        log.debug("dump steps (ms): %s", _step_times(started, steps))
        # made durable and published once the coordinator says every tree
        # dumped (commit)
        self._commit.clear()
        self._to_publish = (generation, partial, final)
        self._send(messages.make("progress", generation=generation, written=m.total_bytes,
                                 expected=m.total_bytes))
        return {"path": str(final), "host": hostname(), "tree_id": cfg.tree_id,
                "program": cfg.program, "bytes": m.total_bytes, "duration": duration,
                "processes": len(parked)}

    async def _report_progress(self, generation: int, partial: Path, procs) -> None:
        """While CRIU writes: bytes in the partial directory, of about the
        tree's resident memory, every quarter of a second."""
        expected = 0
        for proc in procs:
            try:
                expected += proc.memory_info().rss
            except psutil.Error:
                pass
        while True:
            written = store.directory_bytes(partial)
            self._send(messages.make("progress", generation=generation, written=written,
                                     expected=max(expected, written)))
            await asyncio.sleep(PROGRESS_EVERY)
