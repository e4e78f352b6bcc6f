"""errors.say and one_line: a line on stderr is one write, so processes
sharing stderr (the agents of a many-tree restart) never split each
other's lines."""
from __future__ import annotations

import io
import os
import subprocess
import sys

from dmtcp_py.errors import UserError, one_line, say


class Writes(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def write(self, s: str) -> int:
        self.calls.append(s)
        return super().write(s)


def test_a_line_is_one_write(monkeypatch):
    err = Writes()
    monkeypatch.setattr(sys, "stderr", err)
    say("dmtcp-restart: warning: w")

    def fails():
        raise UserError("the coordinator went away")

    assert one_line("dmtcp-restart", fails) == 1
    assert err.calls == ["dmtcp-restart: warning: w\n",
                         "dmtcp-restart: error: the coordinator went away\n"]


def test_processes_sharing_a_pipe_keep_their_lines_whole():
    # forked writers on one pipe, as the agents of a restart: each line
    # whole, however the writes interleave
    code = ("import os\n"
            "from dmtcp_py.errors import say\n"
            "pids = []\n"
            "for k in range(4):\n"
            "    pid = os.fork()\n"
            "    if pid == 0:\n"
            "        for i in range(200):\n"
            "            say(f'writer {k} line {i} ' + 'x' * 60)\n"
            "        os._exit(0)\n"
            "    pids.append(pid)\n"
            "for pid in pids:\n"
            "    os.waitpid(pid, 0)\n")
    out = subprocess.run([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True,
                         check=True, timeout=60, env={**os.environ, "PYTHONUNBUFFERED": "1"}).stderr
    lines = out.splitlines()
    assert len(lines) == 800
    assert all(ln.startswith("writer ") and ln.endswith("x" * 60) for ln in lines)
