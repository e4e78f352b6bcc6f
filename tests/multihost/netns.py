"""Test hosts: several hosts on one machine (DESIGN.md section 6).

Connections that survive checkpoint, restart and migration need more than one
host, and the tests must not depend on real machines.  A "host" here is a
network namespace (its own eth0 and address from 198.18.0.0/15, the range
reserved for test networks and never routed) plus a UTS namespace (its own
hostname, because the coordinator, the restart script and the per-host
temporary directories all go by hostname) plus a mount namespace whose
/dev/shm is a tmpfs of its own (as on separate machines: MPI libraries put
segments there under names that are the same on every host), and, if the
network is given one, checkpoint storage of its own: a tmpfs mounted in the
host's mount namespace over a directory of the machine, the same path on
every host, so that each host sees only its own files there and a killed
host's files are really gone (TestHost.kill).  The hosts of one network
hang off one bridge that lives in a separate "switch" namespace, so nothing
is added to the machine's own namespace and adding a host later (a
migration target) is just one more veth on the bridge.

Everything a network creates is named with the prefix
``dmtcp-th-<pid>-<starttime>-<tag>-``: the creator's pid *and* its start time,
so that a leftover of a crashed run can be told from a live network even after
the pid is reused, and ``sweep_stale()`` can remove exactly the leftovers.

iproute2's ``ip`` is used rather than pyroute2: measured here, 3 hosts take
~30 ms with ``ip`` against ~75 ms with pyroute2 (plus ~190 ms to import it),
and ``ip``'s error messages name the failing step.

CLI (from the repository root, as root)::

    python -m tests.multihost.netns up N [--tag T] [--subnet 198.18.1.0/24]
    python -m tests.multihost.netns sweep [--prefix dmtcp-th-<pid>-<start>-<tag>-]
"""
from __future__ import annotations

import argparse
import ctypes
import errno
import ipaddress
import itertools
import os
import re
import select
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Self

NETNS_DIR = Path("/run/netns")  # where `ip netns` pins namespaces
RUN_BASE = Path("/run")         # one directory per network for the UTS pins
TEST_RANGE = ipaddress.ip_network("198.18.0.0/15")
DEFAULT_SUBNET = "198.18.0.0/24"

# Creator pid and start time are in every name so that sweep_stale() can tell
# a dead creator from a live one even after pid reuse.
_PREFIX_RE = re.compile(r"^dmtcp-th-(\d+)-(\d+)-([A-Za-z0-9_]+)-")
_RUN_DIR_RE = re.compile(r"^dmtcp-th-(\d+)-(\d+)-([A-Za-z0-9_]+)$")
_TAG_RE = re.compile(r"^[A-Za-z0-9_]{1,32}$")
_seq = itertools.count()

_MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)


class NetworkError(RuntimeError):
    pass


def _cmd(*argv: str) -> None:
    res = subprocess.run(argv, check=False, capture_output=True, text=True)
    if res.returncode != 0:
        raise NetworkError(f"{' '.join(argv)}: {res.stderr.strip()}")


def _ip(*args: str) -> None:
    _cmd("ip", *args)


def _start_time(pid: int) -> int | None:
    """Start time in clock ticks since boot, None if the pid does not exist."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces and parentheses; fields follow the last ')'.
    return int(stat.rsplit(")", 1)[1].split()[19])


def _alive(pid: int, start: int) -> bool:
    """The creator still runs: the same process (start time) and not a zombie
    (killed, not yet reaped by its parent: it will close nothing)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat.rsplit(")", 1)[1].split()
    return fields[0] != "Z" and int(fields[19]) == start


def _umount(path: Path) -> None:
    if _libc.umount2(os.fsencode(path), _MNT_DETACH) != 0:
        err = ctypes.get_errno()
        # Not a mount point (a partial creation, or already undone).
        if err not in (errno.EINVAL, errno.ENOENT):
            raise OSError(err, os.strerror(err), str(path))


_NSFS_DEV = os.stat("/proc/self/ns/net").st_dev


def _ns_id(path: Path) -> tuple[int, int] | None:
    """Identity of the namespace pinned at path; None if nothing is pinned
    there (a plain file must never be mistaken for a namespace)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if st.st_dev == _NSFS_DEV else None


def _in_namespaces(pid: int, ids: set[tuple[int, int]]) -> bool:
    for kind in ("net", "uts", "mnt"):
        try:
            st = os.stat(f"/proc/{pid}/ns/{kind}")
        except OSError:
            continue
        if (st.st_dev, st.st_ino) in ids:
            return True
    return False


def _kill_inside(ids: set[tuple[int, int]], timeout: float = 5.0) -> None:
    """SIGKILL every process inside the given namespaces and wait until they
    have left them: a namespace with a process in it outlives `ip netns del`,
    and so do its veth, bridge and addresses.  pidfds make the kill safe
    against pid reuse between the scan and the signal."""
    if not ids:
        return
    me = os.getpid()
    fds = []
    try:
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == me:
                continue
            pid = int(entry)
            if not _in_namespaces(pid, ids):
                continue
            try:
                fd = os.pidfd_open(pid)
            except OSError:
                continue
            fds.append(fd)
            if _in_namespaces(pid, ids):  # still the same process
                try:
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                except OSError:
                    pass
        # A pidfd turns readable at exit_notify(), after the task has
        # dropped its namespaces.
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        pending, deadline = set(fds), time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            for fd, _ in poller.poll(max(1, int((deadline - time.monotonic()) * 1000))):
                pending.discard(fd)
                poller.unregister(fd)
    finally:
        for fd in fds:
            os.close(fd)


STORAGE_SIZE = "4g"  # an upper bound; tmpfs takes only what is written


def _mount_storage(host: TestHost) -> None:
    """A new, empty tmpfs over the host's storage path, in its mount
    namespace only (its propagation is slave: nothing reaches the machine).
    Its source names the host's namespace, as a leftover would show."""
    _cmd("nsenter", f"--mount={host.mnt}", "--", "mount", "-t", "tmpfs",
         "-o", f"mode=0755,size={STORAGE_SIZE}", f"{host.netns}-storage", str(host.storage))


class TestHost:
    """One host: a network namespace with eth0 on the network's bridge, a
    UTS namespace with the host's name, and a mount namespace with a
    /dev/shm and pseudo-terminals (/dev/pts, /dev/ptmx) of its own and, if the network has storage, a private tmpfs
    at that path (the rest of the file system is the machine's)."""

    __test__ = False  # not a pytest test class despite the name

    def __init__(self, name: str, addr: str, netns: str, uts: Path, index: int,
                 mnt: Path | None = None, storage: Path | None = None):
        self.name = name
        self.mnt = mnt
        self.addr = addr
        self.netns = netns
        self.uts = uts
        self.index = index
        self.storage = storage  # private to this host (None: no such storage)
        self.killed = False
        self._procs: list[subprocess.Popen] = []

    def kill(self) -> None:
        """The host dies, as a machine does: its link goes down first (a dead
        machine sends nothing, no FIN and no RST: its peers see silence),
        every process inside it is SIGKILLed, and its storage is destroyed
        (the tmpfs is unmounted, so its files are gone for good; an empty one
        takes its place, so the path still shows this host's own storage, as
        a new disk would, never the machine's directory).  The link stays
        down.  Other hosts keep their storage.  Safe to call again."""
        if self.killed:
            return
        self.killed = True
        _ip("-n", self.netns, "link", "set", "eth0", "down")
        for proc in self._procs:  # one may still be in nsenter, before setns()
            proc.kill()
        _kill_inside({i for i in (_ns_id(NETNS_DIR / self.netns), _ns_id(self.uts),
                                  _ns_id(self.mnt) if self.mnt else None) if i})
        for proc in self._procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass  # unkillable (D state); close() tries again
        if self.storage is not None and self.mnt is not None:
            _cmd("nsenter", f"--mount={self.mnt}", "--", "umount", "--lazy", str(self.storage))
            _mount_storage(self)

    def __repr__(self) -> str:
        return f"TestHost(name={self.name!r}, addr={self.addr!r}, netns={self.netns!r})"

    def command(self, argv: Sequence[str]) -> list[str]:
        """argv prefixed so that it runs inside this host."""
        if isinstance(argv, (str, bytes)):
            raise TypeError("argv must be a sequence of arguments, not a string")
        mnt = [f"--mount={self.mnt}"] if self.mnt else []
        return ["nsenter", f"--net={NETNS_DIR / self.netns}", f"--uts={self.uts}", *mnt,
                "--", *map(os.fspath, argv)]

    def popen(self, argv: Sequence[str], **kw) -> subprocess.Popen:
        argv = self._open_stdio_inside(argv, kw)
        proc = subprocess.Popen(self.command(argv), **kw)
        # Kept so that close() can reap what it kills; prune the finished ones.
        self._procs = [p for p in self._procs if p.poll() is None]
        self._procs.append(proc)
        return proc

    def run(self, argv: Sequence[str], **kw) -> subprocess.CompletedProcess:
        argv = self._open_stdio_inside(argv, kw)
        return subprocess.run(self.command(argv), **kw)  # noqa: PLW1510 - caller's kw

    def _open_stdio_inside(self, argv: Sequence[str], kw: dict) -> list[str]:
        """A file or /dev/null given as stdin, stdout or stderr is opened by
        a shell inside the host, as on a real host: opened outside, it sits
        on a mount of the machine's namespace that CRIU cannot find from
        inside.  Pipes pass as they are; no stdin means /dev/null."""
        if isinstance(argv, (str, bytes)):
            raise TypeError("argv must be a sequence of arguments, not a string")
        redirections = []
        for fd, key in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
            value = kw.get(key)
            if fd == 0 and value is None and kw.get("input") is None:
                value = subprocess.DEVNULL
            if value is subprocess.DEVNULL:
                redirections.append(f"{fd}<>/dev/null")
            elif hasattr(value, "name") and isinstance(value.name, str) \
                    and value.name.startswith("/"):
                redirections.append(f"{fd}>>{shlex.quote(value.name)}" if fd else
                                    f"0<{shlex.quote(value.name)}")
            else:
                continue
            kw.pop(key, None)
        if not redirections:
            return list(map(os.fspath, argv))
        return ["/bin/sh", "-c", 'exec "$@" ' + " ".join(redirections), "sh",
                *map(os.fspath, argv)]


class TestNetwork:
    """n hosts joined by one bridge in a "switch" namespace.

    Hosts are h1, h2, ... with addresses .1, .2, ... of `subnet`, a /24 inside
    198.18.0.0/15; give networks that exist at the same time different
    subnets to keep addresses unique.  `storage`, a directory of the
    machine, becomes each host's private storage: a tmpfs of the host's own
    at that path (TestHost.storage), gone with the host's mount namespace.
    close() (also on leaving the `with` block) kills whatever still runs
    inside the hosts and removes everything made; a failure while creating
    removes what was made so far."""

    __test__ = False

    def __init__(self, n: int, tag: str | None = None, subnet: str = DEFAULT_SUBNET,
                 storage: str | os.PathLike | None = None):
        net = ipaddress.ip_network(subnet)
        if net.prefixlen != 24 or not net.subnet_of(TEST_RANGE):
            raise ValueError(f"subnet {subnet} is not a /24 inside {TEST_RANGE}")
        if storage is not None:
            # resolved: mount(8) would follow a link, and every host must
            # see the same path
            storage = Path(storage).resolve()
            if not storage.is_dir():
                raise ValueError(f"storage {storage}: not a directory of this machine")
        self.storage = storage
        tag = f"n{next(_seq)}" if tag is None else tag
        if not _TAG_RE.match(tag):
            raise ValueError(f"tag {tag!r}: letters, digits and _ only")
        pid = os.getpid()
        self.subnet = net
        self.prefix = f"dmtcp-th-{pid}-{_start_time(pid)}-{tag}-"
        self.run_dir = RUN_BASE / self.prefix.rstrip("-")
        self.switch = self.prefix + "switch"
        self.hosts: list[TestHost] = []
        self._undo: list[Callable[[], None]] = []
        self._next_index = 1
        self._closed = False
        # mkdir is the atomic claim on the prefix: a tag reused while its
        # network still exists fails here, before anything else is made.
        self.run_dir.mkdir(mode=0o700)
        self._undo.append(self.run_dir.rmdir)
        try:
            # mount namespaces are pinned on files in a private mount
            _cmd("mount", "--bind", str(self.run_dir), str(self.run_dir))
            self._undo.append(lambda: _umount(self.run_dir))
            _cmd("mount", "--make-private", str(self.run_dir))
            _ip("netns", "add", self.switch)
            self._undo.append(lambda: _ip("netns", "del", self.switch))
            _ip("-n", self.switch, "link", "set", "lo", "up")
            _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.switch, "link", "set", "br0", "up")
            for _ in range(n):
                self.add_host()
        except BaseException as exc:
            try:
                self.close()
            except Exception as cleanup:  # noqa: BLE001 - the first error matters more
                exc.add_note(f"cleanup also failed: {cleanup}")
            raise

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TestNetwork({self.prefix!r}, hosts={self.hosts!r})"

    def add_host(self) -> TestHost:
        """One more host on the bridge; on failure the network is left as it was."""
        if self._closed:
            raise NetworkError("network is closed")
        index = self._next_index
        if index > 254:
            raise NetworkError(f"{self.subnet} is full")
        name = f"h{index}"
        host = TestHost(name, str(self.subnet.network_address + index),
                        self.prefix + name, self.run_dir / f"{name}.uts", index,
                        self.run_dir / f"{name}.mnt", self.storage)
        undo: list[Callable[[], None]] = []
        try:
            self._create_host(host, undo)
        except BaseException as exc:
            _kill_inside({i for i in (_ns_id(NETNS_DIR / host.netns), _ns_id(host.uts),
                                      _ns_id(host.mnt)) if i})
            # Deleting the namespace drops the veth pair too, but
            # asynchronously; the index is reused by the next add_host(), so
            # the switch end's name must be free at once.
            try:
                _ip("-n", self.switch, "link", "del", f"veth{host.index}")
            except NetworkError:
                pass  # never made
            errors = _run_undo(undo)
            if errors:
                exc.add_note(f"cleanup also failed: {errors}")
            raise
        # close() skips the explicit veth delete (~30 ms each, an RCU grace
        # period): the pair goes with the namespaces.
        self._undo.extend(undo)
        self.hosts.append(host)
        self._next_index = index + 1
        return host

    def _create_host(self, host: TestHost, undo: list[Callable[[], None]]) -> None:
        veth = f"veth{host.index}"  # interface names are limited to 15 bytes
        os.close(os.open(host.uts, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        undo.append(host.uts.unlink)
        undo.append(lambda: _umount(host.uts))
        _cmd("unshare", f"--uts={host.uts}", "hostname", host.name)
        os.close(os.open(host.mnt, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        undo.append(host.mnt.unlink)
        undo.append(lambda: _umount(host.mnt))
        _cmd("unshare", f"--mount={host.mnt}", "--propagation", "slave",
             "mount", "-t", "tmpfs", "-o", "mode=1777,size=2g", "dmtcp-test-shm", "/dev/shm")
        # pseudo-terminals of its own too: CRIU restores a pty under its old
        # number, and two hosts restoring at once on one devpts instance
        # take each other's numbers ("Unable to open dev/ptmx with specified
        # index"); no undo: they go with the mount namespace
        _cmd("nsenter", f"--mount={host.mnt}", "--", "mount", "-t", "devpts", "-o",
             "newinstance,ptmxmode=0666,mode=620,gid=5", "dmtcp-test-pts", "/dev/pts")
        _cmd("nsenter", f"--mount={host.mnt}", "--", "mount", "--bind", "/dev/pts/ptmx",
             "/dev/ptmx")
        if host.storage is not None:
            # no undo of its own: it goes with the mount namespace
            _mount_storage(host)
        _ip("netns", "add", host.netns)
        undo.append(lambda: _ip("netns", "del", host.netns))
        # Both ends are created directly in their namespaces: nothing ever
        # appears in the machine's own namespace.
        _ip("link", "add", "eth0", "netns", host.netns, "type", "veth",
            "peer", "name", veth, "netns", self.switch)
        _ip("-n", host.netns, "link", "set", "lo", "up")
        _ip("-n", host.netns, "addr", "add", f"{host.addr}/{self.subnet.prefixlen}", "dev", "eth0")
        _ip("-n", host.netns, "link", "set", "eth0", "up")
        _ip("-n", self.switch, "link", "set", veth, "master", "br0", "up")

    def close(self) -> None:
        """Remove everything this network made; safe to call again."""
        if self._closed:
            return
        self._closed = True
        # Our own children first, by pid: one just started may still be in
        # nsenter before setns(), invisible to the namespace scan.
        for host in self.hosts:
            for proc in host._procs:
                proc.kill()
        paths = [NETNS_DIR / self.switch]
        for host in self.hosts:
            paths += [NETNS_DIR / host.netns, host.uts, host.mnt]
        _kill_inside({i for i in map(_ns_id, paths) if i})
        for host in self.hosts:
            for proc in host._procs:
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass  # unkillable (D state); the undo below reports what stays
        errors = _run_undo(self._undo)
        if errors:
            raise NetworkError(f"incomplete cleanup of {self.prefix}: {errors}")


def _run_undo(undo: list[Callable[[], None]]) -> list[BaseException]:
    """Run the undo steps newest first, every one of them even if some fail."""
    errors = []
    while undo:
        try:
            undo.pop()()
        except Exception as exc:  # noqa: BLE001 - the rest must still be removed
            errors.append(exc)
    return errors


def sweep_stale(prefix: str = "") -> list[str]:
    """Remove what networks of dead creators left behind (a crashed or killed
    test run); names of live creators and all other names are left alone.
    A prefix (a network's TestNetwork.prefix) limits the sweep to that
    network.  Returns the removed namespace names and run directories."""
    stale_netns = []
    if NETNS_DIR.is_dir():
        for name in sorted(os.listdir(NETNS_DIR)):
            m = _PREFIX_RE.match(name)
            if m and name.startswith(prefix) and not _alive(int(m[1]), int(m[2])):
                stale_netns.append(name)
    stale_dirs = []
    for name in sorted(os.listdir(RUN_BASE)):
        m = _RUN_DIR_RE.match(name)
        if m and f"{name}-".startswith(prefix) and not _alive(int(m[1]), int(m[2])) \
                and (RUN_BASE / name).is_dir():
            stale_dirs.append(RUN_BASE / name)
    pins = [f for d in stale_dirs for f in [*d.glob("*.uts"), *d.glob("*.mnt")]]
    _kill_inside({i for i in map(_ns_id, [*(NETNS_DIR / n for n in stale_netns), *pins]) if i})
    for f in pins:
        _umount(f)
        f.unlink()
    for d in stale_dirs:
        _umount(d)  # the private bind mount the pins sit on
        d.rmdir()
    for name in stale_netns:
        _ip("netns", "del", name)
    return [*stale_netns, *map(str, stale_dirs)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.multihost.netns")
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="create N hosts, keep them until SIGINT/SIGTERM")
    up.add_argument("n", type=int)
    up.add_argument("--tag")
    up.add_argument("--subnet", default=DEFAULT_SUBNET)
    sweep = sub.add_parser("sweep", help="remove leftovers of dead creators")
    sweep.add_argument("--prefix", default="", help="only this network's (dmtcp-th-...-)")
    args = parser.parse_args(argv)
    if args.cmd == "sweep":
        for name in sweep_stale(args.prefix):
            print("removed", name)
        return 0
    # Blocked from the start, so that a signal while creating still ends in
    # close() rather than killing us halfway and leaving things behind.
    stop = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    with TestNetwork(args.n, tag=args.tag, subnet=args.subnet) as net:
        for host in net.hosts:
            print(host.name, host.addr, host.netns)
        print("ready", flush=True)
        signal.sigwait(stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
