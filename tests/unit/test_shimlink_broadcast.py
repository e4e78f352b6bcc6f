"""request_all sends the record to every process before it waits for any
answer, in pid order.  Real processes on real abstract Unix sockets: each
one says hello, reports the record it got, and answers only once every
one of them got theirs (an agent that waited for an answer before the
next send would never see them all)."""
from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys

from dmtcp_py.agent import records
from dmtcp_py.agent.shimlink import ShimLink

PROCESSES = 5

# argv: the link's name, the report pipe's fd, the go pipe's fd
CHILD = r"""
import os, socket, sys
from dmtcp_py.agent import records
name, report, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def record(type_, arg=0):
    return records.RECORD.pack(records.MAGIC, records.VERSION, type_, os.getpid(), os.getppid(), arg)
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect("\0" + name)
sock.sendall(record(records.HELLO))
got = b""
while len(got) < records.RECORD.size:
    chunk = sock.recv(records.RECORD.size - len(got))
    if not chunk:
        sys.exit(1)
    got += chunk
type_ = records.RECORD.unpack(got)[2]
os.write(report, f"{os.getpid()} {type_}\n".encode())
os.read(go, 1)
sock.sendall(record(records.SUSPENDED))
sock.recv(1)  # until the test closes its end
"""


async def scenario() -> tuple[list[int], list[str], list[int]]:
    link = ShimLink(f"dmtcp-test-broadcast-{os.getpid()}")
    await link.listen()
    report_r, report_w = os.pipe()
    go_r, go_w = os.pipe()
    children = []
    try:
        for _ in range(PROCESSES):
            children.append(subprocess.Popen(
                [sys.executable, "-c", CHILD, link.name, str(report_w), str(go_r)],
                pass_fds=(report_w, go_r)))
        for _ in range(1000):
            if len(link.pids()) == PROCESSES:
                break
            await asyncio.sleep(0.01)
        asking = asyncio.ensure_future(
            link.request_all(records.SUSPEND, records.SUSPENDED, timeout=20))
        lines: list[str] = []
        os.set_blocking(report_r, False)
        for _ in range(1000):  # every process reports its record before any answers
            try:
                lines += os.read(report_r, 4096).decode().split()
            except BlockingIOError:
                pass
            if len(lines) == 2 * PROCESSES or asking.done():
                break
            await asyncio.sleep(0.01)
        os.write(go_w, b"x" * PROCESSES)
        stuck = await asking
        return stuck, lines, [c.pid for c in children]
    finally:
        link.stop_listening()
        for shim in list(link.shims):
            shim.sock.close()
        for child in children:
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        for fd in (report_r, report_w, go_r, go_w):
            os.close(fd)


def test_every_process_gets_its_record_before_any_answer_is_awaited_in_pid_order(monkeypatch):
    sent_to: list[int] = []  # the peers of the records sent, in order
    real = socket.socket.send

    def watched(sock, data, *flags):
        if sock.family == socket.AF_UNIX:
            sent_to.append(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED))
        return real(sock, data, *flags)

    monkeypatch.setattr(socket.socket, "send", watched)
    stuck, lines, pids = asyncio.run(scenario())
    assert stuck == []
    reported = {int(pid): int(type_) for pid, type_ in zip(lines[::2], lines[1::2])}
    assert reported == {pid: records.SUSPEND for pid in pids}
    assert sent_to == sorted(pids)


# argv: the link's name, then what to do with the record: answer it, go
# away without an answer, or say a record of another kind before the
# request (a stale one) and never answer
OTHER = r"""
import os, socket, sys, time
from dmtcp_py.agent import records
name, how = sys.argv[1], sys.argv[2]
def record(type_, arg=0):
    return records.RECORD.pack(records.MAGIC, records.VERSION, type_, os.getpid(), os.getppid(), arg)
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect("\0" + name)
sock.sendall(record(records.HELLO))
if how == "stale":
    sock.sendall(record(records.RESUMED))
got = b""
while len(got) < records.RECORD.size:
    got += sock.recv(records.RECORD.size - len(got))
if how == "answers":
    sock.sendall(record(records.SUSPENDED))
    sock.recv(1)
elif how == "stale":
    time.sleep(30)
"""


async def mixed_scenario(hows: list[str]) -> tuple[list[int], dict[str, int]]:
    link = ShimLink(f"dmtcp-test-mixed-{os.getpid()}")
    await link.listen()
    children: dict[str, subprocess.Popen] = {}
    try:
        for how in hows:
            children[how] = subprocess.Popen([sys.executable, "-c", OTHER, link.name, how])
        for _ in range(1000):
            if len(link.pids()) == len(hows):
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # (the stale record is queued by now)
        stuck = await link.request_all(records.SUSPEND, records.SUSPENDED, timeout=1.5)
        return stuck, {how: child.pid for how, child in children.items()}
    finally:
        link.stop_listening()
        for shim in list(link.shims):
            shim.sock.close()
        for child in children.values():
            child.kill()
            child.wait()


def test_only_an_answer_counts_and_a_process_gone_is_no_failure():
    stuck, pids = asyncio.run(mixed_scenario(["answers", "gone", "stale"]))
    assert stuck == [pids["stale"]]
