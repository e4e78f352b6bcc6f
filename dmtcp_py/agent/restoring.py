"""One image's restore up to CRIU's end, without asyncio (DESIGN.md 4).

Apart from start.py so that dmtcp-restart can begin it before the agent's
own modules load (asyncio, the protocol's messages: ~100 ms here): when
nothing the restore needs comes from the coordinator, CRIU restores while
they load (cli/restarting.py says when).  Either way the tree stays stopped in
its shims until its agent has joined and the round releases it; start.py
finishes the restore in the agent's loop.
"""
from __future__ import annotations

import os
import re
import signal
import sys
import threading
from pathlib import Path

from dmtcp_py import procfs
from dmtcp_py.agent import criu_driver, init_dir, stdio
from dmtcp_py.errors import ImageError, UserError
from dmtcp_py.images import (chunks, compress, integrity, shared_files, temp_files,
                             written_files)
from dmtcp_py.images.manifest import Manifest
from dmtcp_py.paths import run_dir, unprivileged

TYPE_CHECKING = False  # (what begin() runs loads no typing: cli/restarting.py)
if TYPE_CHECKING:
    from concurrent.futures import Future

# CRIU's words when a pid it must give is in use
_CRIU_PID_TAKEN = re.compile(r"Can't fork for (\d+): File exists")


def _pid_taken(pid: int, image: Path) -> str:
    """One line: which pid, held by what, why it matters, what to do."""
    name = (procfs.read(f"/proc/{pid}/comm") or "?").strip()
    return (f"cannot restart {image}: pid {pid}, which the image needs, is in use by {name}; "
            "the tree was checkpointed without a PID namespace of its own (launched on a "
            "terminal, not as root, or with DMTCP_PID_NAMESPACE=0), so it restarts only on "
            "its own pids: end that process, or restart on another host")


def _check_pids(m: Manifest, image: Path) -> None:
    """Before anything is touched: can CRIU give the tree its pids?  A tree
    with a namespace of its own gets a new one; one without needs its old
    pids free on this host."""
    if m.pid_namespace:
        if unprivileged():
            raise UserError(f"cannot restart {image}: its tree ran in a PID namespace of its "
                            "own, and only root (CAP_SYS_ADMIN) can make one")
        return
    for pid in sorted(m.pids):
        if os.path.exists(f"/proc/{pid}"):
            raise UserError(_pid_taken(pid, image))


def _criu_failure(m: Manifest, image: Path, message: str) -> str:
    """CRIU's failure, or, for a pid taken meanwhile (say a thread's, which
    the manifest does not list), which one."""
    taken = _CRIU_PID_TAKEN.search(message)
    if taken and not m.pid_namespace:
        return _pid_taken(int(taken.group(1)), image)
    return message


CHECK_SWITCH_INTERVAL = 0.0005  # seconds (sys.setswitchinterval) while the pages are checked
# checks under way in this process (several trees' agents may share it):
# the first sets the short interval, the last puts the usual one back
_checking = [0, 0.0]   # [how many, the interval before the first]
_checking_lock = threading.Lock()


def _check_began() -> None:
    with _checking_lock:
        if _checking[0] == 0:
            _checking[1] = sys.getswitchinterval()
            sys.setswitchinterval(min(_checking[1], CHECK_SWITCH_INTERVAL))
        _checking[0] += 1


def _check_ended(_future=None) -> None:
    with _checking_lock:
        _checking[0] -= 1
        if _checking[0] == 0:
            sys.setswitchinterval(_checking[1])


class Restore:
    """prepare() puts back the files the tree had; begin() starts CRIU and
    the check of the memory pages, each beside the caller; wait() is
    CRIU's end.  A failure of begin() is kept for wait() to raise: the
    agent reports it to the coordinator like CRIU's own."""

    def __init__(self, image: Path, m: Manifest, *, lazy: bool) -> None:
        self.image, self.m, self.wants_lazy = image, m, lazy
        self.init_dir: str | None = None  # the tree's init's working directory, if made
        self.handover: stdio.Handover | None = None
        self.lazy = False
        self.pages: Future | None = None   # the memory pages checked (result None: all good)
        self.pager: criu_driver.LazyPages | None = None
        self._readable = None              # chunks.readable(), open while CRIU reads
        self._criu: criu_driver.Restoring | None = None
        self._failed: Exception | None = None

    def prepare(self) -> None:
        """The pids it needs, then its files as they were.  UserError."""
        m, image = self.m, self.image
        _check_pids(m, image)
        if m.pid_namespace and m.init_dir:
            self.init_dir = init_dir.make(Path(m.init_dir))
        temp_files.restore(m.temp_files, image)
        shared_files.restore(m.shared_files, image)
        shared_files.relink(m.link_remaps)
        written_files.rollback(m.written_files)

    def begin(self, *, check: bool = True) -> None:
        """CRIU restores in a process of its own and the pages are checked
        in a thread: both run on when this returns.  (Restoring lazily, or
        with check False, the check waits for check_pages(): a lazily
        restored program runs before it ends anyway, and meanwhile the agent
        and the coordinator it waits for have the CPU; dmtcp-restart forks
        its coordinator first, which no other thread may see.)"""
        m, image = self.m, self.image
        self.handover = stdio.prepare(m.stdio, run_dir(), m.tree_id)
        self.lazy = self.wants_lazy and not compress.is_packed(image)
        if self.wants_lazy and not self.lazy:
            print(f"dmtcp-restart: warning: the memory pages of {image} are compressed: "
                  "restored whole, not lazily", file=sys.stderr, flush=True)
        work = run_dir()
        if self.lazy:  # the lazy-pages daemon's socket has a fixed name: a directory each
            work = work / f"lazy-{m.tree_id}-{os.getpid()}"
            work.mkdir(mode=0o700, exist_ok=True)
        log_path = work / f"criu-restore-{m.tree_id}-{os.getpid()}.log"
        try:
            self._readable = chunks.readable(image, m, lazy=self.lazy)
            images = self._readable.__enter__()
            if self.lazy:
                self.pager = criu_driver.LazyPages(images, work)
            self._criu = criu_driver.Restoring(images, log_path, inherit=self.handover.pairs,
                                               terminal=self.handover.terminal,
                                               lazy=self.lazy)
        except (criu_driver.CriuError, ImageError) as exc:
            self._failed = exc
        if check and not self.lazy:
            self.check_pages()

    def check_pages(self) -> None:
        """The memory pages are checked while CRIU restores them (the rest
        was, before the restart began), in a thread: the restored processes
        stay stopped in their shims until the round releases them, which
        waits for this; a lazy restart lets the program run on while they
        are checked."""
        from concurrent.futures import ThreadPoolExecutor  # (once CRIU began)
        algorithm, digests = integrity.expected(self.m)
        checker = ThreadPoolExecutor(1, thread_name_prefix="pages")
        # The hashing releases the GIL, but takes it back at every step
        # (each file, each read, each pool thread); beside the agent's
        # modules loading it waited a whole switch interval (5 ms) each
        # time: 64 MiB took 50-100 ms instead of 10, and the release could
        # wait for it.  Until the check ends, threads take turns every 0.5 ms.
        _check_began()
        self.pages = checker.submit(
            integrity.verify, self.image, integrity.split(digests)[1], algorithm,
            "the program was killed (it ran since its lazy restart)" if self.lazy
            else "the restored processes were killed before they ran", wide=not self.lazy)
        self.pages.add_done_callback(_check_ended)
        checker.shutdown(wait=False)

    def wait(self) -> int:
        """Blocks until CRIU is done: the restored root's pid.  UserError
        says what failed (damaged pages, when they explain it)."""
        try:
            if self._failed is not None:
                raise self._failed
            assert self._criu is not None
            return self._criu.wait()
        except (criu_driver.CriuError, ImageError) as exc:
            raise self._explain(exc) from None
        finally:
            if self._readable is not None:
                self._readable.__exit__(None, None, None)
                self._readable = None
            if self.handover is not None:
                self.handover.close_after_restore()

    def abandon(self) -> None:
        """No agent will take the tree over: it ends before it ever ran."""
        from dmtcp_py.agent.tree import descendants  # (and asyncio: only here)
        try:
            pid = self.wait()
        except UserError:
            pid = 0
        if pid:
            for each in reversed(descendants([pid])):
                try:
                    os.kill(each, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            os.waitpid(pid, 0)
        if self.pager is not None:
            self.pager.stop()
        if self.init_dir is not None:
            init_dir.release(self.init_dir)

    def _explain(self, exc: Exception) -> UserError:
        if self.pager is not None:
            self.pager.stop()
        # damaged pages explain a failure of CRIU's or of the decompression
        if self.pages is None:  # (a lazy restore's check had not begun)
            self.check_pages()
        try:
            self.pages.result()
        except ImageError as damaged:
            return UserError(str(damaged))
        if isinstance(exc, criu_driver.CriuError):
            return UserError(_criu_failure(self.m, self.image, str(exc)))
        return UserError(str(exc))
