"""Per-process log files in the run directory; level from DMTCP_LOG_LEVEL.

A restart that runs the agents of several trees in one process
(cli/restarting.py) still writes one file per tree: each agent's records
go to the file named in its context (a context variable, which the tasks
it starts inherit, and so do the threads of its executor: agent/together.py)."""
from __future__ import annotations

import contextvars
import logging
import os
from pathlib import Path

from dmtcp_py import deferred_log
from dmtcp_py.paths import run_dir

_current: Path | None = None
_FORMAT = "%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s"
# the file of the agent whose work logs, where one process runs several
_own: contextvars.ContextVar[logging.Handler | None] = contextvars.ContextVar(
    "dmtcp_log_file", default=None)


def current() -> str:
    """This process's log file (its agent's, where it runs several), for
    error messages that send users to it."""
    own = _own.get()
    path = own.baseFilename if isinstance(own, logging.FileHandler) else _current
    return str(path) if path else "the log in $DMTCP_TMPDIR/dmtcp-<user>@<host>/"


def _file(name: str) -> tuple[logging.FileHandler, Path]:
    path = run_dir() / f"{name}.log"
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter(_FORMAT))
    os.chmod(path, 0o600)
    return handler, path


class _ByContext(logging.Handler):
    """Each record to the file of the agent in whose context it was logged,
    or to the process's own file."""

    def __init__(self, default: logging.Handler) -> None:
        super().__init__()
        self.default = default

    def emit(self, record: logging.LogRecord) -> None:
        (_own.get() or self.default).handle(record)


def setup(name: str) -> Path:
    """Send this process's log records to <run_dir>/<name>.log; to the file
    own_file() names instead, in a context that called it."""
    handler, path = _file(name)
    level = os.environ.get("DMTCP_LOG_LEVEL", "INFO").upper()
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(_ByContext(handler))
    root.setLevel(getattr(logging, level, logging.INFO))
    global _current
    _current = path
    deferred_log.release()  # (what a restart said before this log was there)
    return path


def own_file(name: str) -> Path:
    """From here on, in this context and those copied from it, records go
    to <run_dir>/<name>.log (one of several agents in one process)."""
    handler, path = _file(name)
    _own.set(handler)
    return path
