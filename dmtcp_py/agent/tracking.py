"""Which pages a process wrote since its last dump, without soft-dirty bits.

This kernel has no soft-dirty bits (DESIGN.md 1), so CRIU alone cannot
tell the pages that changed since the previous dump.  Its replacement is
asynchronous userfaultfd write-protection (UFFD_FEATURE_WP_ASYNC, Linux
6.7): a page of a range registered in write-protect mode loses its
protection at its first write, by the kernel, without any fault handler,
and PAGEMAP_SCAN reports it PAGE_IS_WRITTEN.  Our CRIU (patch 0004 in
scripts/criu-patches) reads that bit as its dirty bit when
CRIU_UFFD_WP_TRACK is set and protects the written pages again after the
dump.

The userfaultfd has to be made by the process itself (it belongs to the
process's memory), but may not be in the process while CRIU dumps it
(CRIU cannot dump one), and the protection lasts only while it is open:
the shim makes it and hands it to its agent, which keeps it for the
process's life and registers the process's ranges through it before every
dump (UFFDIO_REGISTER works on the memory the userfaultfd belongs to, from
any process that holds it).

Only private anonymous writable ranges are registered: the heap, stacks,
anonymous mappings (most of any program's memory).  Pages of any other
range are always "written", so always dumped: a range left out costs
bytes, never correctness.  File-backed ranges are left out because
zapping a protected page there leaves a uffd-wp marker behind, which
PAGEMAP_SCAN reports as a swapped, unwritten page: a page whose content
would then be taken from an image it is not in.
"""
from __future__ import annotations

import errno
import fcntl
import os
import struct

# <linux/userfaultfd.h>: _IOWR(0xAA, _UFFDIO_REGISTER, struct uffdio_register)
UFFDIO_REGISTER = 0xC020AA00
UFFDIO_REGISTER_MODE_WP = 1 << 1
_REGISTER = struct.Struct("QQQQ")  # range start, range length, mode, ioctls (out)
# the kernel's own mappings: never private memory of the program
_SPECIAL = frozenset(("[vvar]", "[vvar_vclock]", "[vdso]", "[vsyscall]", "[uprobes]"))

# CRIU's environment: count PAGE_IS_WRITTEN as dirty (scripts/criu-patches/0004)
CRIU_ENV = "CRIU_UFFD_WP_TRACK"


class TrackerGone(Exception):
    """The userfaultfd's memory is gone (the process ended or exec'd)."""


def trackable_ranges(maps: str) -> list[tuple[int, int]]:
    """(start, end) of each private, writable, anonymous mapping of a
    /proc/PID/maps text."""
    out = []
    for line in maps.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) < 5:
            continue
        perms, inode = parts[1], parts[4]
        name = parts[5].strip() if len(parts) > 5 else ""
        if len(perms) < 4 or perms[1] != "w" or perms[3] != "p" or inode != "0":
            continue
        if name in _SPECIAL or (name and not name.startswith("[")):
            continue  # (a deleted file's mapping has inode != 0; this is belt and braces)
        lo, _, hi = parts[0].partition("-")
        out.append((int(lo, 16), int(hi, 16)))
    return out


def register(uffd: int, pid: int) -> int:
    """Register every trackable range of pid's memory with uffd (the
    process's own userfaultfd, in WP_ASYNC mode); the number of ranges.
    A range the kernel refuses stays untracked (always dumped).
    TrackerGone if uffd no longer belongs to pid's memory."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            maps = f.read()
    except (FileNotFoundError, ProcessLookupError):
        raise TrackerGone(f"process {pid} is gone") from None
    done = 0
    for lo, hi in trackable_ranges(maps):
        arg = bytearray(_REGISTER.pack(lo, hi - lo, UFFDIO_REGISTER_MODE_WP, 0))
        try:
            fcntl.ioctl(uffd, UFFDIO_REGISTER, arg)
            done += 1
        except OSError as exc:
            if exc.errno == errno.ESRCH:  # its memory is gone (exit, exec)
                raise TrackerGone(f"the memory of process {pid} is gone") from None
            # EINVAL/ENOMEM: a range that changed meanwhile, or that this
            # memory cannot be tracked in (EBUSY: the program's own
            # userfaultfd has it): left untracked
    return done


def close(uffd: int) -> None:
    try:
        os.close(uffd)
    except OSError:
        pass
