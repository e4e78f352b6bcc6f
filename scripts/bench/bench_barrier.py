#!/usr/bin/env python3
"""Barrier round-trip of a real coordinator with many simulated agents.

For each N in --agents, a fresh `dmtcp-coordinator` runs as a subprocess on
loopback; N simulated agents (one asyncio program, this process) answer every
barrier at once, and one client asks for --rounds blocking checkpoints (after
one warm-up round).  Per round it measures

  checkpoint   one blocking checkpoint as the client sees it (six barriers)
  barrier      from the first agent receiving barrier X to the first agent
               receiving barrier X+1: broadcast to N, collect N, broadcast
               (five per round: SUSPENDED .. REFILLED)
  echo         baseline: N concurrent echo round trips of one barrier-sized
               frame over loopback to a trivial asyncio echo server in this
               process (one event loop serves both ends)

Target (from the issue): a barrier round-trip over 1,000 agents under 50 ms
(median).  Everything lives in a temporary directory (DMTCP_TMPDIR, the
coordinator's --ckptdir) that is removed at the end; the coordinator is
stopped by pid, also on failure or Ctrl-C.  Progress goes to stderr, the
table to stdout.

    .venv/bin/python scripts/bench/bench_barrier.py [--agents 1,100,1000] [--rounds 20]
        [--profile-dir DIR]   # run the coordinator under cProfile, DIR/coordinator-N.prof
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import raise_nofile
from dmtcp_py.protocol import codec, messages
from dmtcp_py.protocol.messages import (
    Barrier,
    Cmd,
    Command,
    Hello,
    ImageInfo,
    Message,
    Published,
    Reached,
    Reply,
    Role,
    Welcome,
)
from dmtcp_py.protocol.states import State

HOST = "127.0.0.1"
BIN = Path(sys.executable).parent
BARRIERS = [State.SUSPENDED, State.FD_LEADER_ELECTION, State.DRAINED,
            State.CHECKPOINTED, State.REFILLED, State.RUNNING]
TARGET_AGENTS, TARGET_MS = 1000, 50.0
WARMUP = 1
TIME_BUDGET = 110.0       # the whole run, seconds
START_TIMEOUT = 15.0      # the coordinator wrote its port file
STOP_TIMEOUT = 5.0        # the coordinator exited after SIGINT
CONNECT_CONCURRENCY = 64  # stay below listen backlogs


def progress(text: str) -> None:
    print(f"[bench] {text}", file=sys.stderr, flush=True)


# ---- framed connections ----------------------------------------------------

class Conn:
    """One framed connection: frames out, messages in, one at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self._reader = messages.Reader()
        self._pending: collections.deque[Message] = collections.deque()

    @classmethod
    async def open(cls, port: int) -> Conn:
        return cls(*await asyncio.open_connection(HOST, port))

    def send(self, frame: bytes) -> None:
        self.writer.write(frame)

    async def recv(self) -> Message:
        while not self._pending:
            data = await self.reader.read(65536)
            if not data:
                raise ConnectionError("connection closed by the peer")
            self._pending.extend(self._reader.feed(data))
        return self._pending.popleft()

    def close(self) -> None:
        self.writer.close()


async def open_many(n: int, open_one) -> list:
    """open_one(0..n-1), a bounded number at a time; all or nothing."""
    gate = asyncio.Semaphore(CONNECT_CONCURRENCY)

    async def gated(i):
        async with gate:
            return await open_one(i)

    results = await asyncio.gather(*(gated(i) for i in range(n)), return_exceptions=True)
    opened = [r for r in results if not isinstance(r, BaseException)]
    if len(opened) < n:
        close_all(opened)
        raise next(r for r in results if isinstance(r, BaseException))
    return opened


def close_all(conns) -> None:
    for conn in conns:
        conn.close()


# ---- the coordinator under test ----------------------------------------------

@contextlib.contextmanager
def coordinator(workdir: Path, token: str, deadline: float, profile: Path | None):
    """A dmtcp-coordinator on a free loopback port; yields the port."""
    port_file = workdir / "port"
    port_file.unlink(missing_ok=True)
    ckptdir = workdir / "ckpt"
    ckptdir.mkdir(exist_ok=True)
    command = [sys.executable, "-m", "cProfile", "-o", str(profile), "-m",
               "dmtcp_py.cli.coordinator"] if profile else [str(BIN / "dmtcp-coordinator")]
    env = {**os.environ, "DMTCP_COORD_TOKEN": token, "DMTCP_TMPDIR": str(workdir)}
    log = workdir / "coordinator.out"
    with open(log, "ab") as out:
        proc = subprocess.Popen(command + ["-p", "0", "--port-file", str(port_file),
                                           "--ckptdir", str(ckptdir), "-i", "0", "-q"],
                                env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                preexec_fn=default_sigint)
    try:
        yield wait_for_port(proc, port_file, log, min(deadline, time.monotonic() + START_TIMEOUT))
    finally:
        stop(proc)


def wait_for_port(proc: subprocess.Popen, port_file: Path, log: Path, deadline: float) -> int:
    while time.monotonic() < deadline:
        if port_file.exists():
            return int(port_file.read_text())
        if proc.poll() is not None:
            raise RuntimeError(f"coordinator exited ({proc.returncode}): {log.read_text()[-500:]}")
        time.sleep(0.02)
    raise TimeoutError("coordinator did not write its port file")


def default_sigint() -> None:
    """In the child: SIGINT may be ignored here (started in the background),
    and stop() relies on it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def stop(proc: subprocess.Popen) -> None:
    """SIGINT (a profiled coordinator then writes its profile), then SIGKILL."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ---- simulated agents and the client -------------------------------------------

def hello(token: str, role: Role, **fields) -> bytes:
    return messages.encode(Hello(role=role, token=token, **fields))


async def join(port: int, hello_frame: bytes) -> Conn:
    conn = await Conn.open(port)
    conn.send(hello_frame)
    answer = await conn.recv()
    if not isinstance(answer, Welcome):
        conn.close()
        raise RuntimeError(f"coordinator refused us: {getattr(answer, 'error', answer.TYPE)}")
    return conn


def agent_hello(token: str, i: int) -> bytes:
    return hello(token, Role.AGENT, host="sim", pid=os.getpid(), program="sim",
                 tree_id=f"sim-{i}")


def reached(state: State, i: int) -> bytes:
    image = ImageInfo(path=f"/nonexistent/ckpt_sim_{i}.dmtcp", host="sim", tree_id=f"sim-{i}",
                      program="sim") if state is State.CHECKPOINTED else None
    return messages.encode(Reached(state=state, ok=True, image=image))


class SimAgent(asyncio.Protocol):
    """A simulated agent: answers every barrier from data_received with a
    frame encoded in advance, and publishes its images once running again,
    as a real agent does.  Real agents are separate processes; here 1,000
    share one event loop, so each must cost as little as possible, or the
    benchmark measures itself instead of the coordinator."""

    def __init__(self, token: str, i: int, first_seen: dict) -> None:
        self.hello = agent_hello(token, i)
        self.replies = {s: reached(s, i) for s in BARRIERS}
        self.first_seen = first_seen
        self.reader = messages.Reader()
        self.welcomed: asyncio.Future = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.write(self.hello)

    def data_received(self, data: bytes) -> None:
        for msg in self.reader.feed(data):
            if isinstance(msg, Barrier):
                self.first_seen.setdefault((msg.generation, msg.state.value), time.perf_counter())
                self.transport.write(self.replies[msg.state])
                if msg.state is State.RUNNING:
                    self.transport.write(messages.encode(
                        Published(generation=msg.generation, ok=True)))
            elif not self.welcomed.done():
                if isinstance(msg, Welcome):
                    self.welcomed.set_result(None)
                else:
                    self.welcomed.set_exception(RuntimeError(
                        f"coordinator refused us: {getattr(msg, 'error', msg.TYPE)}"))

    def connection_lost(self, exc) -> None:
        if not self.welcomed.done():
            self.welcomed.set_exception(ConnectionError("connection closed by the coordinator"))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def join_agent(port: int, token: str, i: int, first_seen: dict) -> SimAgent:
    _, agent = await asyncio.get_running_loop().create_connection(
        lambda: SimAgent(token, i, first_seen), HOST, port)
    try:
        await agent.welcomed
    except BaseException:
        agent.close()
        raise
    return agent


async def checkpoint(client: Conn) -> Reply:
    client.send(messages.encode(Command(cmd=Cmd.CHECKPOINT, blocking=True)))
    while not isinstance(reply := await client.recv(), Reply):
        pass
    if not reply.ok:
        raise RuntimeError(f"checkpoint failed: {reply.error}")
    return reply


def barrier_times(first_seen: dict, generations: list[int]) -> dict[str, list[float]]:
    """state X -> [first agent got X+1 - first agent got X, one per round]."""
    return {x.value: [first_seen[g, y.value] - first_seen[g, x.value] for g in generations]
            for x, y in zip(BARRIERS, BARRIERS[1:])}


async def bench_coordinator(port: int, token: str, n: int, rounds: int):
    first_seen: dict = {}
    agents = await open_many(n, lambda i: join_agent(port, token, i, first_seen))
    try:
        client = await join(port, hello(token, Role.CLIENT))
    except BaseException:
        close_all(agents)
        raise
    try:
        totals, generations = [], []
        for r in range(WARMUP + rounds):
            t0 = time.perf_counter()
            reply = await checkpoint(client)
            if r >= WARMUP:
                totals.append(time.perf_counter() - t0)
                generations.append(reply.body["generation"])
        return totals, barrier_times(first_seen, generations)
    finally:
        close_all(agents + [client])


# ---- baseline: trivial echo ------------------------------------------------------

class Echo(asyncio.Protocol):
    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)


class EchoClient(asyncio.Protocol):
    """Counts whole echoed frames; `waiting` resolves when `expected` arrived."""

    def __init__(self, counter: dict) -> None:
        self.decoder = codec.Decoder()
        self.counter = counter
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.counter["got"] += len(self.decoder.feed(data))
        if self.counter["got"] >= self.counter["expected"] and not self.counter["done"].done():
            self.counter["done"].set_result(None)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def bench_echo(n: int, rounds: int) -> list[float]:
    """N frames out at once, then every echo back: one sample per round.
    Both ends are Protocols, like the coordinator and the simulated agents."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Echo, HOST, 0, backlog=CONNECT_CONCURRENCY * 2)
    port = server.sockets[0].getsockname()[1]
    frame = messages.encode(Barrier(state=State.SUSPENDED, generation=1, num_trees=n))
    counter = {"got": 0, "expected": 0, "done": loop.create_future()}

    async def open_one(i):
        return (await loop.create_connection(lambda: EchoClient(counter), HOST, port))[1]

    conns = await open_many(n, open_one)
    try:
        times = []
        for r in range(WARMUP + rounds):
            counter.update(got=0, expected=n, done=loop.create_future())
            t0 = time.perf_counter()
            for conn in conns:
                conn.transport.write(frame)
            await counter["done"]
            if r >= WARMUP:
                times.append(time.perf_counter() - t0)
        return times
    finally:
        close_all(conns)
        server.close()


async def within(deadline: float, coro):
    try:
        async with asyncio.timeout_at(deadline):
            return await coro
    except TimeoutError:
        raise TimeoutError(f"over the time budget of {TIME_BUDGET:.0f} s") from None


# ---- report --------------------------------------------------------------------

def ms(samples: list[float]) -> str:
    return " / ".join(f"{1000 * f(samples):7.2f}" for f in (statistics.median, min, max))


def print_table(rows: list[tuple[int, list, dict, list]], rounds: int) -> None:
    print(f"\nbarrier benchmark: {rounds} rounds per N after {WARMUP} warm-up; "
          "times in ms as median / min / max")
    print(f"{'agents':>6}  {'checkpoint (6 barriers)':^25}  {'barrier round-trip':^25}  "
          f"{'echo baseline':^25}  barrier/echo")
    for n, totals, per_state, echoes in rows:
        barriers = [t for times in per_state.values() for t in times]
        ratio = statistics.median(barriers) / statistics.median(echoes)
        print(f"{n:>6}  {ms(totals)}  {ms(barriers)}  {ms(echoes)}  {ratio:8.1f}x")
    print("\nmedian per barrier, ms:")
    print(f"{'agents':>6}  " + "  ".join(f"{s.value:>18}" for s in BARRIERS[:-1]))
    for n, _, per_state, _ in rows:
        print(f"{n:>6}  " + "  ".join(f"{1000 * statistics.median(t):18.2f}"
                                      for t in per_state.values()))
    verdict(rows)


def verdict(rows) -> None:
    target = [per_state for n, _, per_state, _ in rows if n == TARGET_AGENTS]
    if not target:
        print(f"\ntarget: not measured (no N={TARGET_AGENTS} in --agents)")
        return
    median = 1000 * statistics.median(t for times in target[0].values() for t in times)
    result = "PASS" if median < TARGET_MS else "MISS"
    print(f"\ntarget: barrier round-trip over {TARGET_AGENTS} agents < {TARGET_MS:.0f} ms: "
          f"{result} (median {median:.2f} ms)")


# ---- main ------------------------------------------------------------------------

def measure(n: int, rounds: int, workdir: Path, deadline: float, profile_dir: Path | None):
    token = secrets.token_hex(16)
    profile = profile_dir / f"coordinator-{n}.prof" if profile_dir else None
    with coordinator(workdir, token, deadline, profile) as port:
        progress(f"N={n}: coordinator on port {port}, {WARMUP}+{rounds} checkpoints")
        totals, per_state = asyncio.run(within(deadline, bench_coordinator(port, token, n, rounds)))
    progress(f"N={n}: echo baseline")
    echoes = asyncio.run(within(deadline, bench_echo(n, rounds)))
    return n, totals, per_state, echoes


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", default="1,100,1000",
                        type=lambda s: [int(x) for x in s.split(",")],
                        help="comma-separated agent counts (default 1,100,1000)")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--profile-dir", type=Path,
                        help="run the coordinator under cProfile; profiles go here")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # clean up as on Ctrl-C
    deadline = time.monotonic() + TIME_BUDGET
    raise_nofile(2 * max(args.agents) + 256)
    if args.profile_dir:
        args.profile_dir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="dmtcp-bench-barrier-"))
    try:
        rows = [measure(n, args.rounds, workdir, deadline, args.profile_dir)
                for n in args.agents]
        print_table(rows, args.rounds)
        return 0
    except (RuntimeError, OSError, TimeoutError) as exc:
        print(f"bench_barrier: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
