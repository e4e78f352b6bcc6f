"""The records of the shim link, as hijack/include/dmtcp_record.h defines
them: the layout, the record types, the flags riding on an arg.

Only constants, pack() and the arithmetic of an arg: no I/O, no asyncio,
so the agent's sans-IO machine and the tests use them as freely as
shimlink.py does.  The C header is the reference (the conversation is
documented there); tests/unit/test_records.py compiles it and checks
every value here.
"""
from __future__ import annotations

import signal
import struct

# struct dmtcp_record: magic, version, type, pid, ppid, arg; native byte
# order and no padding ("="): both ends are on one host
RECORD = struct.Struct("=IHHiiQ")
MAGIC = 0x444D5443  # "DMTC"
VERSION = 1

# enum dmtcp_record_type
HELLO = 1
SUSPEND = 2
SUSPENDED = 3
CHECKPOINT = 4
READY = 5
RESUME = 6
RESUMED = 7
ELECT = 8
ELECTED = 9
PARK = 10
PARKED_FD = 11
PARKED = 12
UNPARK_FD = 13
UNPARK = 14
UNPARKED = 15
CKPT_REQUEST = 16
CKPT_REQUESTED = 17
DONE = 18
FATE = 19
CHILD_KILLED = 20
PROGRAM_ENDED = 21
TRACK = 22
TRACKER = 23

HELLO_RELEASED = 2         # HELLO's arg: back from the dump at its token's address, running
HELLO_FD_SHIFT = 32        # HELLO's arg: | (the link's fd + 1) << this
DONE_FAILED = 1 << 32      # DONE's arg: | this when the generation failed
RESUME_RESTORED = 1 << 32  # RESUME's arg: | this after a restart
PARK_LEADER = 1 << 32      # PARKED_FD's arg: | this when the process leads the socket
PARK_MAX = 16384           # the most sockets one PARK may name
FATE_GRACE_MS = 3000       # FATE 1: a process whose agent went away waits this long
# CHILD_KILLED's arg: pid | signal << KILLED_SIGNAL_SHIFT | KILLED_CORE
KILLED_SIGNAL_SHIFT = 32
KILLED_CORE = 1 << 40
# the signals that kill a process by failure, one bit per signal number
FAILURE_SIGNALS = sum(1 << s for s in (signal.SIGKILL, signal.SIGSEGV, signal.SIGBUS,
                                       signal.SIGABRT, signal.SIGILL, signal.SIGFPE,
                                       signal.SIGSYS))


def pack(type_: int, arg: int = 0) -> bytes:
    """A record from the agent; its pid and ppid stay 0 (the shim reads
    neither)."""
    return RECORD.pack(MAGIC, VERSION, type_, 0, 0, arg)


def failure_signal(signum: int, core: bool = False) -> bool:
    """Whether a process killed by signum (core: it dumped core) died of a
    failure, not of how programs end each other (SIGPIPE, SIGTERM...)."""
    return core or (0 < signum < 64 and bool(FAILURE_SIGNALS >> signum & 1))


def hello_of(arg: int) -> tuple[int, int | None]:
    """(state, the link's fd in the process or None) of HELLO's arg: state
    0 running, 1 suspended, HELLO_RELEASED."""
    link = arg >> HELLO_FD_SHIFT
    return arg & ((1 << HELLO_FD_SHIFT) - 1), link - 1 if link else None


def killed_arg(pid: int, signum: int, core: bool = False) -> int:
    """CHILD_KILLED's arg, as the shim builds it."""
    return ((pid & 0xFFFFFFFF) | (signum & 0xFF) << KILLED_SIGNAL_SHIFT
            | (KILLED_CORE if core else 0))


def killed_of(arg: int) -> tuple[int, int, bool]:
    """(pid, signal, core) of CHILD_KILLED's arg."""
    return (arg & 0xFFFFFFFF, arg >> KILLED_SIGNAL_SHIFT & 0xFF, bool(arg & KILLED_CORE))
