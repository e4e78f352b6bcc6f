"""ssh's command line, read the way ssh reads it, and the remote command
that starts the relay (pure logic: no I/O)."""
from __future__ import annotations

import shlex
from dataclasses import dataclass

# options of ssh(1) that take an argument
_WITH_ARG = set("BbcDEeFIiJLlmOoPpQRSWw")
# options after which there is no remote command of ours to carry
_NOT_A_COMMAND = set("NWOGVs")


@dataclass(frozen=True)
class SshCall:
    options: list[str]     # everything before the destination, as given
    destination: str
    command: str           # the remote command, its words joined as ssh joins them


def parse(args: list[str]) -> SshCall | None:
    """ssh's arguments (without argv[0]); None when there is no remote
    command to carry (an interactive login, -N, -W, a subsystem...) or the
    line is not one ssh would accept."""
    options: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            i += 1
            break
        if not arg.startswith("-") or arg == "-":
            break
        options.append(arg)
        j = 1
        while j < len(arg):
            letter = arg[j]
            if letter in _NOT_A_COMMAND:
                return None
            if letter in _WITH_ARG:
                if j + 1 == len(arg):  # the argument is the next word
                    if i + 1 >= len(args):
                        return None
                    i += 1
                    options.append(args[i])
                break
            j += 1
        i += 1
    if i >= len(args):
        return None
    destination, words = args[i], args[i + 1:]
    if not words:
        return None
    return SshCall(options, destination, " ".join(words))


@dataclass(frozen=True)
class Relay:
    """What the remote side needs to join the computation and call back."""
    launch: str            # dmtcp-launch on the remote host
    python: str            # the interpreter that runs dmtcp_py there
    coord_host: str
    coord_port: int
    token: str
    ckptdir: str | None
    port: int              # where dmtcp-ssh waits for the relay
    cookie: str
    tmpdir: str | None = None  # DMTCP_TMPDIR, so that the remote logs go where ours do


def remote_command(call: SshCall, relay: Relay) -> str:
    """The shell command line run on the remote host instead of the user's:
    start the relay under dmtcp-launch, detached from the ssh session (so
    the session ends at once), with the user's command as its argument."""
    q = shlex.quote
    launch = [q(relay.launch), "--join", "-h", q(relay.coord_host), "-p", str(relay.coord_port)]
    if relay.ckptdir:
        launch += ["--ckptdir", q(relay.ckptdir)]
    inner = [q(relay.python), "-m", "dmtcp_py.ssh.relay", "--port", str(relay.port),
             "--cookie", q(relay.cookie), "--", q(call.command)]
    env = f"DMTCP_COORD_TOKEN={q(relay.token)} "
    if relay.tmpdir:
        env += f"DMTCP_TMPDIR={q(relay.tmpdir)} "
    return (env + "exec setsid -f " + " ".join(launch + inner)
            + " </dev/null >/dev/null 2>&1")


def ssh_argv(ssh: str, call: SshCall, remote: str) -> list[str]:
    return [ssh, *call.options, call.destination, remote]
