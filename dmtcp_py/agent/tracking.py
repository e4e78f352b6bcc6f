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
import functools
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
# CRIU's words when it cannot track (a CRIU without the patch, a kernel
# that refuses the protection): the agent dumps whole generations from then on
CRIU_REFUSALS = ("Tracking memory is not available", "Can't write-protect")


# <linux/fs.h>: _IOWR('f', 16, struct pm_scan_arg) (Linux 6.7, with WP_ASYNC)
PAGEMAP_SCAN = 0xC0606610
_SCAN_ARG = struct.Struct("12Q")


@functools.cache
def available() -> bool:
    """This kernel can track written pages (PAGEMAP_SCAN came with
    UFFD_FEATURE_WP_ASYNC, in Linux 6.7): an empty scan of our own memory."""
    try:
        fd = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.ioctl(fd, PAGEMAP_SCAN, bytearray(_SCAN_ARG.pack(_SCAN_ARG.size, *[0] * 11)))
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


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
            if exc.errno in (errno.ENOMEM, errno.ESRCH):
                # the memory it was made for is gone (the process exec'd or
                # ended, its pid maybe reused): ENOMEM here
                raise TrackerGone(f"the memory of process {pid} is gone") from None
            # EINVAL: a range that changed meanwhile, or that this memory
            # cannot be tracked in; EBUSY: the program's own userfaultfd
            # has it: left untracked
    return done


def close(uffd: int) -> None:
    try:
        os.close(uffd)
    except OSError:
        pass


class Trackers:
    """The userfaultfds an agent holds, one per process of its tree, and
    the processes whose shim could make none (they are not asked again:
    their pages are all dumped)."""

    def __init__(self) -> None:
        self.fds: dict[int, int] = {}
        self.refused: dict[int, str] = {}

    def wanted(self, pids: set[int]) -> set[int]:
        """The processes to ask for a tracker."""
        return {p for p in pids if p not in self.fds and p not in self.refused}

    def take(self, got: dict[int, int | str]) -> dict[int, str]:
        """What the shims answered (fd, or why not); the refusals."""
        refused = {}
        for pid, fd in got.items():
            if isinstance(fd, int):
                if pid in self.fds:
                    close(self.fds[pid])
                self.fds[pid] = fd
            else:
                refused[pid] = self.refused[pid] = fd
        return refused

    def keep_only(self, pids: set[int]) -> None:
        """Forget the processes that are gone."""
        for pid in [p for p in self.fds if p not in pids]:
            close(self.fds.pop(pid))
        for pid in [p for p in self.refused if p not in pids]:
            del self.refused[pid]

    def register(self, pids: set[int]) -> set[int]:
        """Register each process's ranges; the processes whose tracker
        turned out stale (dropped: ask them again)."""
        stale = set()
        for pid in sorted(pids & self.fds.keys()):
            try:
                register(self.fds[pid], pid)
            except TrackerGone:
                close(self.fds.pop(pid))
                stale.add(pid)
        return stale


# PAGEMAP_SCAN's categories (<linux/fs.h>) and one region of its answer
PAGE_IS_WRITTEN, PAGE_IS_PRESENT, PAGE_IS_SWAPPED = 1 << 1, 1 << 3, 1 << 4
_REGION = struct.Struct("QQQ")  # start, end, categories
_REGIONS = 256                  # regions asked for at a time
PAGE = 4096


def written_bytes(pid: int, limit: int) -> int:
    """The bytes of pid's trackable memory (trackable_ranges) written since
    its pages were last protected, counted up to about limit: what a
    tracked dump would write beyond the ranges it always writes whole.  A
    read of the page tables (PAGEMAP_SCAN), the process running: it changes
    nothing.  TrackerGone if the process is gone."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            ranges = trackable_ranges(f.read())
        fd = os.open(f"/proc/{pid}/pagemap", os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, ProcessLookupError):
        raise TrackerGone(f"process {pid} is gone") from None
    vec = bytearray(_REGION.size * _REGIONS)
    address, total = _address_of(vec), 0
    try:
        for start, end in ranges:
            while start < end and total < limit:
                arg = bytearray(_SCAN_ARG.pack(
                    _SCAN_ARG.size, 0, start, end, 0, address, _REGIONS,
                    (limit - total + PAGE - 1) // PAGE,  # max_pages: enough to know
                    0, PAGE_IS_WRITTEN, PAGE_IS_PRESENT | PAGE_IS_SWAPPED, PAGE_IS_WRITTEN))
                found = fcntl.ioctl(fd, PAGEMAP_SCAN, arg)
                for k in range(found):
                    lo, hi, _ = _REGION.unpack_from(vec, k * _REGION.size)
                    total += hi - lo
                walk_end = _SCAN_ARG.unpack(arg)[4]
                if walk_end <= start:
                    break
                start = walk_end
    except OSError as exc:
        if exc.errno in (errno.ESRCH, errno.ENOENT):
            raise TrackerGone(f"process {pid} is gone") from None
        if exc.errno != errno.EINVAL:  # (a range unmapped meanwhile: the count so far)
            raise
    finally:
        os.close(fd)
    return total


def _address_of(buf: bytearray) -> int:
    """The address of buf's bytes, for the kernel to write into (buf must
    outlive the call: the caller keeps it)."""
    import ctypes
    return ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))
