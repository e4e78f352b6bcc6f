"""The commands as users drive them: status, launch starting its own
coordinator, the console."""
from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys

from tests.e2e.harness import TIMEOUT, last_tick, tool, wait_for
from tests.e2e.test_bad_input import free_port, listening


def test_status_lines(comp, programs):
    proc, out = comp.launch(*programs["pipe_counter"], "100000", "20")
    comp.wait_peers(2)
    text = comp.command("-s").stdout.splitlines()
    assert "NUM_PEERS=2" in text and "RUNNING=yes" in text
    listing = comp.command("-l").stdout
    assert "pipe_counter" in listing and "RUNNING" in listing
    comp.kill_and_wait(proc)
    wait_for(lambda: comp.status()["num_peers"] == 0, what="the computation to go")
    assert "RUNNING=no" in comp.command("-s").stdout.splitlines()


def test_launch_starts_a_coordinator_that_exits_with_the_program(tmp_path, programs, no_strays):
    port = free_port()
    out = tmp_path / "out"
    with open(out, "w") as o:
        proc = subprocess.Popen([tool("dmtcp-launch"), "-p", str(port), "--ckptdir", str(tmp_path),
                                 *programs["counter_single"], "150", "20"],
                                stdin=subprocess.DEVNULL, stdout=o, stderr=subprocess.PIPE)
    # 3 s of ticks: under load, a shorter program ended before the -bc came
    wait_for(lambda: last_tick(out) >= 5, what="the program")
    # the program starts first; its coordinator and agent come up beside it
    wait_for(lambda: listening(port), what="its coordinator")
    wait_for(lambda: _peers(port) > 0, what="the tree to join its coordinator")
    done = subprocess.run([tool("dmtcp-command"), "-p", str(port), "-bc"],
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0 and "checkpoint 1 done" in done.stdout, done.stderr
    assert proc.wait(timeout=TIMEOUT) == 0
    assert proc.stderr.read() == b""
    proc.stderr.close()
    assert out.read_text().splitlines()[-1].startswith("done 150")
    wait_for(lambda: not listening(port), what="the coordinator to exit")
    assert len(list(tmp_path.glob("ckpt_counter_single_*.dmtcp"))) == 1
    assert (tmp_path / "dmtcp_restart_script.sh").exists()


def _peers(port: int) -> int:
    res = subprocess.run([tool("dmtcp-command"), "-p", str(port), "-s", "--json"],
                         capture_output=True, text=True, timeout=TIMEOUT)
    return json.loads(res.stdout)["num_peers"] if res.returncode == 0 else 0


def test_console_commands(tmp_path, no_strays):
    port_file = tmp_path / "console.port"
    console = subprocess.Popen([tool("dmtcp-coordinator"), "-p", "0", "--port-file", str(port_file)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    wait_for(port_file.exists, what="the console coordinator")
    out, _ = console.communicate("s\nh\ng\nm nope h2\nm\nv h9\nbogus\nq\n", timeout=TIMEOUT)
    assert "NUM_PEERS=0" in out
    assert "migration refused: no tree 'nope'" in out
    assert "usage: m TREE" in out and "migration refused: no tree runs on 'h9'" in out
    assert "c : checkpoint now" in out and "g : who talks to whom" in out
    assert "no traffic between trees seen yet" in out
    assert "unknown command 'bogus'" in out
    assert console.returncode == 0


def test_kill_after_checkpoint_generation_kept(comp, programs):
    """Two generations: the newest is the image, the previous is kept."""
    proc, out = comp.launch(*programs["counter_single"], "100000", "20")
    comp.wait_peers(1)
    comp.checkpoint()
    comp.checkpoint()
    [image] = comp.images()
    kept = list(comp.ckptdir.glob(image.name + ".gen-*"))
    assert [k.name for k in kept] == [image.name + ".gen-1"]
    assert oct(image.stat().st_mode & 0o777) == "0o700"
    assert all(oct(f.stat().st_mode & 0o777) == "0o600" for f in image.iterdir())
    comp.kill_and_wait(proc)


def test_a_stopping_checkpoint_leaves_only_its_generation_with_keep_0(comp, programs):
    """The generation a publication moves aside is deleted once the round
    is over (every tree published), not before: the agent of a tree that
    the checkpoint stopped waits for that end before it exits."""
    proc, _ = comp.launch("--keep", "0", *programs["counter_single"], "100000", "20")
    comp.wait_peers(1)
    comp.checkpoint()
    assert "done" in comp.command("-kc").stdout
    assert proc.wait(timeout=TIMEOUT) == 0
    [image] = comp.images()
    assert sorted(p.name for p in comp.ckptdir.iterdir() if p.name.startswith(
        (image.name, "." + image.name))) == [image.name]


def test_images_go_to_the_coordinators_ckptdir_by_default(comp, programs, tmp_path, no_strays):
    out = tmp_path / "default.out"
    with open(out, "w") as o:
        proc = subprocess.Popen([tool("dmtcp-launch"), "--join", "-p", str(comp.port),
                                 *programs["counter_single"], "100000", "20"],
                                cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=o)
    comp.wait_peers(1)
    comp.checkpoint()
    assert len(comp.images()) == 1
    assert not list(tmp_path.glob("ckpt_*.dmtcp"))  # not the cwd
    comp.kill_and_wait(proc)


def test_kcheckpoint_stops_after_the_dump_and_restarts(comp, programs):
    proc, out = comp.launch(*programs["counter_single"], "100000", "20")
    comp.wait_peers(1)
    # 3 s of ticks: under load, a shorter program ended before the -bc came
    wait_for(lambda: last_tick(out) >= 5, what="the program")
    done = comp.command("-kc").stdout
    assert "computation stopped" in done
    assert proc.wait(timeout=TIMEOUT) == 0  # stopped by the checkpoint, not killed
    stopped_at = last_tick(out)
    restarted, rout = comp.restart()
    wait_for(lambda: last_tick(rout) > stopped_at + 3, what="the restarted program")
    first = int(next(line for line in rout.read_text().splitlines() if line.startswith("tick")).split()[1])
    assert first == stopped_at + 1  # nothing ran between the dump and the stop
    comp.kill_and_wait(restarted)


# holds a scratch file open in a tmpfs and prints what it holds
SCRATCH_HOLDER = """
import sys, time
held = open(sys.argv[1], "w+")
held.write("kept"); held.flush()
print("ready", flush=True)
while True:
    held.seek(0)
    print("holds", held.read(), flush=True)
    time.sleep(0.02)
"""


def test_kcheckpoint_keeps_the_files_criu_leaves_out(comp):
    """A stopping checkpoint saves the files CRIU does not keep as -bc
    does, though the tree is gone after its dump: a scratch file in a
    tmpfs, removed before the restart (as a reboot would), is back."""
    scratch = f"/dev/shm/dmtcp-test-kc-{os.getpid()}"
    try:
        proc, out = comp.launch(sys.executable, "-c", SCRATCH_HOLDER, scratch)
        wait_for(lambda: "ready" in out.read_text(), what="the program")
        assert "computation stopped" in comp.command("-kc").stdout
        proc.wait(timeout=TIMEOUT)
        os.unlink(scratch)
        restarted, rout = comp.restart()
        wait_for(lambda: "holds kept" in rout.read_text() or restarted.poll() is not None,
                 what="the restarted program")
        assert "holds kept" in rout.read_text(), restarted.err_path.read_text()
        assert os.path.exists(scratch)
        comp.kill_and_wait(restarted)
    finally:
        if os.path.exists(scratch):
            os.unlink(scratch)


def test_coordinator_exit_after_ckpt(tmp_path, programs, no_strays):
    port_file = tmp_path / "port"
    coordinator = subprocess.Popen([tool("dmtcp-coordinator"), "-p", "0", "--port-file", str(port_file),
                                    "--exit-after-ckpt", "-q", "--ckptdir", str(tmp_path)],
                                   stdin=subprocess.DEVNULL)
    wait_for(port_file.exists, what="the coordinator")
    port = port_file.read_text().strip()
    out = tmp_path / "out"
    with open(out, "w") as o:
        proc = subprocess.Popen([tool("dmtcp-launch"), "--join", "-p", port,
                                 *programs["counter_single"], "100000", "20"],
                                stdin=subprocess.DEVNULL, stdout=o)
    # 3 s of ticks: under load, a shorter program ended before the -bc came
    wait_for(lambda: last_tick(out) >= 5, what="the program")
    wait_for(lambda: _peers(int(port)) > 0, what="the tree to join its coordinator")
    subprocess.run([tool("dmtcp-command"), "-p", port, "-c"], check=True, capture_output=True,
                   timeout=TIMEOUT)
    assert proc.wait(timeout=TIMEOUT) == 0
    assert coordinator.wait(timeout=TIMEOUT) == 0
    assert len(list(tmp_path.glob("ckpt_counter_single_*.dmtcp"))) == 1


def _read_terminal(master: int) -> str:
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:  # EIO: the other side is closed
            break
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks).decode(errors="replace")


def test_bcheckpoint_on_a_terminal_shows_progress_and_a_summary(comp, programs):
    proc, out = comp.launch(*programs["pipe_counter"], "100000", "10")
    comp.wait_peers(2)
    master, slave = os.openpty()
    try:
        res = subprocess.run([tool("dmtcp-command"), "-p", str(comp.port), "-bc"],
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave,
                             text=True, timeout=TIMEOUT)
        os.close(slave)
        slave = -1
        shown = _read_terminal(master)
    finally:
        if slave >= 0:
            os.close(slave)
        os.close(master)
    assert res.returncode == 0, shown
    # the last redraw says everything is written, by the one tree
    assert re.search(r"checkpoint 1: [0-9.]+ of [0-9.]+ MiB written \(100%\), 1 of 1 trees",
                     shown), shown
    assert re.fullmatch(r"checkpoint 1 done: 1 trees, 2 processes, \d+ bytes, [0-9.]+ s\n",
                        res.stdout), res.stdout
    # not on a terminal: the summary alone
    plain = comp.command("-bc")
    assert plain.stderr == "" and plain.stdout.startswith("checkpoint 2 done: 1 trees, 2 processes")
    comp.kill_and_wait(proc)


class Terminal:
    """A program's stdin, stdout and stderr on a pseudo-terminal we type into."""

    def __init__(self, argv: list[str]) -> None:
        self.master, slave = os.openpty()
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave,
                                     start_new_session=True)
        os.close(slave)
        self.seen = ""

    def type(self, line: str) -> None:
        os.write(self.master, line.encode() + b"\n")

    def expect(self, pattern: str) -> re.Match:
        """Read until pattern appears in what the program wrote since the
        last match; a program that stops writing fails at the harness's
        timeout."""
        def found():
            ready, _, _ = select.select([self.master], [], [], 0.05)
            if ready:
                try:
                    self.seen += os.read(self.master, 65536).decode(errors="replace")
                except OSError:
                    pass
            return re.search(pattern, self.seen)

        match = wait_for(found, what=f"{pattern!r} on the terminal")
        self.seen = self.seen[match.end():]
        return match

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        os.close(self.master)


def test_console_on_a_terminal_lists_checkpoints_and_quits(tmp_path, programs, no_strays):
    port_file = tmp_path / "port"
    term = Terminal([tool("dmtcp-coordinator"), "-p", "0", "--port-file", str(port_file),
                     "--ckptdir", str(tmp_path)])
    try:
        wait_for(port_file.exists, what="the coordinator")
        port = port_file.read_text().strip()
        with open(tmp_path / "out", "w") as o:
            prog = subprocess.Popen([tool("dmtcp-launch"), "--join", "-p", port,
                                     *programs["pipe_counter"], "100000", "20"],
                                    stdin=subprocess.DEVNULL, stdout=o, stderr=subprocess.STDOUT)
        wait_for(lambda: subprocess.run([tool("dmtcp-command"), "-p", port, "-s", "--json"],
                                        capture_output=True, text=True).stdout.count(
                                            '"num_peers": 2'), what="two processes")
        term.type("l")
        term.expect(r"agent \d+\s+pipe_counter\s+RUNNING")
        term.type("c")
        term.expect(r"checkpoint 1 done")
        term.type("s")
        term.expect(r"GENERATION=1")
        term.type("i 30")
        term.expect(r"30")
        term.type("k")
        assert prog.wait(timeout=60) != 0
        term.type("q")
        assert term.proc.wait(timeout=60) == 0
    finally:
        term.close()
    assert list(tmp_path.glob("ckpt_pipe_counter_*.dmtcp"))
