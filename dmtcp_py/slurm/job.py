"""What `dmtcp-slurm run` does when (pure logic: events in, actions out;
no I/O, no clock).

One run of the job script: the program runs (launched, or restarted from
the newest complete generation); a requeue signal (the time-limit warning
of `--signal=B:USR1@T`, or SIGTERM before a preemption) checkpoints and
stops the computation, then requeues the job; a checkpoint signal
checkpoints and goes on; the program's exit ends the job with its status.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Say:
    text: str


@dataclass(frozen=True)
class Checkpoint:
    stop: bool        # -kc (and then requeue) rather than -bc


@dataclass(frozen=True)
class Requeue:
    pass


@dataclass(frozen=True)
class Exit:
    status: int


@dataclass(frozen=True)
class RetryLater:
    """Give the signal again in a moment (the computation was not ready)."""
    signal: str


Action = Say | Checkpoint | Requeue | Exit | RetryLater

MAX_TRIES = 30  # checkpoints tried for one requeue signal

REQUEUED = 0  # our exit status once the job is requeued (Slurm ends the run anyway)
REQUEUE_FAILED = 75  # EX_TEMPFAIL: checkpointed and stopped, but not requeued


def start_kind(has_generation: bool) -> str:
    """launch or restart: restart whenever a complete generation exists."""
    return "restart" if has_generation else "launch"


class JobMachine:
    def __init__(self, requeues: int, max_requeues: int) -> None:
        self.requeues = requeues          # how often this job was requeued before
        self.max_requeues = max_requeues
        self.busy = False                 # a checkpoint is under way
        self.stopping = False             # stopped for a requeue: nothing more to do
        self.done = False
        self.tries = 0
        self.signal = ""

    def requeue_signal(self, name: str) -> list[Action]:
        if self.done or self.stopping or self.busy:
            return []
        if self.requeues >= self.max_requeues:
            self.busy = True
            return [Say(f"{name}: the job was requeued {self.requeues} times, the most "
                        f"allowed (--max-requeues): checkpoint only"), Checkpoint(stop=False)]
        self.busy = self.stopping = True
        self.signal = name
        self.tries += 1
        text = f"{name}: checkpoint, then requeue"
        return [Say(text if self.tries == 1 else f"{text} (try {self.tries})"),
                Checkpoint(stop=True)]

    def checkpoint_signal(self, name: str) -> list[Action]:
        if self.done or self.stopping or self.busy:
            return []
        self.busy = True
        return [Say(f"{name}: checkpoint"), Checkpoint(stop=False)]

    def checkpointed(self, ok: bool, detail: str = "") -> list[Action]:
        self.busy = False
        if not self.stopping:
            return [] if ok else [Say(f"the checkpoint failed: {detail}".rstrip(": "))]
        if ok:
            return [Requeue()]
        # the program still runs (a failed -kc leaves it running): try
        # again in a moment, a few times (a restart may still be under way)
        self.stopping = False
        if self.tries < MAX_TRIES:
            return [Say(f"the checkpoint failed, trying again: {detail}".rstrip(": ")),
                    RetryLater(self.signal)]
        return [Say(f"the checkpoint failed {self.tries} times, the job is not requeued: "
                    f"{detail}".rstrip(": "))]

    def requeued(self, ok: bool, detail: str = "") -> list[Action]:
        if ok:
            self.done = True
            return [Say(f"requeued (requeue {self.requeues + 1})"), Exit(REQUEUED)]
        # the computation is checkpointed and stopped: end, say so
        self.done = True
        return [Say(f"scontrol requeue failed: {detail}".rstrip(": ")
                    + "; the checkpoint stays in this job's directory (run again with --dir)"),
                Exit(REQUEUE_FAILED)]

    def program_exited(self, status: int) -> list[Action]:
        if self.done:
            return []
        if self.stopping:  # stopped by our own -kc: the requeue decides
            return []
        self.done = True
        return [Say(f"the program exited with status {status} after {self.requeues} "
                    f"requeue{'s' if self.requeues != 1 else ''}"), Exit(status)]
