"""logging.getLogger for the modules a restart runs before CRIU starts.

The logging module (with traceback, string and threading: ~5 ms of import
here) is loaded when such a logger is first used, not when its module is:
on the way to CRIU these loggers say something only when something is
unusual, and the agent's log file is set up (logs.setup) only afterwards.
What they say after hold() and before release() (a restart that puts the
tree's files back before its agent, and so its log, is there: a file cut
back, one restored although it changed) waits for that log, with the time
it was said; released with no log file, the warnings go to stderr, as
logging says what no handler takes.
"""
from __future__ import annotations

import sys
import time

TYPE_CHECKING = False  # (typing's own costs 4-7 ms of import)
if TYPE_CHECKING:
    import logging

_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "exception": 40, "critical": 50}
# (name, level, when, msg, args, exc_info) said while held; None: not held
_held: list[tuple] | None = None


def hold() -> None:
    """From now on what these loggers say waits for release()."""
    global _held
    _held = []


def release() -> None:
    """Say what waited since hold(), through the real loggers, each record
    with the time it was said (logs.setup calls this)."""
    global _held
    held, _held = _held, None
    if not held:
        return
    import logging
    for name, level, when, msg, args, exc_info in held:
        logger = logging.getLogger(name)
        if not logger.isEnabledFor(level):
            continue
        record = logger.makeRecord(name, level, "(before the log)", 0, msg, args, exc_info)
        record.created, record.msecs = when, (when % 1) * 1000
        logger.handle(record)


class DeferredLogger:
    """Stands for logging.getLogger(name): every attribute is the real
    logger's, which is made at the first one asked for."""
    __slots__ = ("_name", "_logger")

    def __init__(self, name: str) -> None:
        self._name = name
        self._logger: logging.Logger | None = None

    def __getattr__(self, attribute: str):
        if _held is not None and attribute in _LEVELS:
            return lambda msg, *args, **_: _held.append(
                (self._name, _LEVELS[attribute], time.time(), msg, args,
                 sys.exc_info() if attribute == "exception" else None))
        if self._logger is None:
            import logging
            self._logger = logging.getLogger(self._name)
        return getattr(self._logger, attribute)


def logger(name: str) -> DeferredLogger:
    return DeferredLogger(name)
