"""Where things live: the per-user run directory, logs, tokens, the shim.

Light on purpose: dmtcp-launch reads these before it starts the program,
when every millisecond of import is one the program waits (pathlib, socket
and getpass alone cost about 15 ms), so they come in only when a function
that returns a Path is called."""
from __future__ import annotations

import os

TYPE_CHECKING = False  # (typing's costs 7 ms of import)
if TYPE_CHECKING:
    from pathlib import Path

DEFAULT_PORT = 7779


def hostname() -> str:
    """socket.gethostname() says the same: the kernel's node name."""
    return os.uname().nodename


_PASSWD_NAME: dict[int, str] = {}  # uid -> name: the password database is read once


def user() -> str:
    """The user's login name, as getpass.getuser() finds it."""
    for name in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        if found := os.environ.get(name):
            return found
    uid = os.getuid()
    if uid not in _PASSWD_NAME:
        import pwd
        _PASSWD_NAME[uid] = pwd.getpwuid(uid).pw_name
    return _PASSWD_NAME[uid]


def run_dir_name() -> str:
    """$DMTCP_TMPDIR/dmtcp-<user>@<host>/, made 0700 if missing: logs and tokens."""
    base = os.environ.get("DMTCP_TMPDIR") or "/tmp"
    path = os.path.join(base, f"dmtcp-{user()}@{hostname()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except FileNotFoundError:
        os.makedirs(path, 0o700, exist_ok=True)
    # (a chmod that changes nothing still writes the inode's ctime: every
    # process asks this several times, a many-tree restart's agents at once)
    if os.stat(path).st_mode & 0o7777 != 0o700:
        os.chmod(path, 0o700)
    return path


def run_dir() -> Path:
    from pathlib import Path
    return Path(run_dir_name())


def token_path(port: int) -> str:
    return os.path.join(run_dir_name(), f"coordinator-{port}.token")


def token_file(port: int) -> Path:
    from pathlib import Path
    return Path(token_path(port))


def shim_library() -> str:
    """The LD_PRELOAD library: $DMTCP_HIJACK_LIB, else the one built in the
    source tree next to this package (the project installs editable)."""
    override = os.environ.get("DMTCP_HIJACK_LIB")
    if override:
        return override
    source = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    return os.path.join(source, "hijack", "build", "libdmtcphijack.so")


def tree_init() -> str:
    """The static init at the root of every tree, built beside the shim."""
    return os.path.join(os.path.dirname(shim_library()), "dmtcp_tree_init")


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
    candidate = os.path.join(os.path.dirname(sys.executable), name)
    return candidate if os.path.exists(candidate) else name
