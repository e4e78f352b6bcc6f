"""dmtcp-srun SRUN [ARGS...]: what the shim runs instead of `SRUN ARGS...`.

Started by a process of a controlled tree, inside a Slurm allocation.  Waits
for the tasks on a port of its own, has the real srun start each task as a
detached `dmtcp-launch --join` tree on its node (dmtcp_py.slurm.srun_args),
then is the step here: our stdin goes to the tasks, their stdout, stderr and
exit statuses come back, signals go to them.  Exits as srun does: with the
highest exit status of its tasks.  Anything that is not a launch (--help,
--pty...) runs the real srun unchanged.
"""
from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading

from dmtcp_py import paths
from dmtcp_py.slurm import srun_args
from dmtcp_py.slurm.task import HELLO
from dmtcp_py.ssh import frames
from dmtcp_py.ssh.client import _accept, _listen as _listen_any, take_output

ACCEPT_TIMEOUT = 60.0
DIRECT = "DMTCP_SRUN_DIRECT"  # the shim leaves an srun with this alone
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT,
             signal.SIGUSR1, signal.SIGUSR2, signal.SIGCONT, signal.SIGALRM)


def _say(text: str) -> None:
    os.write(2, f"dmtcp-srun: {text}\n".encode())


def _listen() -> socket.socket:
    """IPv4, as the tasks call back (SLURM_LAUNCH_NODE_IPADDR): a dual-stack
    socket would make the two ends of a connection of different families,
    which a restart cannot connect again when both are on one host."""
    try:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("0.0.0.0", 0))
        sock.listen(64)
        return sock
    except OSError:
        return _listen_any()


class Step:
    """The tasks of one step, each on its link."""

    def __init__(self, kill_on_bad_exit: bool) -> None:
        self.links: dict[int, frames.Link] = {}
        self.status: dict[int, int] = {}
        self.kill_on_bad_exit = kill_on_bad_exit
        self.lock = threading.Lock()
        self.done = threading.Condition(self.lock)

    def signal_all(self, signum: int, but: int | None = None) -> None:
        for procid, link in list(self.links.items()):
            if procid != but and procid not in self.status:
                try:
                    link.send_int(frames.SIGNAL, signum)
                except OSError:
                    pass

    def stdin_to_all(self) -> None:
        try:
            while True:
                data = os.read(0, 65536)
                for link in list(self.links.values()):
                    try:
                        link.send(frames.STDIN, data)
                    except OSError:
                        pass
                if not data:
                    return
        except OSError:
            for link in list(self.links.values()):
                try:
                    link.send(frames.STDIN, b"")
                except OSError:
                    pass

    def serve(self, procid: int, link: frames.Link) -> None:
        status = take_output(link)
        if status is None:
            _say(f"task {procid}: lost the connection to it")
            status = 255
        try:
            link.sock.close()
        except OSError:
            pass
        with self.lock:
            self.status[procid] = status
            self.done.notify_all()
        if status != 0 and self.kill_on_bad_exit:
            self.signal_all(signal.SIGKILL, but=procid)

    def wait(self, ntasks: int) -> int:
        with self.lock:
            while len(self.status) < ntasks:
                self.done.wait()
        return max(self.status.values(), default=0)


def _hello(link: frames.Link) -> tuple[int, int, str] | None:
    try:
        frame = link.recv()
    except (OSError, ConnectionError):
        return None
    if frame is None or frame[0] != HELLO:
        return None
    try:
        procid, ntasks, node = frame[1].decode().split(" ", 2)
        return int(procid), int(ntasks), node
    except ValueError:
        return None


def _gather(listener: socket.socket, cookie: str, step: Step) -> int | None:
    """Accept every task of the step; their number, or None on a time-out."""
    ntasks = None
    while ntasks is None or len(step.links) < ntasks:
        conn = _accept(listener, cookie)
        if conn is None:
            return None
        link = frames.Link(conn)
        hello = _hello(link)
        if hello is None:
            conn.close()
            continue
        procid, ntasks, _node = hello
        step.links[procid] = link
    return ntasks


def run(argv: list[str]) -> int:
    if not argv:
        _say("usage: dmtcp-srun SRUN [ARGS...]")
        return 255
    srun, args = argv[0], argv[1:]
    env = {**os.environ, DIRECT: "1"}
    try:
        call = srun_args.parse(args)
    except srun_args.SrunUsageError as exc:
        _say(str(exc))
        return 1
    port = os.environ.get("DMTCP_COORD_PORT")
    if call is None or not port:
        os.execvpe(srun, [srun, *args], env)
    if not os.environ.get("SLURM_JOB_ID"):
        _say("srun outside a Slurm allocation cannot run under checkpoint control: "
             "run it in a job (sbatch, salloc)")
        return 1
    coord_host = os.environ.get("DMTCP_COORD_HOST", "127.0.0.1")
    if coord_host.startswith(("127.", "localhost")) or coord_host == "::1":
        _say("the coordinator is at a loopback address, which the tasks' nodes cannot "
             "reach: start it with --listen ADDR and launch with -h ADDR (dmtcp-slurm run "
             "does this)")
        return 1
    listener = _listen()
    task = srun_args.TaskLaunch(
        setsid=shutil.which("setsid") or "/usr/bin/setsid", launch=paths.tool("dmtcp-launch"), python=sys.executable, coord_host=coord_host,
        coord_port=int(port), ckptdir=os.environ.get("DMTCP_CHECKPOINT_DIR"),
        port=listener.getsockname()[1], cookie=secrets.token_hex(16))
    export = srun_args.export_value(call, list(os.environ))
    step = Step(call.kill_on_bad_exit)
    got: list[int | None] = []
    gatherer = threading.Thread(target=lambda: got.append(_gather(listener, task.cookie, step)),
                                daemon=True)
    gatherer.start()
    try:
        started = subprocess.run(srun_args.srun_argv(srun, call, task, export),
                                 stdin=subprocess.DEVNULL, env=env)
    except OSError as exc:
        _say(f"cannot run {srun}: {exc.strerror or exc}")
        return 255
    if started.returncode != 0:
        return started.returncode
    gatherer.join()
    listener.close()
    ntasks = got[0] if got else None
    if ntasks is None:
        _say(f"the tasks did not all call back within {ACCEPT_TIMEOUT:g} s "
             f"({len(step.links)} did; see the agents' logs on their nodes)")
        step.signal_all(signal.SIGKILL)
        return 255

    for sig in FORWARDED:
        signal.signal(sig, lambda signum, _frame: step.signal_all(signum))
    threading.Thread(target=step.stdin_to_all, daemon=True).start()
    servers = [threading.Thread(target=step.serve, args=(procid, link), daemon=True)
               for procid, link in step.links.items()]
    for server in servers:
        server.start()
    return step.wait(ntasks)


def main() -> None:
    sys.exit(run(sys.argv[1:]))


if __name__ == "__main__":
    main()
