"""Where things live: the per-user run directory, logs, tokens, the shim."""
from __future__ import annotations

import getpass
import os
import socket
from pathlib import Path

DEFAULT_PORT = 7779


def hostname() -> str:
    return socket.gethostname()


def run_dir() -> Path:
    """$DMTCP_TMPDIR/dmtcp-<user>@<host>/, 0700: logs and tokens."""
    base = Path(os.environ.get("DMTCP_TMPDIR") or "/tmp")
    path = base / f"dmtcp-{getpass.getuser()}@{hostname()}"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def token_file(port: int) -> Path:
    return run_dir() / f"coordinator-{port}.token"


def shim_library() -> Path:
    """The LD_PRELOAD library: $DMTCP_HIJACK_LIB, else the one built in the
    source tree next to this package (the project installs editable)."""
    override = os.environ.get("DMTCP_HIJACK_LIB")
    if override:
        return Path(override)
    return Path(__file__).resolve().parent.parent / "hijack" / "build" / "libdmtcphijack.so"


def tree_init() -> Path:
    """The static init at the root of every tree, built beside the shim."""
    return shim_library().parent / "dmtcp_tree_init"


ROOT_CRIU = "/usr/local/sbin/criu"
# The copy set-up gives CAP_CHECKPOINT_RESTORE (scripts/install-criu.sh),
# for users who are not root
USER_CRIU = "/usr/local/libexec/dmtcp_py/criu"


def unprivileged() -> bool:
    """CRIU runs as a user who is not root: --unprivileged, its own copy."""
    return os.geteuid() != 0


def criu_binary() -> str:
    override = os.environ.get("DMTCP_CRIU")
    if override:
        return override
    return USER_CRIU if unprivileged() else ROOT_CRIU


def tool(name: str) -> str:
    """Absolute path of one of our console scripts, for scripts we write."""
    import sys
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name
