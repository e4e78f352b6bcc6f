"""logging.getLogger for the modules a restart runs before CRIU starts.

The logging module (with traceback, string and threading: ~5 ms of import
here) is loaded when such a logger is first used, not when its module is:
on the way to CRIU these loggers say something only when something is
unusual, and the agent's log file is set up (logs.setup) only afterwards.
"""
from __future__ import annotations

TYPE_CHECKING = False  # (typing's own costs 4-7 ms of import)
if TYPE_CHECKING:
    import logging


class DeferredLogger:
    """Stands for logging.getLogger(name): every attribute is the real
    logger's, which is made at the first one asked for."""
    __slots__ = ("_name", "_logger")

    def __init__(self, name: str) -> None:
        self._name = name
        self._logger: logging.Logger | None = None

    def __getattr__(self, attribute: str):
        if self._logger is None:
            import logging
            self._logger = logging.getLogger(self._name)
        return getattr(self._logger, attribute)


def logger(name: str) -> DeferredLogger:
    return DeferredLogger(name)
