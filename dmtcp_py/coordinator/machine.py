"""The coordinator's protocol machine: barriers, counts, restart rounds.

No I/O and no clock: the asyncio server feeds events in (with the current
time as a number) and carries out the actions that come back.  This keeps
every decision testable with many simulated agents in memory.
"""
from __future__ import annotations

import dataclasses
import enum

from dmtcp_py.coordinator import migration, rebalance, recovery, replication
from dmtcp_py.coordinator.claims import Claim, Claims
from dmtcp_py.coordinator.interval import AutoInterval
from dmtcp_py.coordinator.launching import JOIN_WAIT, CheckpointAsk, Launches
from dmtcp_py.coordinator.nameservice import NameService
from dmtcp_py.coordinator.recovery import Failure, Phase, Recovery, RecoveryPolicy
from dmtcp_py.coordinator.traffic import TrafficMatrix
from dmtcp_py.frozen import field, mutable_record, record
from dmtcp_py.protocol.messages import (
    Barrier,
    CancelMove,
    CkptRequest,
    Commit,
    Copy,
    GenerationDone,
    Heartbeat,
    Hello,
    ImageInfo,
    Kill,
    Load,
    Lookup,
    Message,
    Move,
    Peers,
    Traffic,
    ProcInfo,
    Progress,
    Publish,
    Published,
    Reached,
    Refused,
    Relay,
    ReplicaService,
    ReplicaTarget,
    Replicate,
    Replicated,
    Reply,
    Sockets,
    TreeEnded,
    Welcome,
)
from dmtcp_py.protocol.states import State, first_state, next_state

# ---- actions the server carries out -------------------------------------

@record
class SendAgent:
    agent_id: int
    message: Message


@record
class ReplyClient:
    client_id: int
    message: Message  # a Reply, or a Progress to a client that asked for it


@record
class GenerationComplete:
    """Every tree's images of this generation are published: write the
    restart script."""
    generation: int
    images: tuple[ImageInfo, ...]


@record
class Notice:
    text: str


@record
class CloseAgent:
    """Close an agent's connection (it went silent); agent_left follows."""
    agent_id: int


@record
class RestartGeneration:
    """Recovery: run the restart of these images (the way the restart
    script does), old host -> new host as placed; when the command ends,
    restart_command_ended(serial, ...) says so."""
    generation: int
    images: tuple[ImageInfo, ...]
    placement: tuple[tuple[str, str], ...]
    attempt: int
    lost_hosts: tuple[str, ...] = ()   # no image is fetched from these
    # which restart command this is, over every recovery (attempts start at
    # 1 in each): the previous recovery's command, ending with its lost
    # tree, must not pass for this one's failing
    serial: int = 0


@record
class MoveTrees:
    """Migration: restart these images (the moving trees' fresh dumps) the
    way the restart script does, old host -> new host; when the command
    ends, migration_command_ended(serial, ...) says so."""
    generation: int
    images: tuple[ImageInfo, ...]
    placement: tuple[tuple[str, str], ...]
    serial: int
    lost_hosts: tuple[str, ...] = ()


@record
class Shutdown:
    reason: str


# ---- state ----------------------------------------------------------------

@mutable_record
class Agent:
    agent_id: int
    host: str
    pid: int
    program: str
    tree_id: str
    state: State
    peers: int = 0
    procs: tuple[ProcInfo, ...] = ()
    external: tuple[str, ...] = ()  # connections leading outside, at the last drain
    last_heard: float = 0.0         # any message counts as a heartbeat
    ended: TreeEnded | None = None  # how its tree ended, as its agent said
    dismissed: bool = False         # we told it to end (Kill): its going is no failure
    silent: str | None = None       # dropped for silence: why
    replica_service: ReplicaTarget | None = None  # where it takes copies (--replicas)
    precopy: bool = False           # its tree is pre-copied as a checkpoint begins

    def label(self) -> str:
        return f"{self.program}@{self.host} (agent pid {self.pid})"


class RoundKind(enum.Enum):
    CHECKPOINT = "checkpoint"
    RESTART = "restart"
    MIGRATE = "migrate"

    @property
    def noun(self) -> str:
        return "migration" if self is RoundKind.MIGRATE else self.value


@mutable_record
class Migration:
    """What a migration round knows besides its barriers."""
    moving: dict[str, int]              # tree id -> the agent of its old copy
    placement: dict[str, str]           # old host -> new host
    serial: int
    arrived: dict[str, int] = field(default_factory=dict)  # tree id -> its new copy's agent
    reconnect: dict[int, set[str]] = field(default_factory=dict)  # staying agent -> conns
    started: bool = False               # the moving trees' restart runs
    aborted: bool = False               # it failed: everything goes back as it was
    dumped_at: float | None = None      # every moving tree dumped
    # bystanders: staying trees that share no connection with a moving
    # one, released on their own once drained -> the state each waits on
    early: dict[int, State] = field(default_factory=dict)
    # staying trees whose connections to moving ones are held (the agent's
    # holding.py): released like bystanders, stopped again once every new
    # copy is there, to swap them: the state each waits on in that swap
    held: set[int] = field(default_factory=set)
    swap: dict[int, State] = field(default_factory=dict)
    swapping: bool = False


# where the agents of a round say whether their trees have sockets (Reached's
# `sockets`): a checkpoint's at SUSPENDED, a restart's once restored.  When
# none has, the round skips the barriers only sockets need (states.py).
_SAYS_SOCKETS = {RoundKind.CHECKPOINT: State.SUSPENDED, RoundKind.RESTART: State.CHECKPOINTED}


@mutable_record
class Round:
    """One checkpoint, or one restart, going through the barriers."""
    kind: RoundKind
    generation: int
    state: State  # the state whose barrier we are waiting on
    started: float
    participants: set[int] = field(default_factory=set)
    reached: set[int] = field(default_factory=set)
    expected: int = 0  # restart: trees that must join before the first barrier
    stop: bool = False
    waiters: list[int] = field(default_factory=list)
    watchers: list[int] = field(default_factory=list)  # waiters that asked for progress
    progress: dict[int, tuple[int, int]] = field(default_factory=dict)  # agent -> written, expected
    errors: list[str] = field(default_factory=list)
    images: dict[int, ImageInfo] = field(default_factory=dict)
    # A checkpoint's trees resume (RUNNING) once every tree is dumped; each
    # agent then makes its images durable and says "published".  The
    # generation is complete when both have happened.
    published: set[int] = field(default_factory=set)
    resumed: bool = False
    # when the program was stopped (SUSPENDED went out: `started`, unless
    # the round began with a pre-copy) and when it ran again
    suspended_at: float | None = None
    resumed_at: float | None = None
    commit_ok: bool = False  # every tree dumped: the agents publish
    failed_conns: set[str] = field(default_factory=set)  # not drained at one end
    sockets: bool = False     # a tree has sockets to hand over (_SAYS_SOCKETS)
    migration: Migration | None = None  # RoundKind.MIGRATE
    trees: set[str] = field(default_factory=set)  # restart: the trees that joined

    @property
    def socketless(self) -> bool:
        """No tree had sockets to hand over: once every agent said so
        (_SAYS_SOCKETS), the round skips the election, the drain and the
        refill."""
        return self.kind in _SAYS_SOCKETS and not self.sockets


@mutable_record
class CalledOff:
    """A restart that was called off before all of its trees had joined.
    Its other trees are still on their way (agents of the same dmtcp-restart
    or restart script); each must be turned away, not taken for the first
    tree of a new restart, whose round would wait for ever for the trees
    that already failed."""
    comp_id: str
    generation: int
    trees: frozenset[str]   # the trees that had joined
    late: int               # trees that had not joined yet
    reason: str
    at: float

    def turns_away(self, hello: Hello, now: float, within: float) -> bool:
        return (self.late > 0 and now - self.at <= within
                and (hello.comp_id, hello.generation) == (self.comp_id, self.generation)
                and hello.tree_id not in self.trees)


class CoordinatorMachine:
    def __init__(self, comp_id: str, *, exit_on_last: bool = False,
                 exit_after_ckpt: bool = False, interval: float = 0.0,
                 interval_auto: bool = False,
                 now: float = 0.0, ckptdir: str | None = None, keep: int | None = None,
                 policy: RecoveryPolicy = RecoveryPolicy(),
                 rebalance_after: float = 0.0) -> None:
        self.comp_id = comp_id
        self.ckptdir = ckptdir  # offered to trees that did not choose their own
        self.keep = keep        # likewise, --keep (previous generations kept)
        self.exit_on_last = exit_on_last
        self.exit_after_ckpt = exit_after_ckpt
        self.agents: dict[int, Agent] = {}
        self.generation = 0
        self.round: Round | None = None
        self.called_off: CalledOff | None = None  # the last restart, if it was
        self.last_checkpoint: dict | None = None
        self.last_migration: dict | None = None
        self._ever_had_agents = False
        self.names = NameService()
        self.traffic = TrafficMatrix()  # who talks to whom (--graph)
        # --interval auto: the interval chosen from the checkpoints' cost and
        # the failures seen (interval.py).  Measured in either mode, so that
        # a later `i auto` starts from what is already known.
        self.auto_interval = AutoInterval()
        self.interval_auto = interval_auto
        if interval_auto:
            interval = self.auto_interval.choose(now)
        self.interval = interval
        self._next_interval = now + interval if interval > 0 else None
        self.policy = policy
        self._next_beat = now
        # the newest generation whose every tree's image is known (written
        # by a checkpoint, or restarted from): what a recovery restarts
        self.complete: GenerationComplete | None = None
        # the one before it, whose images stay beside the newer ones
        # (.gen-N): a recovery falls back to it when a lost host took the
        # newest generation of a tree before any copy of it was made
        self.previous: GenerationComplete | None = None
        self.recovery: Recovery | None = None
        self.restarts = 0                   # recoveries that ended RUNNING
        self.time_lost = 0.0                # seconds from failures to running again
        self.last_failure: Failure | None = None
        self.last_exit: dict | None = None  # a program that ended by itself
        self.gave_up: str | None = None     # why auto-restart stopped trying
        self._silent_hosts: set[str] = set()
        # --replicas: generation -> tree_id -> the copies its agent made
        self.copies: dict[int, dict[str, list[Copy]]] = {}
        self._restart_serial = 0
        # --rebalance: trees a host slows down move to the least loaded
        # host of --hosts (rebalance.py); the last one, for the status
        self.rebalancer = (rebalance.Rebalancer(policy.hosts, rebalance_after)
                           if rebalance_after > 0 else None)
        self.last_rebalance: dict | None = None
        self._rebalance_serial = 0  # the migration a rebalance started
        self._clock = now           # the latest tick's time (for the status)
        # trees dmtcp-launch started whose agents have not joined yet, and the
        # checkpoints asked for meanwhile, which wait for them (launching.py)
        self.launches = Launches()
        self._waiting: list[CheckpointAsk] = []
        # launches that said hello during a round: their program starts
        # once it is over, when they are welcomed (client connection ids)
        self._held: list[int] = []
        # restarts claimed before their agents join (claims.py)
        self.claims = Claims()

    # ---- agents ----------------------------------------------------------

    def agent_joined(self, agent_id: int, hello: Hello, now: float) -> list:
        """hello was checked by the server (token, version, role)."""
        agent = Agent(agent_id, hello.host, hello.pid, hello.program, hello.tree_id,
                      State.RESTARTING if hello.restart else State.RUNNING, last_heard=now,
                      precopy=hello.precopy)
        actions: list = []
        if hello.restart:
            refusal = self._admit_restart(agent, hello, now)
            if refusal:
                return [SendAgent(agent_id, Refused(error=refusal))]
        elif hello.rejoin:
            refusal = self._admit_rejoin(hello)
            if refusal:
                return [SendAgent(agent_id, Refused(error=refusal))]
        self.agents[agent_id] = agent
        self._ever_had_agents = True
        if hello.restart and hello.image is not None and self.round is not None \
                and self.round.migration is None:
            self.round.images[agent_id] = hello.image
        pol = self.policy
        actions.append(SendAgent(agent_id, Welcome(
            comp_id=self.comp_id, agent_id=agent_id, generation=self.generation,
            ckptdir=self.ckptdir, heartbeat=pol.heartbeat,
            heartbeat_timeout=pol.heartbeat_timeout, auto_restart=pol.auto_restart,
            replicas=pol.replicas, keep=self.keep)))
        verb = "restarting" if hello.restart else "rejoined" if hello.rejoin else "joined"
        actions.append(Notice(f"{verb}: {agent.label()}"))
        if self.launches.joined(hello.tree_id):
            actions += self._launches_settled(now)
        return actions

    # ---- trees being launched (launching.py) -------------------------------

    def client_joined(self, client_id: int, hello: Hello, now: float) -> list:
        """A client's hello (token checked by the server): welcomed, with
        the ckptdir, which dmtcp-launch asks for before it starts the
        program.  hello.launching: the tree that launch is about to start,
        which checkpoints wait for; during a round, its welcome, and with
        it the program's start, waits for the round's end (as DMTCP's
        launch waits for a checkpoint under way): a program that ran while
        the others were stopped would be in no image of that generation.
        hello.restart: a restart's claim of its tree (claims.py)."""
        if hello.restart:
            refusal = self._restart_refusal(hello, now, claim=client_id)
            if refusal:
                return [ReplyClient(client_id, Refused(error=refusal))]
            self.claims.add(client_id, Claim(hello.tree_id, hello.comp_id, hello.generation,
                                             now))
            return [self._welcome_client(client_id)]
        launching = hello.launching
        if not launching:
            return [self._welcome_client(client_id)]
        self.launches.announced(client_id, launching, now)
        if self.round is None:
            return [self._welcome_client(client_id)]
        self._held.append(client_id)
        return [Notice(f"a launch waits for the {self.round.kind.noun} under way")]

    def launch_announced(self, key: int, tree_id: str, now: float) -> list:
        """A launch that started this coordinator starts tree_id."""
        self.launches.announced(key, tree_id, now)
        return []

    def client_gone(self, key: int, now: float) -> list:
        """A client's connection closed: a launch's that announced a tree
        (the launch ended), or a restart's claim (before its agent joined:
        the restart failed)."""
        self.claims.gone(key)
        if key in self._held:
            self._held.remove(key)
        return self._launches_settled(now) if self.launches.gone(key) else []

    def _welcome_client(self, client_id: int) -> ReplyClient:
        return ReplyClient(client_id, Welcome(comp_id=self.comp_id, agent_id=client_id,
                                              ckptdir=self.ckptdir))

    def _welcome_held(self) -> list:
        """The round is over: the launches held meanwhile start their programs."""
        held, self._held = self._held, []
        return [self._welcome_client(c) for c in held]

    def _launches_settled(self, now: float) -> list:
        """The checkpoints that waited, asked again once no tree is being
        launched: the first starts the round, the others wait for it."""
        if self.launches or not self._waiting:
            return []
        asks, self._waiting = self._waiting, []
        actions: list = []
        for ask in asks:
            actions += self.request_checkpoint(ask.client_id, now, blocking=ask.blocking,
                                               stop=ask.stop, progress=ask.progress)
        return actions

    def _admit_rejoin(self, hello: Hello) -> str | None:
        """An agent whose coordinator died comes back: a fresh coordinator
        takes its computation on (and its generation); ours must match."""
        if hello.comp_id == self.comp_id:
            self.generation = max(self.generation, hello.generation)
            return None
        if self._ever_had_agents:  # (a round, or agents now, means it had some)
            return f"this coordinator is busy with computation {self.comp_id}"
        self.comp_id = hello.comp_id
        self.generation = hello.generation
        return None

    def _restart_refusal(self, hello: Hello, now: float, claim: int) -> str | None:
        """Why a restart of hello's tree is not taken, or None: asked for a
        restarting agent's hello (claim: the claim it names, 0: none) and
        for a restart's claim (claim: its own id).  Changes nothing but the
        count of a called-off restart's trees still to turn away."""
        rnd = self.round
        if self.claims.taken(hello.tree_id, claim):
            return f"tree {hello.tree_id} is already being restarted"
        if rnd is not None and rnd.migration is not None:
            return self._moved_refusal(rnd, hello)
        if rnd is not None and rnd.kind is RoundKind.RESTART and self.comp_id == hello.comp_id \
                and rnd.generation == hello.generation and rnd.state is State.CHECKPOINTED:
            if hello.tree_id in {a.tree_id for a in self.agents.values()}:
                return f"tree {hello.tree_id} is already being restarted"
            return None
        off = self.called_off
        if off is not None and off.turns_away(hello, now, self.policy.restart_timeout):
            off.late -= 1
            return f"the restart of generation {off.generation} was called off: {off.reason}"
        if self.agents or rnd is not None or self.claims.other_than(hello.comp_id,
                                                                     hello.generation):
            return (f"this coordinator is busy with computation {self.comp_id}; "
                    "restart with --new-coordinator or another --coord-port")
        return None

    def _admit_restart(self, agent: Agent, hello: Hello, now: float) -> str | None:
        refusal = self._restart_refusal(hello, now, claim=hello.claim)
        if refusal:
            return refusal
        self.claims.joined(hello.claim, hello.tree_id)
        rnd = self.round
        if rnd is not None and rnd.migration is not None:
            rnd.migration.arrived[agent.tree_id] = agent.agent_id
            rnd.participants.add(agent.agent_id)
            return None
        if rnd is not None:  # (the restart's round: _restart_refusal)
            rnd.participants.add(agent.agent_id)
            rnd.trees.add(agent.tree_id)
            return None
        self.called_off = None
        self.comp_id = hello.comp_id
        self.generation = hello.generation
        self.names.reset()
        self.round = Round(RoundKind.RESTART, hello.generation, State.CHECKPOINTED, now,
                           participants={agent.agent_id}, expected=hello.num_trees,
                           trees={agent.tree_id})
        return None

    def agent_left(self, agent_id: int, now: float) -> list:
        agent = self.agents.pop(agent_id, None)
        if agent is None:
            return []
        why = recovery.why_lost(agent.ended, dismissed=agent.dismissed, silent=agent.silent)
        code = recovery.own_exit(agent.ended, dismissed=agent.dismissed)
        if code is not None:
            self.last_exit = {"tree_id": agent.tree_id, "program": agent.program,
                              "host": agent.host, "exit_code": code}
        actions: list = [Notice(f"left: {agent.label()}"
                                + (f": LOST, {why}" if why else ""))]
        self.names.agent_left(agent_id)
        self.traffic.forget(agent.tree_id)
        if self.rebalancer is not None:
            self.rebalancer.forget(agent.tree_id)
        rnd = self.round
        if rnd is not None and rnd.migration is not None and agent_id not in rnd.participants:
            mig = rnd.migration
            if mig.early.pop(agent_id, None) is not None or mig.swap.pop(agent_id, None) \
                    is not None or agent_id in mig.held:
                mig.held.discard(agent_id)
                actions += self._maybe_advance(now)  # (released on its own: the round may go on)
        if rnd is not None and agent_id in rnd.participants:
            rnd.participants.discard(agent_id)
            rnd.reached.discard(agent_id)
            if rnd.kind is RoundKind.RESTART and rnd.state is not State.RUNNING:
                rnd.errors.append(f"{agent.label()} exited during restart")
                actions += self._abort_restart(now)
            elif rnd.migration is not None:
                rnd.errors.append(f"{agent.label()} exited during the migration")
                if agent_id in rnd.migration.moving.values() \
                        or agent_id in rnd.migration.arrived.values():
                    actions += self._abort_migration("a moving tree's agent exited")
            elif rnd.kind is RoundKind.CHECKPOINT and agent_id not in rnd.published:
                # an agent may go once its images are published (with --stop
                # its tree is gone after the dump); before that they are lost
                rnd.errors.append(f"{agent.label()} exited during the checkpoint")
                rnd.images.pop(agent_id, None)
            actions += self._send_all(self.names.participants_changed(rnd.participants))
            if self.round is rnd:
                actions += self._maybe_advance(now)
        if why is not None:
            actions += self._lost(agent, why, now)
        elif self.recovery is not None:
            actions += self._recovery_step(now)
        # (_finish above may already have shut down for the last agent)
        if not self.agents and self.round is None and self.recovery is None \
                and self.exit_on_last and self._ever_had_agents \
                and not any(isinstance(a, Shutdown) for a in actions):
            actions.append(Shutdown("last process exited"))
        return actions

    def agent_message(self, agent_id: int, msg: Message, now: float) -> list:
        agent = self.agents.get(agent_id)
        if agent is None:
            return []
        agent.last_heard = now
        match msg:
            case Heartbeat():
                return []
            case TreeEnded():
                agent.ended = msg
                return []
            case ReplicaService():
                agent.replica_service = ReplicaTarget(host=agent.host, address=msg.address,
                                                      port=msg.port)
                return []
            case Replicated():
                return self._replicated(agent, msg)
            case Peers():
                agent.peers = msg.count
                agent.procs = msg.procs
                return []
            case Traffic():
                self.traffic.report(agent.tree_id, agent.host,
                                    [(f.local, f.peer, f.sent, f.received) for f in msg.flows],
                                    now)
                return []
            case Load():
                if self.rebalancer is not None and self.round is None:
                    self.rebalancer.report(agent.tree_id, agent.host, msg, now)
                return []
            case Reached():
                return self._reached(agent, msg, now)
            case Published():
                return self._published(agent, msg, now)
            case Progress():
                return self._progress(agent, msg)
            case CkptRequest():
                # as a console `c`: joins a checkpoint already under way
                return [Notice(f"{agent.label()}: the program asked for a checkpoint"),
                        *self.request_checkpoint(None, now)]
            case Sockets():
                rnd = self.round
                if rnd is None or agent_id not in rnd.participants:
                    return [Notice(f"{agent.label()} reported sockets outside a checkpoint")]
                return self._send_all(self.names.report(agent_id, msg.generation,
                                                        msg.endpoints, rnd.participants))
            case Publish():
                return self._send_all(self.names.publish(agent_id, msg.key, msg.value))
            case Lookup():
                return self._send_all(self.names.lookup(agent_id, msg.key))
            case Relay():
                return self._send_all(self.names.relay(agent_id, msg.conn, msg.data))
        return [Notice(f"ignored {msg.TYPE!r} from {agent.label()}")]

    def _reached(self, agent: Agent, msg: Reached, now: float) -> list:
        rnd = self.round
        state = msg.state
        if rnd is not None and rnd.migration is not None \
                and agent.agent_id in rnd.migration.early:
            return self._bystander_reached(agent, msg, now)
        if rnd is not None and rnd.migration is not None \
                and agent.agent_id in rnd.migration.swap:
            return self._swap_reached(agent, msg, now)
        if rnd is None or agent.agent_id not in rnd.participants or state is not rnd.state:
            return [Notice(f"{agent.label()} reported {state.value} out of turn")]
        agent.state = state
        rnd.reached.add(agent.agent_id)
        if state is _SAYS_SOCKETS.get(rnd.kind):
            rnd.sockets = rnd.sockets or msg.sockets or not msg.ok
        if state is State.DRAINED:
            agent.external = msg.external
            rnd.failed_conns.update(msg.failed_conns)
        actions: list = []
        if not msg.ok:
            rnd.errors.append(f"{agent.label()}: {msg.error or 'failed'}")
            if rnd.kind is RoundKind.RESTART:
                return self._abort_restart(now)
            if rnd.migration is not None and state is State.CHECKPOINTED:
                actions += self._abort_migration(f"{agent.label()}: {msg.error or 'failed'}")
        elif rnd.migration is not None and state is State.CHECKPOINTED and msg.held:
            actions += self._release_held(rnd, agent.agent_id)
        elif rnd.migration is not None and state is State.CHECKPOINTED \
                and agent.agent_id in rnd.migration.moving.values():
            if msg.image is None:
                rnd.errors.append(f"{agent.label()}: dumped, but reported no image")
                actions += self._abort_migration(rnd.errors[-1])
            else:
                rnd.images[agent.agent_id] = msg.image
                actions += self._start_moving(now)
        elif state is State.CHECKPOINTED and rnd.kind is RoundKind.CHECKPOINT:
            if msg.image is None:
                rnd.errors.append(f"{agent.label()}: dumped, but reported no image")
            else:
                rnd.images[agent.agent_id] = msg.image
        return actions + self._maybe_advance(now)

    def _progress(self, agent: Agent, msg: Progress) -> list:
        rnd = self.round
        if rnd is None or rnd.kind is not RoundKind.CHECKPOINT \
                or msg.generation != rnd.generation or agent.agent_id not in rnd.participants:
            return []
        rnd.progress[agent.agent_id] = (msg.written, msg.expected)
        written = sum(w for w, _ in rnd.progress.values())
        expected = sum(e for _, e in rnd.progress.values())
        note = Progress(generation=rnd.generation, written=written, expected=expected,
                        trees=len(rnd.participants), reporting=len(rnd.progress))
        return [ReplyClient(c, note) for c in rnd.watchers]

    def _published(self, agent: Agent, msg: Published, now: float) -> list:
        rnd = self.round
        if rnd is None or rnd.kind is not RoundKind.CHECKPOINT \
                or msg.generation != rnd.generation or agent.agent_id not in rnd.images:
            return [Notice(f"{agent.label()} published generation {msg.generation} out of turn")]
        rnd.published.add(agent.agent_id)
        if not msg.ok:
            rnd.errors.append(f"{agent.label()}: {msg.error or 'publishing failed'}")
            return self._maybe_complete(now)
        return self._replicate(agent, rnd.generation, rnd.images[agent.agent_id].path) \
            + self._maybe_complete(now)

    # ---- replicas (--replicas) ------------------------------------------------

    def _replicate(self, agent: Agent, generation: int, path: str) -> list:
        """The tree's images are durable on its host: copies to others."""
        services: dict[str, ReplicaTarget] = {}
        for other in sorted(self.agents.values(), key=lambda a: a.agent_id):
            if other.replica_service is not None and other.silent is None:
                services.setdefault(other.host, other.replica_service)
        targets = replication.targets(agent.host, services, self.policy.replicas)
        if not targets:
            return []
        return [SendAgent(agent.agent_id, Replicate(generation=generation, path=path,
                                                    targets=targets))]

    def _replicated(self, agent: Agent, msg: Replicated) -> list:
        if not msg.ok:
            return [Notice(f"{agent.label()}: generation {msg.generation} not copied to "
                           f"{msg.host}: {msg.error}")]
        known = self.copies.setdefault(msg.generation, {}).setdefault(agent.tree_id, [])
        known[:] = [c for c in known if c.host != msg.host] + [Copy(host=msg.host, path=msg.path)]
        if self.previous is not None and self.previous.generation == msg.generation:
            self.previous = GenerationComplete(self.previous.generation, replication.with_copies(
                self.previous.images, self.copies[msg.generation]))
        done = self.complete
        if done is None or done.generation != msg.generation:
            return []  # the round is still going (_complete merges it), or it is older
        self.complete = GenerationComplete(done.generation, replication.with_copies(
            done.images, self.copies[msg.generation]))
        return [self.complete]

    # ---- commands ----------------------------------------------------------

    def request_checkpoint(self, client_id: int | None, now: float, *,
                           blocking: bool = False, stop: bool = False,
                           progress: bool = False) -> list:
        actions: list = []
        if self.recovery is not None and self.round is None:
            return self._reply(client_id, False, error="a recovery is in progress")
        if self.round is not None:
            if self.round.kind is not RoundKind.CHECKPOINT:
                return self._reply(client_id, False,
                                   error=f"a {self.round.kind.noun} is in progress")
            if blocking and client_id is not None:
                self.round.waiters.append(client_id)
                if progress:
                    self.round.watchers.append(client_id)
                return []
            return self._reply(client_id, True, note="a checkpoint is already in progress")
        if self.launches:  # a tree is starting: the checkpoint waits for its agent
            self._waiting.append(CheckpointAsk(client_id, blocking, stop, progress))
            if len(self._waiting) > 1:
                return []
            return [Notice(f"checkpoint waits for {len(self.launches)} tree(s) being launched "
                           f"to join (at most {JOIN_WAIT:g} s)")]
        if not self.agents:
            return self._reply(client_id, False, error="no processes to checkpoint")
        stop = stop or self.exit_after_ckpt
        # a pre-copy if a tree wants one; not when the program ends with
        # its dump (its stop is the end)
        precopy = not stop and any(a.precopy for a in self.agents.values())
        rnd = Round(RoundKind.CHECKPOINT, self.generation + 1, first_state(precopy), now,
                    participants=set(self.agents), stop=stop,
                    suspended_at=None if precopy else now)
        self.round = rnd
        if blocking and client_id is not None:
            rnd.waiters.append(client_id)
            if progress:
                rnd.watchers.append(client_id)
        elif client_id is not None:
            actions += self._reply(client_id, True, generation=rnd.generation)
        actions.append(Notice(f"checkpoint {rnd.generation}: {len(rnd.participants)} trees"))
        actions += self._broadcast(rnd)
        return actions

    # ---- migration (--migrate, --vacate; migration.py) ---------------------------

    def migrate(self, client_id: int | None, specs: tuple[str, ...], now: float, *,
                to: str = "", vacate: str = "", with_group: bool = False) -> list:
        """Move the trees named (or every tree of the host vacated) to `to`,
        or each to a fresh copy on its own host; every other tree stays.
        A refusal is also a notice (the console's, or the coordinator's own
        --rebalance, have no client to answer)."""
        def refuse(error: str) -> list:
            return [Notice(f"migration refused: {error}"),
                    *self._reply(client_id, False, error=error)]

        if self.recovery is not None:
            return refuse("a recovery is in progress")
        if self.round is not None:
            return refuse(f"a {self.round.kind.noun} is in progress")
        if self.launches:
            # a program that runs with its agent not joined yet would take
            # no part in the round: connections it makes to a moving tree
            # would be neither drained nor made again where it goes
            return refuse(f"{len(self.launches)} tree(s) being launched have not joined yet; "
                          "try again in a moment")
        if vacate and to == vacate:
            return refuse(f"--to {to} is the host being vacated")
        refs = [migration.TreeRef(a.agent_id, a.tree_id, a.host,
                                  (a.pid, *(p.pid for p in a.procs)))
                for a in self.agents.values() if not a.dismissed]
        try:
            chosen = migration.on_host(vacate, refs) if vacate else migration.resolve(specs, refs)
        except migration.MigrationError as exc:
            return refuse(str(exc))
        if with_group:
            names = migration.with_groups({self.agents[a].tree_id for a in chosen},
                                          self.traffic.graph(now)["groups"])
            chosen = [r.agent_id for r in refs if r.tree_id in names]
        moving = {self.agents[a].tree_id: a for a in chosen}
        placement = migration.placement((self.agents[a].host for a in chosen), to)
        self._restart_serial += 1
        self.called_off = None  # (its trees are this restart's own)
        self.names.reset()  # the moved trees' connections meet through fresh names
        # (not the trees told to end, such as a failed migration's new
        # copies still going: they take no part in a round)
        rnd = Round(RoundKind.MIGRATE, self.generation + 1, State.SUSPENDED, now,
                    participants={a for a, agent in self.agents.items() if not agent.dismissed},
                    migration=Migration(moving, placement, self._restart_serial))
        if client_id is not None:
            rnd.waiters.append(client_id)
        self.round = rnd
        where = ", ".join(f"{old} -> {new}" for old, new in placement.items())
        return [Notice(f"migration: {len(moving)} of {len(self.agents)} trees move ({where})"),
                *self._broadcast(rnd)]

    def _start_moving(self, now: float) -> list:
        """Every moving tree is dumped: restart the images where they go."""
        rnd = self.round
        assert rnd is not None and rnd.migration is not None
        mig = rnd.migration
        if mig.started or mig.aborted or not set(mig.moving.values()) <= rnd.images.keys():
            return []
        mig.started, mig.dumped_at = True, now
        images = tuple(rnd.images[a] for a in sorted(mig.moving.values()))
        return [Notice(f"migration: {len(images)} trees dumped in {now - rnd.started:.3f} s; "
                       "restoring them"),
                MoveTrees(rnd.generation, images, tuple(sorted(mig.placement.items())),
                          mig.serial)]

    def _moved_refusal(self, rnd: Round, hello: Hello) -> str | None:
        """Why a moving tree's new copy may not join the migration round."""
        mig = rnd.migration
        assert mig is not None
        if hello.comp_id != self.comp_id or hello.generation != rnd.generation \
                or not mig.started or mig.aborted:
            return f"this coordinator is busy with a migration of computation {self.comp_id}"
        if hello.tree_id not in mig.moving or hello.tree_id in mig.arrived:
            return f"tree {hello.tree_id} is not moving (or has arrived already)"
        return None

    def _abort_migration(self, why: str) -> list:
        """Everything goes back as it was: the new copies end, the staying
        trees stop making connections again (their old ones come back at
        REFILLED, rollback), the old copies were never let go."""
        rnd = self.round
        assert rnd is not None and rnd.migration is not None
        mig = rnd.migration
        if mig.aborted:
            return []
        mig.aborted = True
        if why not in rnd.errors:
            rnd.errors.append(why)
        actions: list = [Notice(f"migration failed: {why}; every tree goes on where it was")]
        moving_old = set(mig.moving.values())
        for agent_id in sorted(rnd.participants):
            agent = self.agents.get(agent_id)
            if agent_id in mig.arrived.values():
                rnd.participants.discard(agent_id)
                rnd.reached.discard(agent_id)
                if agent is not None:
                    agent.dismissed = True
                    actions.append(SendAgent(agent_id, Kill()))
            elif agent_id not in moving_old and agent_id not in rnd.reached:
                actions.append(SendAgent(agent_id, CancelMove()))  # (still at it)
        return actions

    def migration_command_ended(self, serial: int, error: str | None, now: float) -> list:
        """The moving trees' restart command ended: before every new copy
        arrived, the migration failed; after, it is the new copies' end
        (their agents tell it)."""
        rnd = self.round
        mig = rnd.migration if rnd is not None else None
        if mig is None or mig.serial != serial or mig.aborted \
                or len(mig.arrived) >= len(mig.moving):
            return []
        actions = self._abort_migration(error or "the restart ended before every tree was back")
        return actions + self._maybe_advance(now)

    def _migration_timed_out(self, now: float) -> list:
        rnd = self.round
        mig = rnd.migration if rnd is not None else None
        if mig is None or not mig.started or mig.aborted or mig.dumped_at is None \
                or len(mig.arrived) >= len(mig.moving) \
                or now - mig.dumped_at <= self.policy.restart_timeout:
            return []
        return self._abort_migration(
            f"the moved trees were not restored within {self.policy.restart_timeout:g} s") \
            + self._maybe_advance(now)

    def _migration_step(self, now: float) -> list:
        """Every participant reached the round's state: the next one.
        DRAINED -> CHECKPOINTED: the connections the staying trees make
        again are known now.  CHECKPOINTED -> REFILLED: once every new copy
        is there, the old copies end."""
        rnd = self.round
        assert rnd is not None and rnd.migration is not None
        mig = rnd.migration
        actions: list = []
        if rnd.state is State.DRAINED:
            if rnd.errors:
                mig.aborted = True  # nobody is dumped; all refill as after a checkpoint
            else:
                mig.reconnect = migration.reconnects(self.names.connections(),
                                                     set(mig.moving.values()),
                                                     self.names.datagram_ends())
                # bystanders need not wait for the move: released now
                stay = {a for a in rnd.participants
                        if a not in mig.moving.values() and a not in mig.reconnect}
                rnd.participants -= stay
                for agent_id in sorted(stay):
                    mig.early[agent_id] = State.CHECKPOINTED
                    actions.append(SendAgent(agent_id, Barrier(
                        state=State.CHECKPOINTED, generation=rnd.generation,
                        num_trees=1, move=Move.STAY)))
        elif rnd.state is State.CHECKPOINTED:
            if not mig.aborted and len(mig.arrived) < len(mig.moving):
                return []  # the new copies are still being restored
            if mig.held & mig.early.keys():
                return []  # held trees are still on their way to running
            if mig.held and not mig.swapping:
                return self._start_swap(rnd)
            if mig.swap:
                return []
        if rnd.state is State.CHECKPOINTED and not mig.aborted:
            for tree_id, agent_id in mig.moving.items():
                old = self.agents.get(agent_id)
                rnd.participants.discard(agent_id)
                rnd.reached.discard(agent_id)
                if old is not None:
                    old.dismissed = True
                    actions.append(SendAgent(agent_id, Kill(
                        moved_to=mig.placement.get(old.host, old.host))))
        elif rnd.state is State.RUNNING:
            return [] if mig.early else self._finish(now)
        rnd.state = next_state(rnd.state)
        rnd.reached = set()
        return actions + self._broadcast(rnd)

    def _release_held(self, rnd: Round, agent_id: int) -> list:
        """A staying tree holds its connections to the moving trees: it runs
        on (REFILLED, RUNNING on its own) until the swap."""
        mig = rnd.migration
        assert mig is not None
        rnd.participants.discard(agent_id)
        rnd.reached.discard(agent_id)
        mig.held.add(agent_id)
        mig.early[agent_id] = State.REFILLED
        return [SendAgent(agent_id, Barrier(state=State.REFILLED, generation=rnd.generation,
                                            num_trees=1))]

    def _start_swap(self, rnd: Round) -> list:
        """Every new copy is there (or the migration failed): the held trees
        stop again, to swap in their new connections (or the old ones)."""
        mig = rnd.migration
        assert mig is not None
        mig.swapping = True
        mig.swap = {a: State.SUSPENDED for a in mig.held}
        mig.held = set()
        suspend = Barrier(state=State.SUSPENDED, generation=rnd.generation, num_trees=1)
        return [SendAgent(a, suspend) for a in sorted(mig.swap)]

    def _swap_reached(self, agent: Agent, msg: Reached, now: float) -> list:
        """A held tree's swap: SUSPENDED -> FD_LEADER_ELECTION -> DRAINED
        (its held ends parked) -> CHECKPOINTED (swapped); then it joins the
        round again for REFILLED with the new copies."""
        rnd = self.round
        assert rnd is not None and rnd.migration is not None
        mig = rnd.migration
        if msg.state is not mig.swap[agent.agent_id]:
            return [Notice(f"{agent.label()} reported {msg.state.value} out of turn")]
        agent.state = msg.state
        if not msg.ok:
            rnd.errors.append(f"{agent.label()}: {msg.error or 'failed'}")
        if msg.state is State.CHECKPOINTED:
            del mig.swap[agent.agent_id]
            rnd.participants.add(agent.agent_id)
            rnd.reached.add(agent.agent_id)
            return self._maybe_advance(now)
        nxt = mig.swap[agent.agent_id] = next_state(msg.state)
        swap = nxt in (State.DRAINED, State.CHECKPOINTED)
        return [SendAgent(agent.agent_id, Barrier(
            state=nxt, generation=rnd.generation, num_trees=1, swap=swap,
            move=Move.STAY if nxt is State.CHECKPOINTED else None,
            rollback=mig.aborted and nxt is State.CHECKPOINTED))]

    def _bystander_reached(self, agent: Agent, msg: Reached, now: float) -> list:
        """A bystander goes CHECKPOINTED -> REFILLED -> RUNNING on its own;
        then it is out of the round (which ends only after that)."""
        rnd = self.round
        assert rnd is not None and rnd.migration is not None
        early = rnd.migration.early
        if msg.state is not early[agent.agent_id]:
            return [Notice(f"{agent.label()} reported {msg.state.value} out of turn")]
        agent.state = msg.state
        if not msg.ok:
            rnd.errors.append(f"{agent.label()}: {msg.error or 'failed'}")
        if msg.state is State.RUNNING:
            del early[agent.agent_id]
            return self._maybe_advance(now)
        early[agent.agent_id] = next_state(msg.state)
        return [SendAgent(agent.agent_id, Barrier(state=early[agent.agent_id],
                                                  generation=rnd.generation, num_trees=1))]

    def _migration_barriers(self, rnd: Round, msg: Barrier) -> list:
        """A migration's CHECKPOINTED says each tree's part; its REFILLED
        whether everything goes back as it was."""
        mig = rnd.migration
        assert mig is not None
        if rnd.state is State.REFILLED:
            msg = dataclasses.replace(msg, rollback=mig.aborted)
            return [SendAgent(a, msg) for a in sorted(rnd.participants)]
        if rnd.state is not State.CHECKPOINTED:
            return [SendAgent(a, msg) for a in sorted(rnd.participants)]
        moving = set(mig.moving.values())
        go = dataclasses.replace(msg, move=Move.GO, num_trees=len(moving))
        out: list = []
        for agent_id in sorted(rnd.participants):
            if agent_id in moving and not mig.aborted:
                out.append(SendAgent(agent_id, go))
            else:
                conns = () if mig.aborted else tuple(sorted(mig.reconnect.get(agent_id, ())))
                out.append(SendAgent(agent_id, dataclasses.replace(
                    msg, move=Move.STAY, reconnect=conns, hold=bool(conns))))
        return out

    # ---- rebalancing (--rebalance; rebalance.py) ----------------------------------

    def _rebalance(self, now: float) -> list:
        """A host overloaded long enough: its slowed group moves, as a
        migration the coordinator starts itself (no client waits)."""
        rb = self.rebalancer
        if rb is None or self.round is not None or self.recovery is not None or not self.agents:
            return []
        if any(a.dismissed or a.silent is not None for a in self.agents.values()):
            return []  # a tree on its way out (a failed move's new copy): after it
        trees = {a.tree_id: a.host for a in self.agents.values()
                 if not a.dismissed and a.silent is None}
        decision = rb.decide(now, trees, self.traffic.groups(now))
        if decision is None:
            return []
        rb.started(now, left=decision.host if decision.to else "")
        actions: list = [Notice(decision.describe())]
        if not decision.to:
            return actions
        actions += self.migrate(None, decision.trees, now, to=decision.to)
        if self.round is None or self.round.migration is None:
            return actions + [Notice("rebalance: the migration did not start")]
        self._rebalance_serial = self.round.migration.serial
        self.last_rebalance = {**decision.as_json(), "ok": None, "error": None}
        return actions

    def kill(self, client_id: int | None) -> list:
        kill = Kill()
        if self.recovery is not None:
            self.recovery = None
            self.gave_up = "the computation was killed during a recovery"
        for agent in self.agents.values():
            agent.dismissed = True
        actions: list = [SendAgent(a, kill) for a in self.agents]
        actions += self._reply(client_id, True, killed=len(self.agents))
        return actions

    def quit(self, client_id: int | None) -> list:
        return self.kill(client_id) + [Shutdown("quit requested")]

    def set_interval(self, client_id: int | None, seconds: float, now: float, *,
                     auto: bool = False) -> list:
        """Checkpoint every `seconds` (0: off), or with auto at the interval
        chosen from what was measured (a number leaves auto mode)."""
        self.interval_auto = auto
        self.interval = self.auto_interval.choose(now) if auto else max(0.0, float(seconds))
        self._next_interval = now + self.interval if self.interval > 0 else None
        return self._reply(client_id, True, interval=self._shown_interval(), interval_auto=auto)

    def _shown_interval(self) -> float:
        # a chosen interval is not to the microsecond; one given is shown as given
        return round(self.interval, 3) if self.interval_auto else self.interval

    def _auto_checkpointed(self, rnd: Round) -> list:
        """A checkpoint succeeded: the time its program was stopped is the
        cost the auto interval weighs.  In auto mode the next checkpoint
        comes the chosen interval after the program runs again."""
        if rnd.stop or rnd.resumed_at is None:
            return []  # (with --stop the program does not run again: no cost to weigh)
        at = rnd.resumed_at
        self.auto_interval.checkpointed(at - (rnd.suspended_at or rnd.started))
        if not self.interval_auto:
            return []
        self.interval = self.auto_interval.choose(at)
        self._next_interval = at + self.interval
        return [Notice(f"interval (auto): {self.auto_interval.describe(at)}")]

    def _auto_failed(self, now: float) -> None:
        """A tree was lost: one more failure for the auto interval, unless
        a recovery is under way (trees lost then belong to its failure)."""
        if self.recovery is not None or not self.auto_interval.failed(now) \
                or not self.interval_auto:
            return
        self.interval = self.auto_interval.choose(now)
        self._next_interval = now + self.interval

    def tick(self, now: float) -> list:
        """Called periodically (several times per heartbeat): heartbeats,
        silent agents, a recovery's deadline, interval checkpoints."""
        self._clock = now
        actions = self._heartbeats(now)
        late = self.launches.expire(now)
        if late:
            actions.append(Notice(f"launched tree(s) {', '.join(late)} did not join within "
                                  f"{JOIN_WAIT:g} s; checkpoints no longer wait for them"))
            actions += self._launches_settled(now)
        late = self.claims.expire(now)
        if late:
            actions.append(Notice(f"restarted tree(s) {', '.join(late)} did not join within "
                                  f"{JOIN_WAIT:g} s of their claim; the claim is dropped"))
        actions += self._recovery_step(now)
        rec = self.recovery
        if rec is not None and rec.phase is Phase.RESTARTING \
                and now - rec.started > self.policy.restart_timeout:
            actions += self._restart_failed(
                f"the restart did not finish within {self.policy.restart_timeout:g} s", now)
        actions += self._migration_timed_out(now)
        actions += self._rebalance(now)
        if self.agents and self.auto_interval.begin(now) and self.interval_auto:
            # the computation runs from now (not from when the coordinator
            # started): its first checkpoint comes the start value later
            self._next_interval = now + self.interval
        if self._next_interval is not None and now >= self._next_interval:
            self._next_interval = now + self.interval
            if self.round is None and self.agents and self.recovery is None:
                actions += self.request_checkpoint(None, now)
        return actions

    def _heartbeats(self, now: float) -> list:
        pol = self.policy
        if pol.heartbeat <= 0:
            return []
        actions: list = []
        if pol.heartbeat_timeout > 0:
            for agent in self.agents.values():
                if agent.silent is None and now - agent.last_heard > pol.heartbeat_timeout:
                    agent.silent = (f"its host {agent.host} went silent (no heartbeat for "
                                    f"{now - agent.last_heard:.1f} s)")
                    self._silent_hosts.add(agent.host)
                    actions += [Notice(f"{agent.label()}: {agent.silent}"),
                                CloseAgent(agent.agent_id)]
        if now >= self._next_beat:
            self._next_beat = now + pol.heartbeat
            beat = Heartbeat()
            actions += [SendAgent(a, beat) for a, agent in self.agents.items()
                        if agent.silent is None]
        return actions

    def status(self) -> dict:
        return {
            "comp_id": self.comp_id,
            "num_peers": sum(a.peers for a in self.agents.values()),
            "num_trees": len(self.agents),
            "running": bool(self.agents) and self.round is None and self.recovery is None,
            "state": self.round.state.value if self.round else State.RUNNING.value,
            "generation": self.generation,
            "checkpoint_interval": self._shown_interval(),
            "interval_auto": self.interval_auto,
            "last_checkpoint": self.last_checkpoint,
            "last_migration": self.last_migration,
            "auto_restart": self.policy.auto_restart,
            "restarts": self.restarts,
            "recovering": self.recovery.phase.value if self.recovery else None,
            "last_failure": _failure_json(self.last_failure),
            "time_lost": round(self.time_lost, 3),
            "gave_up": self.gave_up,
            "last_exit": self.last_exit,
            "replicas": self.policy.replicas,
            "replicated_trees": replication.fully_copied(self.complete.images, self.policy.replicas)
            if self.complete and self.policy.replicas else 0,
            "rebalance": self._rebalance_status(),
        }

    def _rebalance_status(self) -> dict | None:
        rb = self.rebalancer
        if rb is None:
            return None
        return {"after": rb.after, "overloaded": rb.overloaded(self._clock),
                "last": self.last_rebalance}

    def listing(self) -> list[dict]:
        """The trees, as plain JSON for a reply: a process is
        [pid, program] or [pid, program, MPI rank] (dmtcp_py.listing)."""
        return [{"host": a.host, "agent_pid": a.pid, "program": a.program,
                 "tree_id": a.tree_id, "state": a.state.value, "peers": a.peers,
                 "procs": [_proc_row(p) for p in a.procs], "external": list(a.external)}
                for a in self.agents.values()]

    def graph(self, now: float) -> dict:
        """The traffic between the trees and their groups (--graph), with
        every tree under control, whether it reported traffic or not."""
        out = self.traffic.graph(now)
        out["trees"] = [{"tree_id": a.tree_id, "host": a.host, "program": a.program}
                        for a in sorted(self.agents.values(), key=lambda a: (a.host, a.tree_id))]
        grouped = {t for g in out["groups"] for t in g}
        out["groups"] += [[a.tree_id] for a in sorted(self.agents.values(),
                                                      key=lambda a: a.tree_id)
                          if a.tree_id not in grouped]
        return out

    # ---- recovery (--auto-restart) ---------------------------------------------

    def _lost(self, agent: Agent, why: str, now: float) -> list:
        failure = Failure(agent.tree_id, agent.program, agent.host, why, now)
        self.last_failure = failure
        self._auto_failed(now)
        if not self.policy.auto_restart:
            return []
        if self.recovery is not None:
            # lost while recovering: a tree of the restart (its round fails
            # and is tried again) or one being stopped anyway
            return [Notice(f"recovery: also lost {failure.describe()}"),
                    *self._recovery_step(now)]
        if self.gave_up is not None:
            return []
        if self.complete is None:
            return [Notice(f"not restarting {agent.label()}: no complete checkpoint yet")]
        self.recovery = Recovery(failure, Phase.STOPPING, now)
        if why == recovery.AGENT_VANISHED:
            self.recovery.not_before = now + recovery.AGENT_LOSS_DELAY
        return [Notice(f"recovery: lost {failure.describe()}; stopping the other "
                       f"{len(self.agents)} trees")] + self._recovery_step(now)

    def _recovery_step(self, now: float) -> list:
        """STOPPING: tell every tree left to end (once; a checkpoint under
        way fails, the last good generation stays); when all are gone and
        that round is over, restart the newest complete generation."""
        rec = self.recovery
        if rec is None or rec.phase is not Phase.STOPPING:
            return []
        kill = Kill()
        actions: list = []
        for agent in self.agents.values():
            if not agent.dismissed:
                agent.dismissed = True
                actions.append(SendAgent(agent.agent_id, kill))
        if self.agents or self.round is not None:
            return actions
        if rec.attempt >= self.policy.max_restarts:
            return actions + self._give_up(
                f"gave up after {rec.attempt} restart attempts "
                f"(--max-restarts {self.policy.max_restarts})")
        if now < rec.not_before:
            return actions  # tick comes back
        assert self.complete is not None
        lost_hosts = set(self._silent_hosts)
        chosen = self.complete
        if not replication.recoverable(chosen.images, lost_hosts) and self.previous \
                and replication.recoverable(self.previous.images, lost_hosts):
            actions.append(Notice(f"recovery: generation {chosen.generation} has no copy left "
                                  f"of a tree of {', '.join(sorted(lost_hosts))}; restarting "
                                  f"generation {self.previous.generation}"))
            chosen = self.previous
        images = replication.surviving(chosen.images, lost_hosts)
        alive = {i.host for i in images} - lost_hosts
        try:
            placement = recovery.place(images, alive, self.policy.hosts)
        except ValueError as exc:
            return actions + self._give_up(str(exc))
        rec.attempt += 1
        self._restart_serial += 1
        self.called_off = None  # (its trees are this restart's own)
        rec.serial = self._restart_serial
        rec.phase = Phase.RESTARTING
        rec.started = now
        rec.generation = chosen.generation
        self.names.reset()
        self.round = Round(RoundKind.RESTART, rec.generation, State.CHECKPOINTED, now,
                           expected=len(images))
        moved = [f"{old} -> {new}" for old, new in placement.items() if old != new]
        return actions + [
            Notice(f"recovery: restarting generation {rec.generation} ({len(images)} trees"
                   + (f"; {', '.join(moved)}" if moved else "") + f"), attempt {rec.attempt}"),
            RestartGeneration(rec.generation, images, tuple(sorted(placement.items())),
                              rec.attempt, tuple(sorted(lost_hosts)), rec.serial)]

    def restart_command_ended(self, serial: int, error: str | None, now: float) -> list:
        """A recovery's restart command ended: harmless once its trees
        joined (it lives as long as they do), or if it is an earlier
        recovery's; before that, the attempt failed."""
        rec = self.recovery
        if rec is None or rec.phase is not Phase.RESTARTING or rec.serial != serial:
            return []
        rnd = self.round
        if error is None or (rnd is not None and rnd.participants
                             and len(rnd.participants) >= rnd.expected):
            return []
        return self._restart_failed(error, now)

    def _restart_failed(self, error: str, now: float) -> list:
        rec = self.recovery
        assert rec is not None
        actions: list = [Notice(f"recovery: restart attempt {rec.attempt} failed: {error}")]
        rnd = self.round
        if rnd is not None and rnd.kind is RoundKind.RESTART:
            # its trees that joined are stopped with the rest (_recovery_step)
            self.round = None
            actions += [ReplyClient(c, Reply(ok=False, error=error)) for c in rnd.waiters]
            actions += self._welcome_held()
        rec.phase = Phase.STOPPING
        rec.not_before = now + recovery.RETRY_DELAY * rec.attempt
        return actions + self._recovery_step(now)

    def _recovered(self, now: float) -> list:
        rec = self.recovery
        assert rec is not None
        self.recovery = None
        self.restarts += 1
        lost = now - rec.failure.at
        self.time_lost += lost
        # copies that lived on the lost hosts are gone with them
        for trees in self.copies.values():
            for known in trees.values():
                known[:] = [c for c in known if c.host not in self._silent_hosts]
        self._silent_hosts.clear()
        return [Notice(f"recovery: running again from generation {rec.generation}, "
                       f"{lost:.2f} s after the failure (restart {self.restarts})")]

    def _give_up(self, why: str) -> list:
        self.recovery = None
        self.gave_up = why
        actions: list = [Notice(f"recovery: {why}")]
        if self.exit_on_last and not self.agents:
            actions.append(Shutdown("auto-restart gave up"))
        return actions

    # ---- barrier engine ------------------------------------------------------

    def _broadcast(self, rnd: Round) -> list:
        msg = Barrier(state=rnd.state, generation=rnd.generation, stop=rnd.stop,
                      num_trees=len(rnd.participants), failed_conns=tuple(sorted(rnd.failed_conns)))
        if rnd.migration is not None:
            return self._migration_barriers(rnd, msg)
        return [SendAgent(a, msg) for a in sorted(rnd.participants)]

    def _maybe_advance(self, now: float) -> list:
        rnd = self.round
        if rnd is None:
            return []
        if not rnd.participants:
            return self._finish(now)
        if not rnd.participants <= rnd.reached:
            return []
        if rnd.kind is RoundKind.RESTART and rnd.state is State.CHECKPOINTED \
                and len(rnd.participants) < rnd.expected:
            return []  # more trees of this computation still have to join
        if rnd.migration is not None:
            return self._migration_step(now)
        commit: list = []
        if rnd.kind is RoundKind.CHECKPOINT and rnd.state is State.CHECKPOINTED:
            # every tree dumped, or one failed: the agents publish their
            # images only on this word, so a failed generation never
            # replaces the last good one
            rnd.commit_ok = not rnd.errors
            msg = Commit(generation=rnd.generation, ok=rnd.commit_ok)
            commit = [SendAgent(a, msg) for a in sorted(rnd.participants)]
        if rnd.kind is RoundKind.CHECKPOINT and (rnd.state is State.RUNNING
                                                 or (rnd.state is State.CHECKPOINTED and rnd.stop)):
            # running again (or, with --stop, gone after the dump): what is
            # left is the images becoming durable
            rnd.resumed = True
            rnd.resumed_at = now
            return commit + self._maybe_complete(now)
        if rnd.state is State.RUNNING:
            return self._finish(now)
        if rnd.state is _SAYS_SOCKETS.get(rnd.kind) and rnd.socketless:
            for agent_id in rnd.participants:  # (what a skipped drain would have said)
                if agent_id in self.agents:
                    self.agents[agent_id].external = ()
        rnd.state = next_state(rnd.state, rnd.socketless)
        rnd.reached = set()
        if rnd.state is State.SUSPENDED:
            rnd.suspended_at = now
        return commit + self._broadcast(rnd)

    def _maybe_complete(self, now: float) -> list:
        rnd = self.round
        if rnd is None or not rnd.resumed:
            return []
        if rnd.commit_ok and not rnd.images.keys() <= rnd.published:
            return []  # images being made durable
        actions: list = []
        # participants that left after publishing (--stop) keep their image here
        if not rnd.errors and rnd.participants <= rnd.images.keys():
            self.complete = self._completed(rnd)
            actions.append(self.complete)
        return actions + self._finish(now)

    def _finish(self, now: float) -> list:
        rnd = self.round
        assert rnd is not None
        self.round = None
        held = self._welcome_held()
        checkpoint = rnd.kind is RoundKind.CHECKPOINT
        ok = not rnd.errors and (not checkpoint or bool(rnd.images))
        error = "; ".join(rnd.errors) or None
        # the reply's body; with ok and error, what the status shows as the last checkpoint
        body = {
            "kind": rnd.kind.value,
            "generation": rnd.generation,
            "duration": round(now - rnd.started, 6),
            "bytes": sum(i.bytes for i in rnd.images.values()),
            "processes": sum(i.processes for i in rnd.images.values()),
            "trees": len(rnd.images) if checkpoint else len(rnd.participants),
        }
        mig = rnd.migration
        if mig is not None:
            body.update(trees=len(mig.moving), moved=sorted(mig.moving),
                        to=sorted(set(mig.placement.values())),
                        # every tree was stopped from the start to the release
                        stopped=body["duration"])
        info = {**body, "ok": ok, "error": error}
        actions: list = []
        if mig is not None and self.last_rebalance is not None \
                and mig.serial == self._rebalance_serial:
            self.last_rebalance.update(ok=ok, error=error, duration=body["duration"])
        if mig is not None:
            self.last_migration = info
            actions.append(Notice(f"migration of {len(mig.moving)} trees "
                                  + ("done" if ok else f"FAILED: {error}")
                                  + f" in {body['duration']:.3f} s"))
        elif checkpoint:
            self.last_checkpoint = info
            if ok:
                self.generation = rnd.generation
            actions.append(Notice(f"checkpoint {rnd.generation} "
                                  + ("done" if ok else f"FAILED: {info['error']}")
                                  + f" in {info['duration']:.3f} s, {info['bytes']} bytes"))
            if ok:
                actions += self._auto_checkpointed(rnd)
        else:
            actions.append(Notice(f"restart of generation {rnd.generation} "
                                  + ("done" if ok else f"FAILED: {info['error']}")))
            if ok and len(rnd.images) >= rnd.expected:
                self.complete = self._completed(rnd)
        # The agents hear of the generation before the clients that wait for
        # it: a client may kill this coordinator the moment it has its reply
        # (a test does), and agents that rejoin the next one bring the
        # generation they heard of.
        if checkpoint:  # (and processes waiting in dmtcp_checkpoint())
            done = GenerationDone(generation=rnd.generation, ok=ok)
            actions += [SendAgent(a, done) for a in sorted(rnd.participants) if a in self.agents]
        if rnd.waiters:
            reply = Reply(ok=ok, error=error, body=body)
            actions += [ReplyClient(client, reply) for client in rnd.waiters]
        actions += held
        if self.recovery is not None:
            if not checkpoint and self.recovery.phase is Phase.RESTARTING:
                actions += self._recovered(now) if ok else self._restart_failed(error or "", now)
            else:  # a checkpoint under way when the tree was lost: now stop the rest
                actions += self._recovery_step(now)
            return actions
        if checkpoint and ok and self.exit_after_ckpt:
            actions.append(Shutdown("exit after checkpoint"))
        elif not self.agents and self.exit_on_last and self._ever_had_agents:
            actions.append(Shutdown("last process exited"))
        return actions

    def _completed(self, rnd: Round) -> GenerationComplete:
        done = _complete(rnd, self.copies)
        if self.complete is not None and self.complete.generation != done.generation:
            self.previous = self.complete
        # copies of older generations than the one before are out of every window
        for gen in [g for g in self.copies if g < done.generation - 1]:
            del self.copies[gen]
        return done

    def _abort_restart(self, now: float) -> list:
        """A restart that lost a tree cannot be consistent: stop the others."""
        rnd = self.round
        assert rnd is not None and rnd.kind is RoundKind.RESTART
        if len(rnd.trees) < rnd.expected:
            self.called_off = CalledOff(self.comp_id, rnd.generation, frozenset(rnd.trees),
                                        rnd.expected - len(rnd.trees),
                                        "; ".join(rnd.errors) or "a tree failed", now)
        kill = Kill()
        actions: list = [SendAgent(a, kill) for a in sorted(rnd.participants)]
        rnd.participants.clear()
        return actions + self._finish(now)

    @staticmethod
    def _send_all(pairs: list[tuple[int, Message]]) -> list:
        return [SendAgent(a, m) for a, m in pairs]

    def _reply(self, client_id: int | None, ok: bool, error: str | None = None,
               **body) -> list:
        if client_id is None:
            return []
        return [ReplyClient(client_id, Reply(ok=ok, error=error, body=body))]


def _complete(rnd: Round, copies: dict[int, dict[str, list[Copy]]]) -> GenerationComplete:
    """The round's generation with its trees' images, in agent order, and
    the copies made of them so far."""
    images = tuple(rnd.images[a] for a in sorted(rnd.images))
    return GenerationComplete(rnd.generation,
                              replication.with_copies(images, copies.get(rnd.generation, {})))


def _failure_json(failure: Failure | None) -> dict | None:
    if failure is None:
        return None
    return {"tree_id": failure.tree_id, "program": failure.program, "host": failure.host,
            "why": failure.why}


def _proc_row(proc: ProcInfo) -> list:
    return [proc.pid, proc.name] + ([proc.rank] if proc.rank is not None else [])
