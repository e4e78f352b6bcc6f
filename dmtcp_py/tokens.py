"""The computation token a command or agent shows its coordinator, and
where it was looked for.  Apart from client.py (which needs the protocol's
messages) so that dmtcp-launch finds it before its heavy imports."""
from __future__ import annotations

import os

# hmac.compare_digest itself, without hmac's import of OpenSSL's hashes
# (~4 ms of every agent's and coordinator's start): with OpenSSL, hmac
# hands it that module's copy of this same constant-time comparison
from _operator import _compare_digest

from dmtcp_py.paths import token_path


def resolve_token(port: int) -> str:
    """The computation token: $DMTCP_COORD_TOKEN, else the local token file."""
    token = os.environ.get("DMTCP_COORD_TOKEN")
    if token:
        return token
    try:
        with open(token_path(port)) as f:
            return f.read().strip()
    except OSError:
        return ""


def write_token_file(port: int, token: str) -> None:
    """The coordinator's token where resolve_token() looks (0600): written by
    the coordinator, and before it by a launch that starts one (cli/coordinators.py)."""
    fd = os.open(token_path(port), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")


def remove_token_file(port: int, token: str) -> None:
    """The token file, removed if it still holds token (another coordinator
    may have taken the port since, with its own)."""
    path = token_path(port)
    try:
        with open(path) as f:
            if f.read().strip() == token:
                os.unlink(path)
    except OSError:
        pass


def same_token(shown: str, ours: str) -> bool:
    """Whether a client showed our token, in constant time (what it shows
    is compared without telling how much of it matched)."""
    return _compare_digest(shown.encode(), ours.encode())


def token_hint(port: int) -> str:
    """Where resolve_token() found the token it gave, and how to pass the
    right one: what a refused client needs to hear."""
    if os.environ.get("DMTCP_COORD_TOKEN"):
        where = "the token given in $DMTCP_COORD_TOKEN is not this coordinator's"
    else:
        path = token_path(port)
        where = (f"the token in {path} is not this coordinator's" if os.path.exists(path)
                 else f"no token: {path} does not exist")
    return (f"{where}; give it in DMTCP_COORD_TOKEN, or set DMTCP_TMPDIR to the "
            f"coordinator's (its token is in $DMTCP_TMPDIR/dmtcp-<user>@<host>/"
            f"coordinator-{port}.token)")


def refusal(host: str, port: int, error: str, wrong_token: bool) -> str:
    """One line for a coordinator's refusal of our hello."""
    why = token_hint(port) if wrong_token else error
    return f"coordinator at {host}:{port} refused us: {why}"
