"""Drive the real commands the way a user does, and read what they print."""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from pathlib import Path

import psutil

from tests.conftest import BIN

TIMEOUT = 60.0


def tool(name: str) -> str:
    return os.path.join(BIN, name)


def wait_for(predicate, timeout: float = TIMEOUT, what: str = "condition", explain=None):
    """explain: called on a timeout, says what the waiting found (an
    intermittent failure in CI leaves nothing else to read)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            detail = f"\n{explain()}" if explain else ""
            raise AssertionError(f"timed out waiting for {what}{detail}")
        time.sleep(0.02)


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError as exc:
        return f"({exc.strerror})"


def tree_report(proc: subprocess.Popen) -> str:
    """Whether a run has ended, what it said on stderr, and else what every
    thread of its processes is doing (state, kernel wait, system call)."""
    if proc.poll() is not None:
        return f"the run ended with {proc.returncode}: {proc.err_path.read_text()[-2000:]}"
    lines = [f"stderr: {proc.err_path.read_text()[-2000:]}"]
    try:
        procs = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return "\n".join(lines + ["(the run just ended)"])
    for p in procs:
        try:
            tids = sorted(os.listdir(f"/proc/{p.pid}/task"), key=int)
        except OSError:
            continue  # it ended meanwhile
        for tid in tids:
            base = f"/proc/{p.pid}/task/{tid}"
            state = _read(f"{base}/stat").rpartition(")")[2].split()[:1] or ["?"]
            syscall = _read(f"{base}/syscall").split(" ")[0]
            lines.append(f"{p.pid}/{tid} {_read(base + '/comm')} {state[0]} "
                         f"wchan={_read(base + '/wchan')} syscall={syscall}")
    return "\n".join(lines)


def wait_until_running(restarted: subprocess.Popen, port: int) -> None:
    """Until the coordinator on port says its computation runs, or the
    restart (or launch) restarted ended first (the caller says why)."""
    def running() -> bool:
        res = subprocess.run([tool("dmtcp-command"), "-p", str(port), "-s", "--json"],
                             capture_output=True, text=True, timeout=TIMEOUT)
        return res.returncode == 0 and json.loads(res.stdout)["running"]

    wait_for(lambda: restarted.poll() is not None or running(),
             what="the restarted program to run")


def ticks(path: Path) -> list[list[str]]:
    """The complete 'tick N ...' lines of an output file, split."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    lines = text.split("\n")[:-1]  # the last piece may be a partial line
    return [ln.split() for ln in lines if ln.startswith(("tick ", "done "))]


def last_tick(path: Path) -> int:
    rows = [r for r in ticks(path) if r[0] == "tick"]
    return int(rows[-1][1]) if rows else 0


def agent_log(comp: Computation) -> str:
    """The log of the agent of comp's one tree ('' before it has one)."""
    from dmtcp_py.paths import run_dir
    trees = json.loads(comp.command("-l", "--json").stdout)["trees"]
    if len(trees) != 1:  # (none yet: a restart's agent joins after CRIU)
        return ""
    path = run_dir() / f"agent-{trees[0]['tree_id']}.log"
    return path.read_text() if path.exists() else ""


def stream_images(comp: Computation, programs: dict, port: int, ticks: str,
                  traffic: int) -> list[Path]:
    """net_stream's server and client (two trees, one connection on port)
    under comp, checkpointed once the server counted `traffic` ticks,
    then killed: their images."""
    where = ["127.0.0.1", str(port)]
    server, sout = comp.launch(*programs["net_stream"], "server", *where, ticks, "10")
    wait_for(lambda: sout.exists() and "listening" in sout.read_text(), what="the server")
    client, _ = comp.launch(*programs["net_stream"], "client", *where, ticks, "10")
    comp.wait_peers(2)
    wait_for(lambda: sout.read_text().count("tick") >= traffic, what="traffic")
    comp.checkpoint()
    comp.command("-k")
    assert server.wait(timeout=TIMEOUT) != 0 and client.wait(timeout=TIMEOUT) != 0
    images = comp.images()
    assert len(images) == 2
    return images


@contextlib.contextmanager
def running_program(root: Path, argv: list[str], ticks: int = 3):
    """A coordinator with one ticking program under it, for fixtures that
    share it; everything it started is gone at the end."""
    from tests.conftest import kill_descendants
    comp = Computation(root)
    try:
        proc, out = comp.launch(*argv)
        wait_for(lambda: last_tick(out) >= ticks, what="the program to start")
        yield comp, proc
    finally:
        comp.close()
        kill_descendants()


class Computation:
    """One coordinator, its checkpoint directory, and what runs under it."""

    def __init__(self, root: Path, *options: str, env: dict | None = None,
                 stdin=subprocess.DEVNULL) -> None:
        """options: more coordinator options; env: its extra environment;
        stdin=subprocess.PIPE to type console commands into it."""
        self.root = root
        self.ckptdir = root / "ckpt"
        self.ckptdir.mkdir()
        port_file = root / "port"
        self.coordinator = subprocess.Popen(
            [tool("dmtcp-coordinator"), "--coord-port", "0", "--port-file", str(port_file),
             "--ckptdir", str(self.ckptdir), "-q", *options],
            env={**os.environ, **(env or {})}, text=True,
            stdin=stdin, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        wait_for(port_file.exists, what="the coordinator's port file")
        self.port = int(port_file.read_text())
        self._runs = 0

    def _outputs(self, label: str) -> tuple[Path, Path]:
        self._runs += 1
        return (self.root / f"{self._runs:02d}-{label}.out", self.root / f"{self._runs:02d}-{label}.err")

    def _start(self, label: str, argv: list[str], env: dict | None = None
               ) -> tuple[subprocess.Popen, Path]:
        """Output goes to files named after the run; stderr beside it."""
        out, err = self._outputs(label)
        with open(out, "w") as o, open(err, "w") as e:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=o, stderr=e, env=env)
        proc.err_path = err
        return proc, out

    def launch(self, *argv: str, env: dict | None = None) -> tuple[subprocess.Popen, Path]:
        """The program runs at once, its agent joins beside it: returns
        once the coordinator has its tree (or the launch has ended), so
        that a command given next counts it."""
        proc, out = self._start("launch", [tool("dmtcp-launch"), "--join", "-p", str(self.port),
                                           "--ckptdir", str(self.ckptdir), *argv], env=env)
        wait_for(lambda: proc.poll() is not None or self.has_agent(proc.pid),
                 what="the launched tree to join")
        return proc, out

    def has_agent(self, pid: int) -> bool:
        """The coordinator lists a tree whose agent is pid (dmtcp-launch's)."""
        res = self.command("-l", "--json", check=False)
        return res.returncode == 0 and any(t["agent_pid"] == pid
                                           for t in json.loads(res.stdout).get("trees", []))

    def restart(self, env: dict | None = None) -> tuple[subprocess.Popen, Path]:
        """Run the generated restart script, as a user would."""
        return self._start("restart", [str(self.ckptdir / "dmtcp_restart_script.sh"),
                                       "--coord-port", str(self.port)], env=env)

    def command(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        res = subprocess.run([tool("dmtcp-command"), "-p", str(self.port), *args],
                             capture_output=True, text=True, timeout=TIMEOUT)
        if check:
            assert res.returncode == 0, f"dmtcp-command {args}: {res.stderr}"
        return res

    def status(self) -> dict:
        return json.loads(self.command("-s", "--json").stdout)

    def wait_peers(self, n: int) -> None:
        wait_for(lambda: self.status()["num_peers"] >= n and self.status()["running"],
                 what=f"{n} processes under control")

    def checkpoint(self) -> str:
        out = self.command("-bc").stdout
        assert "done" in out
        return out

    def images(self) -> list[Path]:
        return sorted(self.ckptdir.glob("ckpt_*.dmtcp"))

    def kill_and_wait(self, proc: subprocess.Popen) -> int:
        self.command("-k")
        return proc.wait(timeout=TIMEOUT)

    def close(self) -> None:
        if self.coordinator.poll() is None:
            self.coordinator.kill()
            self.coordinator.wait()
        for stream in (self.coordinator.stdin, self.coordinator.stderr):
            if stream:
                stream.close()
