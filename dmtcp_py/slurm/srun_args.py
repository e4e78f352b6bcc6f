"""srun's command line, read the way srun reads it, and the one dmtcp-srun
gives the real srun (pure logic: no I/O)."""
from __future__ import annotations

import shlex
from dataclasses import dataclass

# srun's options that take an argument (Slurm 22.05, `srun --help`)
_SHORT_WITH_ARG = set("AbcdDeiJLMmNnopqrSTtWwxBGC")
_LONG_WITH_ARG = {
    "account", "acctg-freq", "bb", "bbf", "bcast-exclude", "begin", "cpus-per-task",
    "comment", "container", "cpu-freq", "dependency", "deadline", "delay-boot", "chdir",
    "export", "error", "epilog", "gres", "gres-flags", "input", "jobid", "job-name",
    "licenses", "clusters", "distribution", "mail-type", "mail-user", "mcs-label", "mpi",
    "ntasks", "ntasks-per-node", "nodes", "output", "het-group", "partition", "power",
    "priority", "prolog", "profile", "qos", "relative", "core-spec", "signal",
    "slurmd-debug", "switches", "task-epilog", "task-prolog", "thread-spec", "threads",
    "time", "time-min", "wait", "wckey", "cluster-constraint", "constraint", "mem",
    "mincpus", "reservation", "tmp", "nodelist", "exclude", "mem-per-cpu",
    "sockets-per-node", "cores-per-socket", "threads-per-core", "extra-node-info",
    "ntasks-per-core", "ntasks-per-socket", "cpus-per-gpu", "gpus", "gpu-bind", "gpu-freq",
    "gpus-per-node", "gpus-per-socket", "gpus-per-task", "mem-per-gpu", "cpu-bind", "hint",
    "mem-bind", "network", "ntasks-per-gpu", "accel-bind", "open-mode", "uid", "gid",
    "nodefile", "kill-command",
}
# options after which srun does something else than start a command's tasks
_NOT_A_LAUNCH = {"help", "usage", "version", "pty", "test-only", "multi-prog"}
_SHORT_NOT_A_LAUNCH = set("hV")

# what a task must not inherit from the calling tree: its agent (the shim
# stays inert without one), and the wrappers' own marks
DIRECT_MARKS = ("DMTCP_SRUN_DIRECT", "DMTCP_SSH_DIRECT")
UNSET_IN_TASKS = ("DMTCP_AGENT_SOCK", *DIRECT_MARKS)


class SrunUsageError(ValueError):
    """A command line srun would refuse, or one we cannot carry."""


@dataclass(frozen=True)
class SrunCall:
    options: list[str]            # every word before the command, as given
    command: list[str]            # the command and its arguments
    kill_on_bad_exit: bool = False
    export: str | None = None     # the value of --export, if given
    export_index: int = -1        # where in options it is (its word, or the pair's first)


def parse(args: list[str]) -> SrunCall | None:
    """srun's arguments (without argv[0]); None when srun is to do something
    else than start a command (--help, --version, --pty, --multi-prog, no
    command...): the real srun then runs unchanged."""
    options: list[str] = []
    kill = False
    export, export_index = None, -1
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            i += 1
            break
        if not arg.startswith("-") or arg == "-":
            break
        start = len(options)
        options.append(arg)
        if arg.startswith("--"):
            name, eq, value = arg[2:].partition("=")
            if name in _NOT_A_LAUNCH:
                return None
            if name in _LONG_WITH_ARG and not eq:
                if i + 1 >= len(args):
                    raise SrunUsageError(f"option --{name} needs an argument")
                i += 1
                value = args[i]
                options.append(value)
            if name == "kill-on-bad-exit":
                kill = value.strip() not in ("0",) if eq else True
            elif name == "export":
                export, export_index = value, start
        else:
            j = 1
            while j < len(arg):
                letter = arg[j]
                if letter in _SHORT_NOT_A_LAUNCH:
                    return None
                if letter == "K":  # -K, or -K0 / -K1 (its optional argument)
                    rest = arg[j + 1:]
                    kill = rest != "0"
                    if rest.isdigit():
                        break
                if letter in _SHORT_WITH_ARG:
                    if j + 1 == len(arg):
                        if i + 1 >= len(args):
                            raise SrunUsageError(f"option -{letter} needs an argument")
                        i += 1
                        options.append(args[i])
                    break
                j += 1
        i += 1
    if i >= len(args):
        return None
    return SrunCall(options, list(args[i:]), kill, export, export_index)


def export_value(call: SrunCall, env_names: list[str]) -> str:
    """--export for the real srun.  Its tasks must not inherit the calling
    tree's agent or the shim (the shim, preloaded with an agent's address,
    would join the task's first processes to the caller's tree), and srun
    22.05 does not let `--export=ALL,NAME=` clear a variable: so the names
    to pass go in a list, which passes only those (and SLURM_*)."""
    dropped = {"LD_PRELOAD", *UNSET_IN_TASKS}
    asked = call.export
    if asked is None or asked.upper() == "ALL" or asked.upper().startswith("ALL,"):
        extra = [] if asked is None else asked.split(",")[1:]
        names = [n for n in sorted(env_names) if n not in dropped and _plain(n)]
        return ",".join(names + [e for e in extra if e.split("=", 1)[0] not in dropped])
    ours = ["DMTCP_COORD_TOKEN", "DMTCP_TMPDIR"]
    if asked.upper() == "NONE":
        return ",".join(n for n in ours if n in env_names) or "NONE"
    items = [e for e in asked.split(",") if e and e.split("=", 1)[0] not in dropped]
    return ",".join(items + [n for n in ours if n in env_names and n not in items])


def _plain(name: str) -> bool:
    """A name srun's list can carry (no '=' or ',', not empty)."""
    return bool(name) and "," not in name and "=" not in name


@dataclass(frozen=True)
class TaskLaunch:
    """What each task runs on its node to start its tree, detached."""
    setsid: str            # setsid(1), by its path (the tasks may have no PATH)
    launch: str            # dmtcp-launch
    python: str            # the interpreter that runs dmtcp_py on the nodes
    coord_host: str
    coord_port: int
    ckptdir: str | None
    port: int              # where dmtcp-srun waits for the tasks
    cookie: str


# the task exits at once: its tree goes on outside the step (setsid -f)
_DETACH = 'exec "$0" -f "$@" </dev/null >/dev/null 2>&1'


def srun_argv(srun: str, call: SrunCall, task: TaskLaunch, export: str) -> list[str]:
    """The real srun's command line: the caller's options (--export
    replaced), and as the command a shell that starts, detached,
    `dmtcp-launch --join ... python -m dmtcp_py.slurm.task ... -- CMD`."""
    options = list(call.options)
    if call.export_index >= 0:
        word = options[call.export_index]
        if word.startswith("--export="):
            options[call.export_index] = f"--export={export}"
        else:
            options[call.export_index + 1] = export
    else:
        options.append(f"--export={export}")
    launch = [task.launch, "--join", "-h", task.coord_host, "-p", str(task.coord_port)]
    if task.ckptdir:
        launch += ["--ckptdir", task.ckptdir]
    inner = [task.python, "-m", "dmtcp_py.slurm.task", "--port", str(task.port),
             "--cookie", task.cookie, "--", *call.command]
    return [srun, *options, "/bin/sh", "-c", _DETACH, task.setsid, *launch, *inner]


def describe(argv: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)
