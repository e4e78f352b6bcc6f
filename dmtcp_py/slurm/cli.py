"""dmtcp-slurm: checkpoint/restart inside a Slurm job.

  dmtcp-slurm run [options] -- CMD [ARGS...]   in a job script (with exec)
  dmtcp-slurm rsh HOST COMMAND                 the restart script's remote shell

`run` is the I/O around dmtcp_py.slurm.job: a coordinator per job (its own
free port, token and directories under --dir), launch or restart from the
newest complete generation onto this allocation's nodes
(dmtcp_py.slurm.nodes), and signals turned into checkpoints and requeues.
"""
from __future__ import annotations

import ipaddress
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import click

from dmtcp_py import __version__
from dmtcp_py.cli.base import CONTEXT, INTERVAL, run as run_command
from dmtcp_py.errors import UserError
from dmtcp_py.paths import tool
from dmtcp_py.slurm import job, nodes

SCRIPT = "dmtcp_restart_script.sh"
POLL = 0.2  # seconds between looks at the program's exit file
START_NOW_WAIT = 120.0  # for a requeued job to be pending
START_NOW_DELAY = 2     # seconds from then until it may start
RETRY = 1.0             # seconds before a failed checkpoint is tried again


def _say(text: str) -> None:
    click.echo(f"dmtcp-slurm: {text}", err=True)


def _slurm(*argv: str) -> str:
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UserError(f"{argv[0]}: {exc}") from None
    if res.returncode != 0:
        raise UserError(f"{' '.join(argv)}: {res.stderr.strip() or 'failed'}")
    return res.stdout


def allocation_nodes(nodelist: str) -> list[str]:
    return _slurm("scontrol", "show", "hostnames", nodelist).split()


def node_address(node: str) -> str:
    """The address Slurm reaches this node at (its NodeAddr): every node of
    the allocation reaches it there."""
    fields = dict(f.split("=", 1) for f in _slurm("scontrol", "-o", "show", "node", node).split()
                  if "=" in f)
    addr = fields.get("NodeAddr") or node
    try:
        ipaddress.ip_address(addr)
        return addr
    except ValueError:
        pass
    try:
        return socket.getaddrinfo(addr, None, socket.AF_INET)[0][4][0]
    except OSError:
        raise UserError(f"cannot resolve node {node}'s address {addr!r}: use --listen ADDR") from None


def _private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def _token(state: Path) -> str:
    path = state / "token"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        token = secrets.token_hex(16)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        return token


def _read_int(path: Path, default: int = 0) -> int:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return default


def _signum(name: str) -> int:
    upper = name.upper()
    upper = upper if upper.startswith("SIG") else "SIG" + upper
    try:
        return int(getattr(signal, upper))
    except AttributeError:
        raise click.BadParameter(f"{name!r} is not a signal name") from None


class Run:
    """One run of the job script."""

    def __init__(self, state: Path, command: list[str], listen: str | None,
                 interval, max_requeues: int, keep_delay: bool = False) -> None:
        self.keep_delay = keep_delay
        self.job_id = os.environ.get("SLURM_JOB_ID", "")
        if not self.job_id:
            raise UserError("not in a Slurm job (no SLURM_JOB_ID): use it in a job script "
                            "(sbatch), as `exec dmtcp-slurm run -- CMD`")
        self.state = _private_dir(state)
        self.ckptdir = _private_dir(state / "ckpt")
        self.tmpdir = _private_dir(state / "tmp")
        self.command = command
        self.host = socket.gethostname()
        self.addr = listen or node_address(os.environ.get("SLURMD_NODENAME") or self.host)
        self.interval = interval
        self.env = {**os.environ, "DMTCP_COORD_TOKEN": _token(self.state),
                    "DMTCP_TMPDIR": str(self.tmpdir)}
        for name in ("DMTCP_COORD_HOST", "DMTCP_COORD_PORT", "DMTCP_CHECKPOINT_DIR"):
            self.env.pop(name, None)
        requeues = max(_read_int(Path(state / "requeues")),
                       _read_int_env("SLURM_RESTART_COUNT"))
        self.machine = job.JobMachine(requeues, max_requeues)
        self.port = 0
        self.pending: list[tuple[str, int]] = []
        self.later: list[tuple[float, str, int]] = []  # (when, name, signum)
        self.expected_trees = 0  # a restart's: every image's tree back
        self.ready = False       # the computation runs: signals can be acted on

    # --- the coordinator ---

    def start_coordinator(self) -> None:
        port_file = self.state / "port"
        port_file.unlink(missing_ok=True)
        argv = [tool("dmtcp-coordinator"), "--daemon", "--listen", self.addr, "-p", "0",
                "--port-file", str(port_file), "--ckptdir", str(self.ckptdir),
                "--exit-on-last", "-q"]
        if self.interval is not None:
            argv += ["--interval", str(self.interval)]
        res = subprocess.run(argv, env=self.env, stdin=subprocess.DEVNULL,
                             capture_output=True, text=True)
        if res.returncode != 0 or not port_file.exists():
            raise UserError(f"the coordinator did not start: {res.stderr.strip()}")
        self.port = int(port_file.read_text())

    def command_coordinator(self, *action: str) -> tuple[bool, str]:
        res = subprocess.run([tool("dmtcp-command"), "-h", self.addr, "-p", str(self.port),
                              *action], env=self.env, stdin=subprocess.DEVNULL,
                             capture_output=True, text=True)
        return res.returncode == 0, (res.stderr or res.stdout).strip()

    # --- the program ---

    def program_argv(self) -> list[str]:
        script = self.ckptdir / SCRIPT
        old_head = (self.state / "head").read_text().strip() \
            if (self.state / "head").exists() else None
        kind = job.start_kind(script.exists())
        if kind == "launch":
            argv = [tool("dmtcp-launch"), "--join", "-h", self.addr, "-p", str(self.port),
                    "--ckptdir", str(self.ckptdir), *self.command]
            _say(f"job {self.job_id}: launching on {self.host} (coordinator {self.addr}:{self.port})")
        else:
            here = allocation_nodes(os.environ.get("SLURM_JOB_NODELIST", self.host))
            text = script.read_text()
            old = nodes.hosts_in_script(text)
            self.expected_trees = nodes.images_in_script(text)
            mapping = nodes.place(old, old_head, here, self.host)
            moves = nodes.map_options(mapping)
            argv = [str(script), "-h", self.addr, "-p", str(self.port), *moves]
            self.env["DMTCP_RSH"] = f"{shlex.quote(tool('dmtcp-slurm'))} rsh"
            where = ", ".join(f"{o}->{n}" for o, n in mapping.items())
            _say(f"job {self.job_id}: requeue {self.machine.requeues}: restarting on "
                 f"{self.host} (coordinator {self.addr}:{self.port}; {where})")
        (self.state / "head").write_text(self.host + "\n")
        return argv

    def start_program(self, argv: list[str]) -> Path:
        """Detached (own session, parent init): a SIGTERM Slurm sends the
        job's processes before a preemption must reach us, not it.  Its
        exit status comes back in a file."""
        exit_file = self.state / "exit"
        exit_file.unlink(missing_ok=True)
        setsid = shutil.which("setsid") or "/usr/bin/setsid"
        wrapper = '"$@"; echo $? >"$0.tmp"; mv -f "$0.tmp" "$0"'
        subprocess.run([setsid, "-f", "/bin/sh", "-c", wrapper, str(exit_file), *argv],
                       env=self.env, stdin=subprocess.DEVNULL, check=True)
        return exit_file

    # --- the loop ---

    def is_ready(self) -> bool:
        """The computation runs (a restart has every tree back): before, a
        checkpoint would fail or miss trees."""
        if not self.ready:
            res = subprocess.run([tool("dmtcp-command"), "-h", self.addr, "-p", str(self.port),
                                  "-l", "--json"], env=self.env, stdin=subprocess.DEVNULL,
                                 capture_output=True, text=True)
            status = subprocess.run([tool("dmtcp-command"), "-h", self.addr, "-p", str(self.port),
                                     "-s", "--json"], env=self.env, stdin=subprocess.DEVNULL,
                                    capture_output=True, text=True)
            try:
                trees = len(json.loads(res.stdout)["trees"])
                running = json.loads(status.stdout)["running"]
            except (ValueError, KeyError, TypeError):
                return False
            self.ready = bool(running) and trees > 0 and trees >= self.expected_trees
        return self.ready

    def on_signal(self, signum: int, _frame) -> None:
        self.pending.append((signal.Signals(signum).name, signum))

    def carry_out(self, actions: list) -> int | None:
        while actions:
            action = actions.pop(0)
            if isinstance(action, job.Say):
                _say(action.text)
            elif isinstance(action, job.Checkpoint):
                ok, detail = self.command_coordinator("-kc" if action.stop else "-bc")
                if ok and detail:
                    _say(detail.splitlines()[-1])
                actions += self.machine.checkpointed(ok, detail)
            elif isinstance(action, job.Requeue):
                (self.state / "requeues").write_text(f"{self.machine.requeues + 1}\n")
                if not self.keep_delay:
                    # Slurm holds a requeued job back for about two minutes;
                    # its nodes have nothing left to clean up: a helper lets
                    # it start once it is pending.  Started first, detached:
                    # Slurm signals the job's processes as soon as it requeues
                    setsid = shutil.which("setsid") or "/usr/bin/setsid"
                    subprocess.run([setsid, "-f", tool("dmtcp-slurm"), "start-now", self.job_id],
                                   env=self.env, stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                res = subprocess.run(["scontrol", "requeue", self.job_id], capture_output=True,
                                     text=True, stdin=subprocess.DEVNULL)
                actions += self.machine.requeued(res.returncode == 0, res.stderr.strip())
            elif isinstance(action, job.RetryLater):
                self.ready = False
                self.later.append((time.monotonic() + RETRY, action.signal,
                                   int(getattr(signal, action.signal))))
            elif isinstance(action, job.Exit):
                return action.status
        return None

    def loop(self, requeue_sigs: list[int], ckpt_sigs: list[int], exit_file: Path) -> int:
        while True:
            now = time.monotonic()
            self.pending += [(n, s) for when, n, s in self.later if when <= now]
            self.later = [x for x in self.later if x[0] > now]
            while self.pending and not exit_file.exists() and self.is_ready():
                name, signum = self.pending.pop(0)
                if signum in requeue_sigs:
                    actions = self.machine.requeue_signal(name)
                else:
                    actions = self.machine.checkpoint_signal(name)
                status = self.carry_out(actions)
                if status is not None:
                    return status
            if exit_file.exists():
                status = _read_int(exit_file, 255)
                exit_file.unlink(missing_ok=True)
                status = self.carry_out(self.machine.program_exited(status))
                if status is not None:
                    self.command_coordinator("-q")
                    return status
            time.sleep(POLL)


def _read_int_env(name: str) -> int:
    try:
        return int(os.environ.get(name, "0"))
    except ValueError:
        return 0


@click.group(context_settings=CONTEXT)
@click.version_option(__version__, "--version")
def cli():
    """Checkpoint/restart inside Slurm jobs (see `dmtcp-slurm run --help`)."""


@cli.command("run", context_settings={**CONTEXT, "allow_interspersed_args": False})
@click.option("--dir", "state_dir", metavar="DIR", default=None,
              help="This job's directory: images, logs, token "
                   "[default: $SLURM_SUBMIT_DIR/dmtcp-slurm-<job id>].")
@click.option("--signal", "requeue_signals", default="USR1,TERM", show_default=True,
              metavar="SIG[,SIG]",
              help="Signals that checkpoint, stop and requeue the job.")
@click.option("--checkpoint-signal", "ckpt_signals", default="USR2", show_default=True,
              metavar="SIG[,SIG]", help="Signals that checkpoint and go on.")
@click.option("--max-requeues", type=click.IntRange(0), default=100, show_default=True,
              help="Requeue no more often than this (then only checkpoint).")
@click.option("-i", "--interval", type=INTERVAL, default=None, metavar="SECONDS|auto",
              help="Also checkpoint every SECONDS.")
@click.option("--listen", metavar="ADDR", default=None,
              help="Coordinator address [default: this node's NodeAddr].")
@click.option("--keep-requeue-delay", is_flag=True,
              help="Leave Slurm's delay (about 2 minutes) before a requeued job starts again.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run_cmd(state_dir, requeue_signals, ckpt_signals, max_requeues, interval, listen,
            keep_requeue_delay, command):
    """Run COMMAND under checkpoint control in this Slurm job; restart it
    from its newest checkpoint when the job was requeued.  Exits with
    COMMAND's exit status.  Use it as the job script's last command:
    `exec dmtcp-slurm run -- CMD`."""
    requeue = [_signum(s) for s in requeue_signals.split(",") if s]
    ckpt = [_signum(s) for s in ckpt_signals.split(",") if s]
    if set(requeue) & set(ckpt):
        raise click.BadParameter("a signal cannot both requeue and only checkpoint",
                                 param_hint="--checkpoint-signal")
    job_id = os.environ.get("SLURM_JOB_ID", "")
    base = os.environ.get("SLURM_SUBMIT_DIR") or os.getcwd()
    state = Path(state_dir) if state_dir else Path(base) / f"dmtcp-slurm-{job_id or 'nojob'}"
    runner = Run(state.resolve(), list(command), listen, interval, max_requeues,
                 keep_requeue_delay)
    task_pid = os.environ.get("SLURM_TASK_PID", "")
    if task_pid.isdigit() and int(task_pid) != os.getpid():
        _say("warning: not the job script itself (start it with exec): a signal "
             "Slurm sends the batch shell only (--signal=B:...) will not reach it")
    for signum in requeue + ckpt:
        signal.signal(signum, runner.on_signal)
    runner.start_coordinator()
    exit_file = runner.start_program(runner.program_argv())
    return runner.loop(requeue, ckpt, exit_file)


@cli.command("start-now", hidden=True)
@click.argument("job_id")
def start_now_cmd(job_id):
    """Once requeued JOB_ID is pending again, let it start at once."""
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)  # what Slurm sends the job's processes
    for _ in range(int(START_NOW_WAIT / POLL)):
        time.sleep(POLL)
        res = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True,
                             text=True, stdin=subprocess.DEVNULL)
        if res.returncode != 0:
            return 1
        state = next((f[9:] for f in res.stdout.split() if f.startswith("JobState=")), "")
        if state not in ("PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "COMPLETING",
                         "RUNNING", "CONFIGURING", "SIGNALING", "STAGE_OUT"):
            return 1  # ended otherwise (cancelled...)
        if state == "PENDING":
            # not at once: a node refuses a run of the job whose credential it
            # revoked in the same second ("Job credential revoked"); a start
            # time in the future would wait for the scheduler's next pass
            time.sleep(START_NOW_DELAY)
            subprocess.run(["scontrol", "update", f"jobid={job_id}", "StartTime=now"],
                           capture_output=True, stdin=subprocess.DEVNULL)
            return 0
    return 1


@cli.command("rsh", context_settings={**CONTEXT, "ignore_unknown_options": True,
                                      "allow_interspersed_args": False})
@click.option("-o", "ssh_options", multiple=True, hidden=True)
@click.argument("host")
@click.argument("command")
def rsh_cmd(ssh_options, host, command):
    """Run COMMAND (one shell line) on HOST of this allocation with srun,
    as the restart script runs it with ssh.  A dmtcp_restart goes on
    detached, outside the step, as a launched task's tree does."""
    try:
        words = shlex.split(command)
    except ValueError:
        words = []
    detach = any(os.path.basename(w) in ("dmtcp_restart", "dmtcp-restart") for w in words)
    line = command
    if detach:
        line = f"exec setsid -f /bin/sh -c {shlex.quote(command)} </dev/null >/dev/null 2>&1"
    argv = ["srun", "--overlap", "-N1", "-n1", "-w", host, "--input=none", "/bin/sh", "-c", line]
    try:
        return subprocess.run(argv, stdin=subprocess.DEVNULL).returncode
    except OSError as exc:
        raise UserError(f"cannot run srun: {exc.strerror or exc}") from None


def main() -> None:
    sys.exit(run_command("dmtcp-slurm", cli))


if __name__ == "__main__":
    main()
