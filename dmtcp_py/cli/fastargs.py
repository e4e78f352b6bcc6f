"""The usual command lines of dmtcp-launch, dmtcp-restart, dmtcp-coordinator and of
`dmtcp-command -s/-l/-c/-bc/-kc/-k/-q`,
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
                 incremental: bool = False, precopy: bool = False) -> None:
        self.host, self.port = host, port
        self.join, self.new_coordinator = join, new_coordinator
        self.ckptdir, self.interval, self.gzip = ckptdir, interval, gzip
        self.keep, self.incremental, self.precopy = keep, incremental or precopy, precopy
        self.program, self.args = program, args


def _flag_env(name: str) -> tuple[bool, bool | None]:
    """A boolean environment variable as click reads it: (whether click
    takes it, its value; None if unset or empty)."""
    text = os.environ.get(name, "").strip().lower()
    if not text:
        return True, None
    return text in _TRUE + _FALSE, text in _TRUE


def _keep(text: str | None) -> int | None:
    """--keep N: N >= 0; None: click's to refuse."""
    if text is None or not text.strip().isascii() or not text.strip().isdigit():
        return None
    return int(text)


def _options(line: _Line, where: Coordinates | None, flags: dict[str, tuple[str, object]],
             valued: dict[str, tuple[str, object]], got: dict) -> bool:
    """Read options up to the first word that is not one into got: a flag
    sets its dest to its value, a valued option its dest to convert(text).
    False: the line is click's (an option not known here, a value for a
    flag, a value convert refuses, --help, --version)."""
    while (found := line.next_option()) is not None:
        option, inline = found
        taken = where.take(line, option, inline) if where is not None else False
        if taken is None:
            return False
        if taken:
            continue
        if option in flags:
            if inline is not None:
                return False  # a value for a flag: click's to refuse
            dest, value = flags[option]
            got[dest] = value
        elif option in valued:
            dest, convert = valued[option]
            text = line.value(inline)
            value = convert(text) if text is not None else None
            if value is None:
                return False
            got[dest] = value
        else:
            return False
    return True


def _text(text: str) -> str | None:
    return text or None


def _generation(text: str) -> int | None:
    """--generation N: N >= 1; None: click's to refuse."""
    n = _keep(text)
    return n if n else None


# what dmtcp-launch and dmtcp-restart share (common.py's options)
_CHOICE_FLAGS = {"-j": ("join", True), "--join": ("join", True),
                 "--new-coordinator": ("new_coordinator", True),
                 "--gzip": ("gzip", True), "--no-gzip": ("gzip", False),
                 "--incremental": ("incremental", True),
                 "--no-incremental": ("incremental", False),
                 "--precopy": ("precopy", True), "--no-precopy": ("precopy", False)}
_CHOICE_VALUED = {"--keep": ("keep", _keep), "--ckptdir": ("ckptdir", _text)}


def _from_environment(unset: bool | None = False) -> dict | None:
    """What the environment says for the options above (a flag in it
    neither set nor given: unset, click's default); None: click's to refuse."""
    got: dict = {"join": False, "new_coordinator": False, "ckptdir": None, "keep": None}
    for dest, name in (("gzip", "DMTCP_GZIP"), ("incremental", "DMTCP_INCREMENTAL"),
                       ("precopy", "DMTCP_PRECOPY")):
        valid, value = _flag_env(name)
        if not valid:
            return None
        got[dest] = unset if value is None else value
    if os.environ.get("DMTCP_KEEP"):
        got["keep"] = _keep(os.environ["DMTCP_KEEP"])
        if got["keep"] is None:
            return None
    return got


def launch_args(words: list[str]) -> LaunchArgs | None:
    where = Coordinates()
    got = _from_environment()
    if where.port is None or got is None:
        return None
    got["interval"] = None
    if os.environ.get("DMTCP_CHECKPOINT_INTERVAL"):
        got["interval"] = _interval(os.environ["DMTCP_CHECKPOINT_INTERVAL"])
        if got["interval"] is None:
            return None
    line = _Line(words)
    valued = {**_CHOICE_VALUED, "-i": ("interval", _interval), "--interval": ("interval", _interval)}
    if not _options(line, where, _CHOICE_FLAGS, valued, got):
        return None
    rest = line.rest()
    if not rest:
        return None  # no program: click says so
    return LaunchArgs(host=where.host, port=where.port, program=rest[0], args=rest[1:], **got)


class RestartArgs:
    """What dmtcp-restart was asked, as its click command reads it too."""

    def __init__(self, *, host: str, port: int, join: bool, new_coordinator: bool,
                 ckptdir: str | None, gzip: bool | None, incremental: bool | None,
                 keep: int | None, any_owner: bool, allow_changed_files: bool, lazy: bool,
                 generation: int | None, images: list[str], precopy: bool | None = None
                 ) -> None:
        self.host, self.port = host, port
        self.join, self.new_coordinator = join, new_coordinator
        # None: not said, as the image's tree had it (restarting.tree_options)
        self.ckptdir, self.gzip, self.keep = ckptdir, gzip, keep
        self.incremental, self.precopy = incremental, precopy
        self.any_owner, self.allow_changed_files = any_owner, allow_changed_files
        self.lazy, self.generation = lazy, generation
        self.images = images


def restart_args(words: list[str]) -> RestartArgs | None:
    where = Coordinates()
    got = _from_environment(unset=None)
    if where.port is None or got is None:
        return None
    got.update(any_owner=False, allow_changed_files=False, lazy=False, generation=None)
    flags = {**_CHOICE_FLAGS, "--any-owner": ("any_owner", True),
             "--allow-changed-files": ("allow_changed_files", True), "--lazy": ("lazy", True)}
    valued = {**_CHOICE_VALUED, "--generation": ("generation", _generation)}
    if "--" in words:
        return None  # what follows is images only: click's
    images: list[str] = []
    line = _Line(words)
    while True:  # click takes options between the images too
        if not _options(line, where, flags, valued, got):
            return None
        if line.at >= len(line.words):
            break
        images.append(line.words[line.at])
        line.at += 1
    if not images:
        return None  # click says that IMAGE is missing
    return RestartArgs(host=where.host, port=where.port, images=images, **got)


class StatusArgs:
    """`dmtcp-command -s` or `-l`, with --json or without."""

    def __init__(self, host: str, port: int, listing: bool, as_json: bool) -> None:
        self.host, self.port = host, port
        self.listing, self.as_json = listing, as_json


_STATUS_FLAGS = {"-s": ("status", True), "--status": ("status", True),
                 "-l": ("list", True), "--list": ("list", True), "--json": ("json", True)}


def status_args(words: list[str]) -> StatusArgs | None:
    where = Coordinates()
    if where.port is None:
        return None
    got = {"status": False, "list": False, "json": False}
    line = _Line(words)
    if not _options(line, where, _STATUS_FLAGS, {}, got):
        return None
    if line.rest() or got["status"] == got["list"]:
        return None
    return StatusArgs(where.host, where.port, got["list"], got["json"])


# the commands of dmtcp-command that take no value, by their options
# (command_click.py's flag values); -s and -l are status_args'
_ACTIONS = {"-c": "checkpoint", "--checkpoint": "checkpoint",
            "-bc": "bcheckpoint", "--bcheckpoint": "bcheckpoint",
            "-kc": "kcheckpoint", "--kcheckpoint": "kcheckpoint",
            "-k": "kill", "--kill": "kill", "-q": "quit", "--quit": "quit"}
_ACTION_FLAGS = {option: (action, True) for option, action in _ACTIONS.items()}


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
    got: dict[str, bool] = {}
    line = _Line(words)
    if not _options(line, where, _ACTION_FLAGS, {}, got):
        return None
    if line.rest() or len(got) != 1:
        return None
    return ActionArgs(where.host, where.port, next(iter(got)))


class CoordinatorArgs:
    """What dmtcp-coordinator was asked, as its click command reads it too.
    None: the option's default (coordinating.py has them)."""

    def __init__(self, *, port: int, listen_host: str = "127.0.0.1",
                 port_file: str | None = None, ckptdir: str | None = None,
                 interval: float | str = 0, exit_on_last: bool = False,
                 exit_after_ckpt: bool = False, auto_restart: bool = False,
                 max_restarts: int | None = None, hosts: str | None = None,
                 heartbeat: float | None = None, heartbeat_timeout: float | None = None,
                 replicas: int = 0, keep: int | None = None, rebalance: bool = False,
                 rebalance_after: float | None = None, daemon: bool = False,
                 quiet: bool = False) -> None:
        self.port, self.listen_host, self.port_file = port, listen_host, port_file
        self.ckptdir, self.interval, self.keep = ckptdir, interval, keep
        self.exit_on_last, self.exit_after_ckpt = exit_on_last, exit_after_ckpt
        self.auto_restart, self.max_restarts, self.hosts = auto_restart, max_restarts, hosts
        self.heartbeat, self.heartbeat_timeout = heartbeat, heartbeat_timeout
        self.replicas = replicas
        self.rebalance, self.rebalance_after = rebalance, rebalance_after
        self.daemon, self.quiet = daemon, quiet


# the coordinator's options for recovery, replicas and rebalancing, and
# their variables, are click's alone
_COORDINATOR_CLICK_ENV = ("DMTCP_AUTO_RESTART", "DMTCP_MAX_RESTARTS", "DMTCP_HOSTS",
                          "DMTCP_HEARTBEAT", "DMTCP_HEARTBEAT_TIMEOUT", "DMTCP_REPLICAS",
                          "DMTCP_REBALANCE", "DMTCP_REBALANCE_AFTER")
_COORDINATOR_FLAGS = {"--daemon": ("daemon", True), "--exit-on-last": ("exit_on_last", True),
                      "--exit-after-ckpt": ("exit_after_ckpt", True),
                      "-q": ("quiet", True), "--quiet": ("quiet", True)}


def _file(text: str) -> str | None:
    """--port-file: not a directory (click.Path(dir_okay=False))."""
    return text if text and not os.path.isdir(text) else None


def _directory(text: str) -> str | None:
    """--ckptdir: not a file (click.Path(file_okay=False))."""
    return text if text and not (os.path.exists(text) and not os.path.isdir(text)) else None


def coordinator_args(words: list[str]) -> CoordinatorArgs | None:
    if any(os.environ.get(name) for name in _COORDINATOR_CLICK_ENV):
        return None
    env_port = os.environ.get("DMTCP_COORD_PORT")
    got: dict = {"port": _port(env_port) if env_port else DEFAULT_PORT}
    for dest, name, convert in (("ckptdir", "DMTCP_CHECKPOINT_DIR", _directory),
                                ("interval", "DMTCP_CHECKPOINT_INTERVAL", _interval),
                                ("keep", "DMTCP_KEEP", _keep)):
        if os.environ.get(name):
            got[dest] = convert(os.environ[name])
    if any(value is None for value in got.values()):
        return None  # a variable for click to refuse
    valued = {"-p": ("port", _port), "--coord-port": ("port", _port),
              "--listen": ("listen_host", _text), "--port-file": ("port_file", _file),
              "--ckptdir": ("ckptdir", _directory), "-i": ("interval", _interval),
              "--interval": ("interval", _interval), "--keep": ("keep", _keep)}
    line = _Line(words)
    if not _options(line, None, _COORDINATOR_FLAGS, valued, got) or line.rest():
        return None
    return CoordinatorArgs(**got)
