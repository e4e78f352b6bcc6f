"""dmtcp: what a Python program may ask of the checkpointer.

dmtcp-launch puts this module's directory on PYTHONPATH, so a launched
program can simply `import dmtcp`.  It talks to the shim already loaded in
the process (libdmtcphijack.so, DMTCP's C API: hijack/include/dmtcp.h);
outside dmtcp every function answers as DMTCP does when absent.

    import dmtcp
    if dmtcp.is_enabled():
        dmtcp.register(before_checkpoint=flush_caches, after_restart=reopen_devices)
        if dmtcp.checkpoint() == dmtcp.AFTER_RESTART:
            print("we are the restarted copy")

Callbacks run on the shim's checkpoint thread (Python takes care of the
GIL) while the program's other threads run: before_checkpoint just before
they are stopped, after_resume and after_restart just after they go on.
A callback's exception is printed and does not stop the checkpoint.
"""
from __future__ import annotations

import ctypes
import threading
import traceback

NOT_PRESENT, AFTER_CHECKPOINT, AFTER_RESTART = 0, 1, 2

_HOOK = ctypes.CFUNCTYPE(None)
_lib = ctypes.CDLL(None)  # the process's symbols, the preloaded shim's among them
_callbacks: dict[str, list] = {"before_checkpoint": [], "after_resume": [], "after_restart": []}
_installed: list = []  # the C function pointers must outlive every checkpoint
_lock = threading.Lock()


def _symbol(name: str):
    return getattr(_lib, name, None)


def is_enabled() -> bool:
    """True when running under dmtcp-launch or dmtcp-restart."""
    fn = _symbol("dmtcp_is_enabled")
    return bool(fn and fn())


def checkpoint() -> int:
    """Checkpoint the whole computation and return when it is done:
    AFTER_CHECKPOINT, or AFTER_RESTART in a copy restarted from it;
    NOT_PRESENT outside dmtcp.  OSError if the coordinator could not be
    asked."""
    if not is_enabled():
        return NOT_PRESENT
    result = _lib.dmtcp_checkpoint()
    if result < 0:
        raise OSError("dmtcp: the checkpoint could not be requested")
    return result


def generation() -> int:
    """The generation of the last checkpoint this process took part in."""
    return _lib.dmtcp_get_generation() if is_enabled() else 0


def checkpoint_dir() -> str | None:
    """Where this process's images go."""
    if not is_enabled():
        return None
    fn = _lib.dmtcp_get_ckpt_dir
    fn.restype = ctypes.c_char_p
    value = fn()
    return value.decode() if value else None


def local_status() -> tuple[int, int]:
    """(checkpoints, restarts) this process has seen."""
    if not is_enabled():
        return 0, 0
    ckpts, restarts = ctypes.c_int(), ctypes.c_int()
    _lib.dmtcp_get_local_status(ctypes.byref(ckpts), ctypes.byref(restarts))
    return ckpts.value, restarts.value


class critical_section:
    """`with dmtcp.critical_section():` no checkpoint starts inside."""

    def __enter__(self):
        if is_enabled():
            _lib.dmtcp_disable_ckpt()
        return self

    def __exit__(self, *exc):
        if is_enabled():
            _lib.dmtcp_enable_ckpt()
        return False


def _run(kind: str) -> None:
    for fn in list(_callbacks[kind]):
        try:
            fn()
        except Exception:  # noqa: BLE001 - a callback must not stop the checkpoint
            traceback.print_exc()


def register(before_checkpoint=None, after_resume=None, after_restart=None) -> None:
    """Add callbacks (each called with no argument); any may be None."""
    with _lock:
        for kind, fn in (("before_checkpoint", before_checkpoint),
                         ("after_resume", after_resume), ("after_restart", after_restart)):
            if fn is not None:
                _callbacks[kind].append(fn)
        if not _installed and is_enabled():
            hooks = [_HOOK(lambda k=k: _run(k))
                     for k in ("before_checkpoint", "after_resume", "after_restart")]
            _installed.extend(hooks)
            _lib.dmtcp_install_hooks(*hooks)
