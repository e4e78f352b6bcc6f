"""The agent's protocol machine: what one tree does in a round (sans-IO).

No sockets, no CRIU, no clock.  The asyncio runner (runner.py) feeds in the
coordinator's messages and what became of the work it carried out, and
carries out the actions that come back; it decides nothing.  Every fact of
a tree's round lives here: the state, the images waiting for the
coordinator's commit, the processes expected back, the generation the
processes belong to, the last published generation told to a coordinator
we rejoin.

At each barrier the machine names one piece of work (DoWork with a Step):
ask the shims to stop or to elect, park and drain the sockets, dump, refill
and give back, release.  The runner reports how it went (work_done), and
the machine answers with the "reached" message to send.  A dump leaves
images waiting for the commit: published when every tree dumped, dropped
otherwise, and dropped too when the coordinator goes away or never says.
"""
from __future__ import annotations

import enum
from dataclasses import replace
from typing import Any

from dmtcp_py.agent import records
from dmtcp_py.frozen import field, mutable_record, record
from dmtcp_py.listing import signal_name
from dmtcp_py.protocol import messages
from dmtcp_py.protocol.states import State, TransitionError, check_transition

COMMIT_TIMEOUT = 30.0  # a stopped tree's agent waits this long for the commit
# an agent whose tree ended waits this long for the end of a round it
# published in (the other trees' publication), to settle what it moved aside
ROUND_END_TIMEOUT = 60.0
TRAFFIC_EVERY = 5.0    # seconds between samples of the tree's traffic and load (--graph, --rebalance)


class Work(enum.Enum):
    PRECOPY = "precopy"        # the running tree's memory pre-dumped (images.precopy)
    SUSPEND = "suspend"        # every process stops its threads
    ELECT = "elect"            # every process claims its sockets (F_SETOWN)
    DRAIN = "drain"            # sockets parked with the agent, connections drained
    DUMP = "dump"              # CRIU dumps the tree; images to a partial directory
    REFILL = "refill"          # processes back; drained bytes and sockets back
    RESUME = "resume"          # threads released


WORK_AT = {
    State.PRECOPIED: Work.PRECOPY,
    State.SUSPENDED: Work.SUSPEND,
    State.FD_LEADER_ELECTION: Work.ELECT,
    State.DRAINED: Work.DRAIN,
    State.CHECKPOINTED: Work.DUMP,
    State.REFILLED: Work.REFILL,
    State.RUNNING: Work.RESUME,
}


@record
class Step:
    """One barrier's work, with everything the runner needs to carry it out."""
    target: State
    work: Work
    generation: int
    comp_id: str = ""                           # DRAIN: names the drain cookies
    stop: bool = False                          # DUMP: the tree ends with the dump
    num_trees: int = 1                          # DUMP: written into the manifest
    failed_conns: frozenset[str] = frozenset()  # REFILL: connections not to refill
    expect_pids: frozenset[int] = frozenset()   # REFILL: processes that come back
    resume_arg: int = 0                         # RESUME: what the processes are told
    # a migration round: at DUMP, this tree moves (GO: dumped and kept
    # frozen) or stays (STAY: not dumped; these connections are made again
    # toward the moved trees); at REFILL, rollback: it failed, all as it was
    move: messages.Move | None = None
    reconnect: frozenset[str] = frozenset()
    rollback: bool = False
    hold: bool = False    # STAY: run on with the connections held, if they can be
    swap: bool = False    # a held tree stopped again: DRAIN and DUMP swap them
    # RESUME straight after the dump (a socketless round, no REFILL): the
    # processes come back first
    bring_back: bool = False
    # DUMP: the processes run again as soon as CRIU lets them go, not at
    # the round's RESUME (_lets_go)
    let_go: bool = False


@record
class WorkResult:
    """What became of a Step."""
    error: str | None = None
    image: messages.ImageInfo | None = None     # DUMP done
    pending: Any = None                         # DUMP done: the images, for Publish/Discard
    parked: frozenset[int] = frozenset()        # DUMP: processes detached (even if it failed)
    external: tuple[str, ...] = ()              # DRAIN: connections leading outside
    failed_conns: tuple[str, ...] = ()          # DRAIN: connections not drained
    held: bool = False                          # DUMP, STAY: connections held (holding.py)
    # SUSPEND: the tree has sockets to hand over, or an inotify instance whose
    # reader the election names (False: the round may skip both)
    sockets: bool = True


# ---- actions the runner carries out -----------------------------------------

@record
class Send:
    message: messages.Message


@record
class DoWork:
    """Carry out the step, then call work_done with its result."""
    step: Step


@record
class Publish:
    """Make the images durable and give them their name (then published())."""
    generation: int
    pending: Any


@record
class Discard:
    """Delete images that will never be a generation."""
    generation: int
    pending: Any


@record
class SettleExpired:
    """The round of `generation` is over, every image published (ok) or
    not: the previous generations our publication moved aside are deleted
    (ok), or given their names back (a failed round: they may be the last
    good checkpoint)."""
    generation: int
    ok: bool


@record
class TellShims:
    """One record to every process of the tree."""
    record: int
    arg: int


@record
class GiveBack:
    """A round ends without its coordinator: wait for these processes, hand
    every parked socket back, release the threads."""
    expect_pids: frozenset[int]
    resume_arg: int


@record
class WaitForCommit:
    """The tree ended with images waiting: wait this long for the commit
    (then commit_timed_out)."""
    seconds: float


@record
class WaitForRoundEnd:
    """The tree ended after publishing: wait at most this long while a
    round we published in is not over (unsettled) and the coordinator is
    linked."""
    seconds: float


@record
class KillTree:
    pass


@record
class DropMoved:
    """The tree moved away: delete the image it was moved with."""


@record
class AbandonRestart:
    """A restart that cannot finish: kill the restored tree (or the one
    CRIU is restoring, once it is there); the agent then ends with `why`."""
    why: str


@record
class ToNetwork:
    """A message for the connections' side of the agent (network.py)."""
    message: messages.Message


@record
class ReportPeers:
    """Tell the coordinator about the tree's processes now."""


@record
class Rejoin:
    """The coordinator went away: try its address again until one answers."""


@record
class SampleTraffic:
    """Tell the coordinator the tree's TCP connections and their byte
    counters now (messages.Traffic), for its traffic matrix (--graph)."""


@record
class SampleLoad:
    """Tell the coordinator how busy the CPUs the tree may use were since
    the last sample, and how much of them it had (messages.Load), for
    --rebalance.  Sampled with the traffic: the same cadence."""


@record
class DropLink:
    """The coordinator has been silent too long: close the link (what
    follows is as if it had closed it: coordinator_lost)."""
    why: str


@record
class ServeReplicas:
    """Take copies of other hosts' images (then replica_service)."""


@record
class CopyImage:
    """Copy a published image to each target (then replica_copied, once
    per target)."""
    generation: int
    path: str
    targets: tuple[messages.ReplicaTarget, ...]


@record
class Pending:
    """Images dumped in a round, waiting for the coordinator's word."""
    generation: int
    handle: Any


# ---- the machine -----------------------------------------------------------------

@mutable_record
class Identity:
    """Who this tree is, as the coordinator is told in hello."""
    tree_id: str
    program: str
    # a restart: the computation, generation and tree count of the image
    restart_comp_id: str | None = None
    restart_generation: int = 0
    restart_trees: int = 1
    restart_image: messages.ImageInfo | None = None  # where it restores from
    restart_claim: int = 0  # its dmtcp-restart's claim (coordinator/claims.py), 0: none
    precopy: bool = False  # its checkpoints begin with a pre-copy (images.precopy)


# (a mutable record: @dataclass wrote its methods for these ~30 fields at
# every import, ~2 ms of each agent's start)
@mutable_record
class AgentMachine:
    identity: Identity
    state: State = State.RUNNING            # (all three set by __post_init__)
    comp_id: str = ""
    # False from SUSPENDED until RUNNING (and during a restart): a process
    # that says hello while still suspended outside that window is owed a
    # RESUME at once
    running: bool = True
    pending: Pending | None = None           # dumped, waiting for the commit
    stopped_by_checkpoint: bool = False      # the tree ended with a dump (--stop)
    # the processes expected back at REFILLED: those that detached for the
    # dump (also when it failed), or those of a restored image
    expect_pids: frozenset[int] = frozenset()
    # what the processes are told when released: the generation they belong
    # to, and whether this release ends a restart (their hooks differ)
    generation: int = 0
    restored_pending: bool = False
    # the last generation whose images all exist, told to a coordinator we
    # rejoin
    published_generation: int = 0
    linked: bool = False                     # a coordinator answers
    ever_linked: bool = False                # (so the next hello is a rejoin)
    # heartbeats, as the coordinator's welcome asks (0: none)
    heartbeat: float = 0.0
    heartbeat_timeout: float = 0.0
    next_beat: float = 0.0
    # the next sample of the tree's traffic, while it runs (TRAFFIC_EVERY)
    next_traffic: float = 0.0
    # the coordinator restarts lost trees: our processes end if we do
    die_with_agent: bool = False
    kill_requested: bool = False             # the coordinator said Kill
    # a dump that ends the tree (--stop) is under way: CRIU SIGKILLs its
    # processes, which is no failure
    dumping_to_stop: bool = False
    # images every tree dumped, made durable once the tree runs again
    # (_commit says why not at once)
    publish_after_resume: Publish | None = None
    # the RESUME step is under way: a process that connects running now
    # would never be released if it were suspended (the RESUME went out)
    resuming: bool = False
    # this round's tree has no socket to hand over, nor an inotify instance
    # (as it told at SUSPENDED, or restored): the coordinator may skip the
    # election, the drain and the refill
    socketless: bool = False
    # why a restart was given up before its release (its coordinator went
    # away): the agent's one-line error once its tree is gone
    abandoned: str | None = None
    # the first process of the tree a failure signal killed (its parent or
    # its subreaper saw it), told with the tree's end
    killed: messages.KilledProcess | None = None
    # where we take replicas (--replicas), once we listen
    replica_service: messages.ReplicaService | None = None
    # a migration moved the tree to this host: its copy here ended, no failure
    moved_to: str = ""
    # the images of the checkpoint that stopped the tree were dropped: the
    # agent's one-line warning once the tree is gone
    stop_lost: str | None = None
    # generations we published whose round is not over (GenerationDone):
    # what our publication moved aside is settled at its end (SettleExpired)
    unsettled: set[int] = field(default_factory=set)
    tree_ended: bool = False                 # (a barrier now is refused)

    def __post_init__(self) -> None:
        restarting = self.identity.restart_comp_id is not None
        self.state = State.RESTARTING if restarting else State.RUNNING
        self.running = not restarting
        self.restored_pending = restarting
        if restarting:
            self.comp_id = self.identity.restart_comp_id
            self.generation = self.published_generation = self.identity.restart_generation

    # ---- the coordinator link ---------------------------------------------------

    def hello(self, token: str, host: str, pid: int) -> messages.Hello:
        """The first message to a coordinator: a rejoin once we had one."""
        ident = self.identity
        base = dict(role=messages.Role.AGENT, token=token, host=host, pid=pid,
                    program=ident.program, tree_id=ident.tree_id, precopy=ident.precopy)
        if self.ever_linked:
            # the coordinator we had died: this one takes us back
            return messages.Hello(**base, rejoin=True, comp_id=self.comp_id,
                                  generation=self.published_generation)
        if ident.restart_comp_id is not None:
            return messages.Hello(**base, restart=True, comp_id=ident.restart_comp_id,
                                  generation=ident.restart_generation,
                                  num_trees=max(1, ident.restart_trees),
                                  image=ident.restart_image, claim=ident.restart_claim)
        return messages.Hello(**base)

    def welcomed(self, welcome: messages.Welcome) -> list:
        self.comp_id = welcome.comp_id
        self.linked = True
        rejoined = self.ever_linked
        self.ever_linked = True
        self.heartbeat, self.heartbeat_timeout = welcome.heartbeat, welcome.heartbeat_timeout
        self.next_beat = 0.0  # the first tick beats
        actions: list = []
        if welcome.auto_restart != self.die_with_agent:
            self.die_with_agent = welcome.auto_restart
            actions.append(TellShims(records.FATE, int(self.die_with_agent)))
        if welcome.replicas > 0:
            # (a coordinator we rejoin hears again where we listen)
            actions.append(Send(self.replica_service) if self.replica_service
                           else ServeReplicas())
        # a coordinator we rejoin has not heard of our processes yet
        return actions + ([ReportPeers()] if rejoined else [])

    def tick(self, now: float, last_heard: float) -> list:
        """Called every fraction of a heartbeat: beat when one is due; a
        coordinator not heard from (any message) for the timeout is lost."""
        if not self.linked:
            return []
        actions: list = []
        if self.running and now >= self.next_traffic:
            self.next_traffic = now + TRAFFIC_EVERY
            actions += [SampleTraffic(), SampleLoad()]
        if self.heartbeat <= 0:
            return actions
        if self.heartbeat_timeout > 0 and now - last_heard > self.heartbeat_timeout:
            return [DropLink(f"the coordinator was silent for {now - last_heard:.1f} s")]
        if now < self.next_beat:
            return actions
        self.next_beat = now + self.heartbeat
        return actions + [Send(messages.Heartbeat())]

    def coordinator_lost(self) -> list:
        """The link broke.  A round under way ends here, so that the program
        never stays stopped: images dumped for it are dropped, sockets and
        threads given back.  Then the coordinator's address is tried again.
        A restart not yet released is given up instead: it cannot finish
        without its coordinator (its connections meet through it, its
        release waits for every tree), and a half-restored tree must not
        run on; the images, never written to by a restart, restart again."""
        self.linked = False
        # no word will come of those rounds' ends: what they moved aside
        # waits for a later round's (or gets its name back as we end)
        self.unsettled.clear()
        if self.restored_pending and not self.kill_requested:  # (a Kill ends it anyway)
            self.abandoned = (f"the coordinator went away during the restart of generation "
                              f"{self.generation}: the restored tree is killed; its images "
                              "are intact, restart them again")
            return self._drop_pending() + [AbandonRestart(self.abandoned)]
        actions: list = []
        if self.stopped_by_checkpoint:
            # CRIU ended the tree after its dump: nothing to give back.  It
            # lives on in its images once their commit came; images still
            # waiting for it are dropped, and the program with them.  (The
            # coordinator of --exit-after-ckpt goes right after the round.)
            actions += self._drop_pending()
        elif not self.running:
            actions += self._drop_pending()
            self.state = State.RUNNING
            self.running = True
            self.stopped_by_checkpoint = False
            actions.append(GiveBack(self.expect_pids, self.resume_arg()))
            self.restored_pending = False  # that release told them
        # (every tree had dumped: the images are good without their coordinator)
        return actions + self._publish_deferred() + [Rejoin()]

    # ---- messages from the coordinator ------------------------------------------------

    def on_message(self, msg: messages.Message) -> list:
        if isinstance(msg, messages.Barrier):
            return self._barrier(msg)
        if isinstance(msg, messages.Commit):
            return self._commit(msg)
        if isinstance(msg, messages.GenerationDone):
            if msg.ok:
                self.published_generation = max(self.published_generation, msg.generation)
            self.unsettled = {g for g in self.unsettled if g > msg.generation}
            arg = msg.generation | (0 if msg.ok else records.DONE_FAILED)
            return [TellShims(records.DONE, arg), SettleExpired(msg.generation, msg.ok)]
        if isinstance(msg, (messages.Matched, messages.Found, messages.Relay,
                            messages.CancelMove)):
            return [ToNetwork(msg)]
        if isinstance(msg, messages.Kill):
            self.kill_requested = True
            if msg.moved_to:
                self.moved_to = msg.moved_to
                return [KillTree(), DropMoved()]
            return [KillTree()] + self._publish_deferred()  # (committed: good images)
        if isinstance(msg, messages.Replicate):
            return [CopyImage(msg.generation, msg.path, msg.targets)] if msg.targets else []
        return []

    def replica_service_started(self, address: str, port: int) -> list:
        self.replica_service = messages.ReplicaService(address=address, port=port)
        return [Send(self.replica_service)] if self.linked else []

    def replica_copied(self, generation: int, host: str, path: str = "",
                       error: str | None = None) -> list:
        if not self.linked:
            return []  # the coordinator that asked is gone; a new one asks again
        return [Send(messages.Replicated(generation=generation, host=host, path=path,
                                         ok=error is None, error=error))]

    def _barrier(self, msg: messages.Barrier) -> list:
        if self.tree_ended:  # (waiting for a round's end: WaitForRoundEnd)
            return [Send(messages.Reached(state=msg.state, ok=False, error="its tree has ended"))]
        try:
            check_transition(self.state, msg.state, self.socketless)
        except TransitionError as exc:
            return [Send(messages.Reached(state=msg.state, ok=False, error=str(exc)))]
        work = WORK_AT[msg.state]
        if work is Work.SUSPEND:
            self.running = False
            self.resuming = False
            self.socketless = False
        if work is Work.RESUME:
            self.generation = msg.generation
            self.resuming = True
        if work is Work.DUMP:
            self.dumping_to_stop = msg.stop
        step = Step(msg.state, work, msg.generation, comp_id=self.comp_id, stop=msg.stop,
                    num_trees=msg.num_trees, failed_conns=frozenset(msg.failed_conns),
                    expect_pids=self.expect_pids,
                    resume_arg=self.resume_arg() if work is Work.RESUME else 0,
                    move=msg.move if work is Work.DUMP else None,
                    reconnect=frozenset(msg.reconnect), rollback=msg.rollback,
                    hold=msg.hold, swap=msg.swap,
                    bring_back=work is Work.RESUME and self.state is State.CHECKPOINTED,
                    let_go=work is Work.DUMP and self._lets_go(msg))
        if work is Work.RESUME:
            self.restored_pending = False  # this release tells them
        return [DoWork(step)]

    def _lets_go(self, msg: messages.Barrier) -> bool:
        """Whether this dump's processes may run again as soon as CRIU
        lets them go.  The round's RESUME waits for every tree's dump, so
        that no tree runs on while another's image is still being taken
        (it could reach that one through a file, a pipe, shared memory),
        and for the refill of the drained connections.  A tree alone in a
        round without sockets waits for nothing: a checkpoint that goes on
        (not --stop), and no migration, whose image is restored elsewhere
        at once."""
        return (self.socketless and msg.num_trees == 1 and not msg.stop
                and msg.move is None and not msg.swap)

    def work_done(self, step: Step, result: WorkResult) -> list:
        """A barrier's work is over: the state is reached (also when the
        work failed: the checkpoint fails, the tree goes on)."""
        self.state = step.target
        actions: list = []
        if step.work is Work.SUSPEND:
            self.socketless = result.error is None and not result.sockets
        if step.work is Work.DUMP and result.error is None and self.killed is not None:
            # the image would hold a program on its way to failing (its
            # parent reaped the killed process, and aborts): every restart
            # from it would fail the same way
            k = self.killed
            actions.append(Discard(step.generation, result.pending))
            result = replace(result, pending=None, image=None, error=(
                f"its process {k.name} (pid {k.pid}) was killed by {signal_name(k.signal)} "
                "before this checkpoint: a tree that lost a process is not checkpointed"))
        if step.work is Work.DUMP:
            self.expect_pids = result.parked
            self.dumping_to_stop = step.stop and result.error is None
            # (a migration's dump is no generation: nothing waits for a commit)
            if result.error is None and step.move is None:
                self.pending = Pending(step.generation, result.pending)
                self.stopped_by_checkpoint = step.stop
        if step.work is Work.RESUME:
            self.running = True
            self.resuming = False
            actions += self._publish_deferred()
        actions.append(Send(messages.Reached(
            state=step.target, ok=result.error is None, error=result.error,
            image=result.image if step.work is Work.DUMP else None,
            external=result.external, failed_conns=result.failed_conns, held=result.held,
            sockets=not self.socketless if step.work is Work.SUSPEND else True)))
        if step.work is Work.RESUME and step.resume_arg & records.RESUME_RESTORED:
            # the restored processes are new to the coordinator: listed at
            # once (`dmtcp-command -s` said NUM_PEERS=0 for ~65 ms after the
            # release, until the report's burst delay was over)
            actions.append(ReportPeers())
        return actions

    def _commit(self, msg: messages.Commit) -> list:
        """Every tree dumped (publish our images) or one failed (drop them),
        so that a failed checkpoint never replaces a good one."""
        if self.pending is None or msg.generation != self.pending.generation:
            return []
        if not msg.ok:
            return self._drop_pending()
        pending, self.pending = self.pending, None
        publish = Publish(pending.generation, pending.handle)
        if self.running or self.stopped_by_checkpoint:
            return [publish]
        # The commit comes with the REFILLED barrier, while the program is
        # still stopped: hashing and writing back its images then took the
        # CPU (and the GIL) from the refill and the resume, and lengthened
        # the program's stop by more than they take (bench_stop.py).
        self.publish_after_resume = publish
        return []

    def _publish_deferred(self) -> list:
        publish, self.publish_after_resume = self.publish_after_resume, None
        return [publish] if publish is not None else []

    def published(self, generation: int, error: str | None = None) -> list:
        """Publish is over: tell the coordinator."""
        if error is None:
            self.unsettled.add(generation)
        return [Send(messages.Published(generation=generation, ok=error is None, error=error))]

    def ending(self) -> list:
        """The tree ended and our images are published: the end of a round
        we published in is waited for, so that what the publication moved
        aside is deleted (or, the round failed, kept), not left to guess."""
        return [WaitForRoundEnd(ROUND_END_TIMEOUT)] if self.linked and self.unsettled else []

    # ---- the tree ----------------------------------------------------------------------

    def restored(self, shim_pids: frozenset[int] = frozenset(),
                 error: str | None = None, sockets: bool = True) -> list:
        """CRIU restored the tree (or could not): the restart joins the
        protocol at CHECKPOINTED.  sockets: the tree has sockets to give
        back (else the restart may go on to RUNNING without a REFILL)."""
        if error is None and self.kill_requested:
            return [KillTree()]  # the Kill came while CRIU restored: nothing to kill then
        if error is None and self.abandoned:
            return [AbandonRestart(self.abandoned)]  # (so did the loss of the coordinator)
        if error is None:
            self.state = State.CHECKPOINTED
            self.expect_pids = shim_pids
            self.socketless = not sockets
        return [Send(messages.Reached(state=State.CHECKPOINTED, ok=error is None, error=error,
                                      sockets=not self.socketless))]

    def tree_exited(self, code: int | None) -> list:
        """The tree's root ended (code: its exit code, -N for signal N):
        the coordinator hears how, and of a process killed before it
        (process_killed), which tells an exit from a failure.
        Images still waiting for the commit (a tree stopped by its
        checkpoint) wait for it a while."""
        self.tree_ended = True
        actions: list = []
        if self.linked:
            actions.append(Send(messages.TreeEnded(
                code=code if code is not None else 0, requested=self.kill_requested,
                checkpointed=self.stopped_by_checkpoint, killed=self.killed)))
        if self.pending is None:
            return actions
        if not self.linked:
            return actions + self._drop_pending()
        return actions + [WaitForCommit(COMMIT_TIMEOUT)]

    def commit_timed_out(self) -> list:
        return self._drop_pending()

    def exit_code(self, tree_status: int | None) -> int:
        """The agent's exit code: the program's, or 0 for a tree that a
        checkpoint stopped (it did not fail; it is in its image)."""
        if self.stopped_by_checkpoint or self.moved_to or tree_status is None:
            return 0
        return tree_status

    def process_killed(self, pid: int, signum: int, core: bool = False, name: str = "?") -> list:
        """A process of the tree was reaped killed by signum (core: it
        dumped core).  The first one killed by a failure signal is kept:
        whether the tree is lost depends on how its program ends."""
        if self.dumping_to_stop or self.stopped_by_checkpoint or self.moved_to:
            return []  # CRIU ended the tree after its last dump, or it moved away
        if self.killed is None and pid > 0 and records.failure_signal(signum, core):
            self.killed = messages.KilledProcess(pid=int(pid), signal=int(signum),
                                                 name=name or "?", core=bool(core))
        return []

    def ckpt_requested(self) -> list:
        """A process called dmtcp_checkpoint()."""
        return [Send(messages.CkptRequest())] if self.linked else []

    def owes_suspend(self, suspended: bool) -> bool:
        """A process connected running while its tree is in a round (it was
        started or exec'd just as the round began, after the SUSPEND went
        out): it must stop before it is asked anything else, or its
        sockets would be parked under a running program."""
        return not suspended and not self.running and not self.resuming

    def owes_resume(self, suspended: bool) -> bool:
        """A process connected (again) and says whether it is suspended."""
        return suspended and self.running

    def resume_arg(self) -> int:
        """RESUME's argument: the generation, | RESUME_RESTORED while the
        release that ends a restart is still to come (a late process after
        it is told the same generation, as after a checkpoint)."""
        return self.generation | (records.RESUME_RESTORED if self.restored_pending else 0)

    def _drop_pending(self) -> list:
        pending, self.pending = self.pending, None
        if pending is None:
            return []
        self._stop_lost(pending.generation)
        return [Discard(pending.generation, pending.handle)]

    def _stop_lost(self, generation: int) -> None:
        """A tree that its checkpoint stopped was in those images only: the
        agent's exit no longer says that it ended well, and says why."""
        if self.stopped_by_checkpoint:
            self.stopped_by_checkpoint = False
            self.stop_lost = (f"the checkpoint (generation {generation}) that stopped the "
                              "program was not committed, and the program ended with it; "
                              "any earlier generation is intact")
