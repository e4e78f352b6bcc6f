"""The usual command lines of dmtcp-launch and of `dmtcp-command -s/-l`,
read without click (whose import alone takes about 20 ms, a third of what
those commands may take in all).  Anything else (--help, --version, a
value to complain about, an option these do not know) gives None, and the
command reads its line with click, which has the last word on every
message.  Same options, same environment variables, same defaults."""
from __future__ import annotations

import math
import os

from dmtcp_py.paths import DEFAULT_PORT

AUTO = "auto"  # -i auto (base.AUTO)
# click's words for a boolean environment variable (DMTCP_GZIP)
_TRUE = ("1", "true", "t", "yes", "y", "on")
_FALSE = ("0", "false", "f", "no", "n", "off")


def _port(text: str | None) -> int | None:
    if text is None or not text.isascii() or not text.isdigit():
        return None
    port = int(text)
    return port if port <= 65535 else None


def _interval(text: str) -> float | str | None:
    """-i: seconds or auto (base.IntervalType); None: click's to refuse."""
    if text.strip().lower() == AUTO:
        return AUTO
    try:
        seconds = float(text)
    except ValueError:
        return None
    return seconds if 0 <= seconds and math.isfinite(seconds) else None


class _Line:
    """The words of a command line, one option at a time."""

    def __init__(self, words: list[str]) -> None:
        self.words = words
        self.at = 0

    def next_option(self) -> tuple[str, str | None] | None:
        """(option, its value after '=' or None); None at the first word
        that is not an option ('--' is taken)."""
        if self.at >= len(self.words):
            return None
        word = self.words[self.at]
        if word == "--":
            self.at += 1
            return None
        if not word.startswith("-") or word == "-":
            return None
        self.at += 1
        if word.startswith("--") and "=" in word:
            name, value = word.split("=", 1)
            return name, value
        return word, None

    def value(self, inline: str | None) -> str | None:
        if inline is not None:
            return inline
        if self.at >= len(self.words):
            return None
        self.at += 1
        return self.words[self.at - 1]

    def rest(self) -> list[str]:
        return self.words[self.at:]


class Coordinates:
    """-h/--coord-host and -p/--coord-port, their environment variables and defaults."""

    def __init__(self) -> None:
        self.host = os.environ.get("DMTCP_COORD_HOST") or "127.0.0.1"
        env_port = os.environ.get("DMTCP_COORD_PORT")
        self.port = _port(env_port) if env_port else DEFAULT_PORT

    def take(self, line: _Line, option: str, inline: str | None) -> bool | None:
        """True: option was one of ours and is taken; False: not ours;
        None: its value is for click to refuse."""
        if option in ("-h", "--coord-host"):
            self.host = line.value(inline)
            return None if not self.host else True
        if option in ("-p", "--coord-port"):
            self.port = _port(line.value(inline))
            return None if self.port is None else True
        return False


class LaunchArgs:
    """What dmtcp-launch was asked, as its click command reads it too."""

    def __init__(self, *, host: str, port: int, join: bool, new_coordinator: bool,
                 ckptdir: str | None, interval: float | str | None, gzip: bool,
                 program: str, args: list[str], keep: int | None = None,
                 incremental: bool = False) -> None:
        self.host, self.port = host, port
        self.join, self.new_coordinator = join, new_coordinator
        self.ckptdir, self.interval, self.gzip = ckptdir, interval, gzip
        self.keep, self.incremental = keep, incremental
        self.program, self.args = program, args


def _flag_env(name: str) -> bool | None:
    """A boolean environment variable as click reads it; None: not one."""
    text = os.environ.get(name, "").strip().lower()
    if text and text not in _TRUE + _FALSE:
        return None
    return text in _TRUE


def _keep(text: str | None) -> int | None:
    """--keep N: N >= 0; None: click's to refuse."""
    if text is None or not text.strip().isascii() or not text.strip().isdigit():
        return None
    return int(text)


def launch_args(words: list[str]) -> LaunchArgs | None:
    where = Coordinates()
    if where.port is None:
        return None
    join = new = False
    ckptdir = None
    interval: float | str | None = None
    if os.environ.get("DMTCP_CHECKPOINT_INTERVAL"):
        interval = _interval(os.environ["DMTCP_CHECKPOINT_INTERVAL"])
        if interval is None:
            return None
    gzip, incremental = _flag_env("DMTCP_GZIP"), _flag_env("DMTCP_INCREMENTAL")
    if gzip is None or incremental is None:
        return None
    keep = None
    if os.environ.get("DMTCP_KEEP"):
        keep = _keep(os.environ["DMTCP_KEEP"])
        if keep is None:
            return None
    line = _Line(words)
    while (found := line.next_option()) is not None:
        option, inline = found
        taken = where.take(line, option, inline)
        if taken is None:
            return None
        if taken:
            continue
        if inline is not None and option in ("-j", "--join", "--new-coordinator",
                                             "--gzip", "--no-gzip", "--incremental",
                                             "--no-incremental"):
            return None  # a value for a flag: click's to refuse
        if option in ("-j", "--join"):
            join = True
        elif option == "--new-coordinator":
            new = True
        elif option in ("--gzip", "--no-gzip"):
            gzip = option == "--gzip"
        elif option in ("--incremental", "--no-incremental"):
            incremental = option == "--incremental"
        elif option == "--keep":
            keep = _keep(line.value(inline))
            if keep is None:
                return None
        elif option == "--ckptdir":
            ckptdir = line.value(inline)
            if ckptdir is None:
                return None
        elif option in ("-i", "--interval"):
            text = line.value(inline)
            interval = _interval(text) if text is not None else None
            if interval is None:
                return None
        else:
            return None  # --help, --version, or one to complain about
    rest = line.rest()
    if not rest:
        return None  # no program: click says so
    return LaunchArgs(host=where.host, port=where.port, join=join, new_coordinator=new,
                      ckptdir=ckptdir, interval=interval, gzip=gzip, program=rest[0],
                      args=rest[1:], keep=keep, incremental=incremental)


class StatusArgs:
    """`dmtcp-command -s` or `-l`, with --json or without."""

    def __init__(self, host: str, port: int, listing: bool, as_json: bool) -> None:
        self.host, self.port = host, port
        self.listing, self.as_json = listing, as_json


def status_args(words: list[str]) -> StatusArgs | None:
    where = Coordinates()
    if where.port is None:
        return None
    actions: set[str] = set()
    as_json = False
    line = _Line(words)
    while (found := line.next_option()) is not None:
        option, inline = found
        taken = where.take(line, option, inline)
        if taken is None:
            return None
        if taken:
            continue
        if inline is not None:
            return None
        if option in ("-s", "--status"):
            actions.add("status")
        elif option in ("-l", "--list"):
            actions.add("list")
        elif option == "--json":
            as_json = True
        else:
            return None
    if line.rest() or len(actions) != 1:
        return None
    return StatusArgs(where.host, where.port, actions == {"list"}, as_json)


# the commands of dmtcp-command that take no value, by their options
# (command_click.py's flag values); -s and -l are status_args'
_ACTIONS = {"-c": "checkpoint", "--checkpoint": "checkpoint",
            "-bc": "bcheckpoint", "--bcheckpoint": "bcheckpoint",
            "-kc": "kcheckpoint", "--kcheckpoint": "kcheckpoint",
            "-k": "kill", "--kill": "kill", "-q": "quit", "--quit": "quit"}


class ActionArgs:
    """`dmtcp-command -c`, `-bc`, `-kc`, `-k` or `-q` (command_click.py's action)."""

    def __init__(self, host: str, port: int, action: str) -> None:
        self.host, self.port, self.action = host, port, action

    @property
    def blocking(self) -> bool:
        return self.action in ("bcheckpoint", "kcheckpoint")


def action_args(words: list[str]) -> ActionArgs | None:
    """One of _ACTIONS, with -h/-p at most; None for anything else (a
    second command, --json, --help...: click's to read)."""
    where = Coordinates()
    if where.port is None:
        return None
    actions: set[str] = set()
    line = _Line(words)
    while (found := line.next_option()) is not None:
        option, inline = found
        taken = where.take(line, option, inline)
        if taken is None:
            return None
        if taken:
            continue
        if inline is not None or option not in _ACTIONS:
            return None
        actions.add(_ACTIONS[option])
    if line.rest() or len(actions) != 1:
        return None
    return ActionArgs(where.host, where.port, actions.pop())
