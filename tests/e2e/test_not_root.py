"""A user who is not root, with the commands in the checkout's .venv/bin:
their own coordinator, logs and images; launch, `-bc`, `-k`, the console
and the restart script; an Open MPI job; and a criu without the capability
such users need is named in one line (issue 19, part 1)."""
from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from tests.conftest import kill_descendants, need_root
from tests.e2e import mpi
from tests.e2e.harness import TIMEOUT, last_tick, tool, wait_for
from tests.e2e.users import created_user

EXAMPLES = Path(__file__).parent.parent.parent / "examples"


@pytest.fixture(scope="module")
def user():
    need_root()
    try:
        with created_user() as made:
            yield made
    finally:
        kill_descendants()


def _port(user, home: Path) -> int:
    """A coordinator of the user's own, --daemon; its port."""
    port_file = home / "port"
    res = user.run([tool("dmtcp-coordinator"), "--daemon", "--coord-port", "0",
                    "--port-file", str(port_file), "--ckptdir", str(home / "ckpt")])
    assert res.returncode == 0, res.stderr
    return int(port_file.read_text())


@pytest.fixture
def work(user):
    """A fresh directory of the user's for one test, with a checkpoint
    directory in it; whatever the test started is killed at the end."""
    path = user.home / f"w{os.urandom(3).hex()}"
    path.mkdir(mode=0o700)
    user.give(path)
    (path / "ckpt").mkdir(mode=0o700)
    user.give(path / "ckpt")
    try:
        yield path
    finally:
        for proc in user.processes():
            proc.kill()
        kill_descendants()


def _command(user, port: int, *args: str) -> subprocess.CompletedProcess:
    return user.run([tool("dmtcp-command"), "-p", str(port), *args], timeout=TIMEOUT)


def _joined(user, port: int, processes: int = 1) -> None:
    """The launched tree has joined with this many processes (the program
    runs before its agent joins: its output says nothing of that)."""
    def enough() -> bool:
        res = _command(user, port, "-s", "--json")
        return res.returncode == 0 and json.loads(res.stdout)["num_peers"] >= processes
    wait_for(enough, what=f"{processes} processes under control")


def _output(user, path: Path):
    """An output file as the user's shell would make it: theirs.  (CRIU
    reopens a restored tree's stdout through /proc/self/fd, with the
    permissions of the user.)"""
    stream = open(path, "w")
    user.give(path)
    return stream


def _build(user, src: Path, out: Path, cc: str = "cc") -> str:
    res = user.run([cc, "-O1", "-o", str(out), str(src)])
    assert res.returncode == 0, res.stderr
    return str(out)


def test_a_user_checkpoints_kills_and_restarts(user, work):
    counter = _build(user, EXAMPLES / "pipe_counter.c", work / "pipe_counter")
    port = _port(user, work)
    out = work / "run1.out"
    with _output(user, out) as o:
        first = user.popen([tool("dmtcp-launch"), "--join", "-p", str(port), counter, "150", "20"],
                           stdin=subprocess.DEVNULL, stdout=o, stderr=subprocess.STDOUT)
    wait_for(lambda: last_tick(out) >= 10, what="the program's ticks")
    _joined(user, port)
    before = last_tick(out)
    done = _command(user, port, "-bc")
    assert done.returncode == 0 and "checkpoint 1 done" in done.stdout, done.stderr
    assert _command(user, port, "-k").returncode == 0
    first.wait(timeout=TIMEOUT)
    killed = last_tick(out)
    # images, logs and the token are the user's own, private
    [image] = (work / "ckpt").glob("ckpt_pipe_counter_*.dmtcp")
    assert image.stat().st_uid == user.uid
    assert stat.S_IMODE(image.stat().st_mode) == 0o700
    assert all(f.stat().st_uid == user.uid and stat.S_IMODE(f.stat().st_mode) == 0o600
               for f in image.iterdir())
    run_dir = next((user.home / "tmp").glob(f"dmtcp-{user.name}@*"))
    assert run_dir.stat().st_uid == user.uid
    assert any(run_dir.glob("criu-dump-*.log")) and any(run_dir.glob("coordinator-*.token"))
    script = work / "ckpt" / "dmtcp_restart_script.sh"
    out2 = work / "run2.out"
    with _output(user, out2) as o:
        again = user.popen([str(script), "-p", str(port)], stdin=subprocess.DEVNULL,
                           stdout=o, stderr=subprocess.STDOUT)
    assert again.wait(timeout=TIMEOUT) == 0, out2.read_text()[-2000:]
    ticks = [int(line.split()[1]) for line in out2.read_text().splitlines()
             if line.startswith("tick ")]
    assert ticks and before < ticks[0] <= killed + 1, (before, killed, ticks[:3])
    assert out2.read_text().splitlines()[-1] == "done 150"
    _command(user, port, "-q")


def test_a_user_drives_the_console(user, work):
    port_file = work / "port"
    console = user.popen([tool("dmtcp-coordinator"), "--coord-port", "0", "--port-file",
                          str(port_file), "--ckptdir", str(work / "ckpt")],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(port_file.exists, what="the console coordinator")
        port = int(port_file.read_text())
        out = work / "run.out"
        with _output(user, out) as o:
            prog = user.popen([tool("dmtcp-launch"), "--join", "-p", str(port), "python3", "-c",
                               "import itertools, time\nfor i in itertools.count():\n"
                               "    print('tick', i, flush=True); time.sleep(0.05)"],
                              stdin=subprocess.DEVNULL, stdout=o, stderr=subprocess.STDOUT)
        wait_for(lambda: last_tick(out) >= 5, what="the program's ticks")
        _joined(user, port)
        console.stdin.write("c\n")
        console.stdin.flush()
        wait_for(lambda: "GENERATION=1" in _command(user, port, "-s").stdout,
                 what="the console's checkpoint")
        text, _ = console.communicate("k\nq\n", timeout=TIMEOUT)
        assert console.returncode == 0, text
        prog.wait(timeout=TIMEOUT)
        assert len(list((work / "ckpt").glob("ckpt_python3_*.dmtcp"))) == 1
    finally:
        if console.poll() is None:
            console.kill()
            console.wait()


def test_a_users_open_mpi_job_comes_back_with_its_answer(user, work):
    ompi = mpi.OPENMPI
    solver = _build(user, mpi.SOLVER, work / "solver", cc=ompi.cc)
    # the root-only switches of the root tests are not wanted here
    env = user.env(**{k: v for k, v in ompi.env.items() if "ROOT" not in k})
    ref = user.run([ompi.mpirun, *ompi.options, "-np", "2", solver, "400"], env=env)
    assert ref.returncode == 0, ref.stderr
    port = _port(user, work)
    out = work / "mpi.out"
    with _output(user, out) as o:
        job = user.popen([tool("dmtcp-launch"), "--join", "-p", str(port), ompi.mpirun,
                          *ompi.options, "-np", "2", solver, "400", "3000"], env=env,
                         stdin=subprocess.DEVNULL, stdout=o, stderr=subprocess.STDOUT)
    wait_for(lambda: mpi.iterations_seen(out.read_text()), what="the job's first iterations")
    _joined(user, port, 3)  # mpirun and the 2 ranks
    done = _command(user, port, "-bc")
    assert done.returncode == 0, done.stderr
    assert _command(user, port, "-k").returncode == 0
    job.wait(timeout=TIMEOUT)
    out2 = work / "mpi2.out"
    with _output(user, out2) as o:
        again = user.popen([str(work / "ckpt" / "dmtcp_restart_script.sh"), "-p", str(port)],
                           env=env, stdin=subprocess.DEVNULL, stdout=o, stderr=subprocess.STDOUT)
    assert again.wait(timeout=TIMEOUT) == 0, out2.read_text()[-2000:]
    assert mpi.checksum(out2.read_text()) == mpi.checksum(ref.stdout)
    _command(user, port, "-q")


def test_a_criu_without_the_capability_is_named(user, work):
    """/usr/local/sbin/criu is root's, without file capabilities: the
    program does not start, and the one line says what is missing."""
    marker = work / "ran"
    env = user.env(DMTCP_CRIU="/usr/local/sbin/criu")
    res = user.run([tool("dmtcp-launch"), "--new-coordinator", "-p", "0", "touch", str(marker)],
                   env=env)
    assert res.returncode != 0
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "CAP_CHECKPOINT_RESTORE" in lines[0], res.stderr
    assert "/usr/local/sbin/criu" in lines[0] and not marker.exists()
    res = user.run([tool("dmtcp-restart"), str(work / "ckpt")], env=env)
    assert res.returncode != 0 and "cannot restore:" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


SYSV_USER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ipc.h>
#include <sys/msg.h>
#include <sys/shm.h>
#include <unistd.h>
struct msg { long type; char text[8]; };
/* usage: sysv_user shm|msg */
int main(int argc, char **argv)
{
    char *p = NULL;
    if (argc > 1 && strcmp(argv[1], "shm") == 0) {
        int shm = shmget(IPC_PRIVATE, 4096, IPC_CREAT | 0600);
        p = shm < 0 ? NULL : shmat(shm, NULL, 0);
        if (p == NULL || p == (void *)-1)
            return 3;
        shmctl(shm, IPC_RMID, NULL); /* gone with the last detach */
    } else {
        struct msg m = { 1, "hello" };
        int q = msgget(IPC_PRIVATE, IPC_CREAT | 0600);
        if (q < 0 || msgsnd(q, &m, sizeof(m.text), 0) != 0)
            return 3;
    }
    for (int i = 0;; i++) {
        if (p)
            p[0] = (char)i;
        printf("tick %d\n", i);
        fflush(stdout);
        usleep(20000);
    }
}
"""


def _sysv_run(user, work, what: str) -> tuple[list[subprocess.CompletedProcess], str]:
    """The SysV program (shared memory or a message queue) under a coordinator
    of the user's: two -bc; their results and the launch's stderr."""
    src = work / "sysv_user.c"
    src.write_text(SYSV_USER)
    user.give(src)
    exe = _build(user, src, work / "sysv_user")
    port = _port(user, work)
    out, err = work / "sysv.out", work / "sysv.err"
    with _output(user, out) as o, _output(user, err) as e:
        prog = user.popen([tool("dmtcp-launch"), "--join", "-p", str(port), exe, what],
                          stdin=subprocess.DEVNULL, stdout=o, stderr=e)
    wait_for(lambda: last_tick(out) >= 3, what="the program's ticks")
    _joined(user, port)
    results = [_command(user, port, "-bc") for _ in range(2)]
    assert _command(user, port, "-k").returncode == 0
    prog.wait(timeout=TIMEOUT)
    _command(user, port, "-q")
    return results, err.read_text()


def test_sysv_shared_memory_is_refused_in_one_line(user, work):
    """Without root the tree has no IPC namespace of its own, and CRIU then
    cannot dump SysV shared memory: the checkpoint fails, saying why."""
    results, _ = _sysv_run(user, work, "shm")
    for res in results:
        assert res.returncode != 0
        assert res.stderr.count("\n") == 1, res.stderr
        assert "1 System V shared memory segment" in res.stderr and "not root" in res.stderr


def test_sysv_queues_left_out_of_the_image_are_named_once(user, work):
    results, err = _sysv_run(user, work, "msg")
    assert all(res.returncode == 0 for res in results), [r.stderr for r in results]
    warnings = [ln for ln in err.splitlines() if "System V" in ln]
    assert len(warnings) == 1, err
    assert "1 System V message queue" in warnings[0] and "not in its images" in warnings[0]
