"""Per-process log files in the run directory; level from DMTCP_LOG_LEVEL."""
from __future__ import annotations

import logging
import os
from pathlib import Path

from dmtcp_py.paths import run_dir

_current: Path | None = None


def current() -> str:
    """This process's log file, for error messages that send users to it."""
    return str(_current) if _current else "the log in $DMTCP_TMPDIR/dmtcp-<user>@<host>/"


def setup(name: str) -> Path:
    """Send this process's log records to <run_dir>/<name>.log."""
    path = run_dir() / f"{name}.log"
    level = os.environ.get("DMTCP_LOG_LEVEL", "INFO").upper()
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter(
        "%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level, logging.INFO))
    os.chmod(path, 0o600)
    global _current
    _current = path
    return path
