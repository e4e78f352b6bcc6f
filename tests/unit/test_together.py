"""Several trees' agents in one process (agent/together.py, signals.py,
logs.py): which trees may share one, every agent hears every signal, and
each agent's records, from its tasks and from the executor's threads, go
to its own log file.  Real signals, real files, a real loop."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import time

import pytest

from dmtcp_py import logs
from dmtcp_py.agent import signals, together
from dmtcp_py.agent.config import agents_can_share
from dmtcp_py.errors import UserError
from dmtcp_py.paths import run_dir
from tests.unit.test_images import make_manifest

WAIT = 10.0  # seconds a signal may take to be heard (never asserted as a speed)


def test_only_trees_with_pid_namespaces_of_their_own_share_a_process():
    own = dataclasses.replace(make_manifest(), pid_namespace=True)
    host = dataclasses.replace(make_manifest(), pid_namespace=False)
    assert agents_can_share([own, own])
    assert not agents_can_share([own])          # one tree: its own agent, as ever
    assert not agents_can_share([own, host])    # an orphan of host's would be no one's


async def _until(predicate) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        assert time.monotonic() < deadline, "not heard"
        await asyncio.sleep(0.005)


def test_every_subscriber_hears_a_signal_and_the_handler_goes_with_the_last():
    heard: list[str] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        a = signals.subscribe(signal.SIGUSR1, heard.append, "a")
        b = signals.subscribe(signal.SIGUSR1, heard.append, "b")
        os.kill(os.getpid(), signal.SIGUSR1)
        await _until(lambda: len(heard) == 2)
        signals.unsubscribe(a)
        signals.unsubscribe(a)  # (twice: nothing more)
        os.kill(os.getpid(), signal.SIGUSR1)
        await _until(lambda: len(heard) == 3)
        signals.unsubscribe(b)
        assert not loop.remove_signal_handler(signal.SIGUSR1)  # gone with b

    asyncio.run(main())
    assert heard == ["a", "b", "b"]


@pytest.fixture
def root_logger():
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    yield root
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in saved[0]:
        root.addHandler(handler)
    root.setLevel(saved[1])


def test_each_agents_records_go_to_its_own_file(tmp_path, monkeypatch, root_logger):
    monkeypatch.setenv("DMTCP_TMPDIR", str(tmp_path))
    main_log = logs.setup("agent-first")
    log = logging.getLogger("agent")
    paths = {}

    async def agent(name: str) -> None:
        if name != "first":
            paths[name] = logs.own_file(f"agent-{name}")
        assert logs.current().endswith(f"agent-{name}.log")
        log.warning("task of %s", name)
        await asyncio.sleep(0)   # (the others run meanwhile)
        await asyncio.get_running_loop().run_in_executor(
            None, lambda: log.warning("thread of %s", name))

    async def main() -> None:
        asyncio.get_running_loop().set_default_executor(together._ContextExecutor(2))
        await asyncio.gather(*(agent(name) for name in ("first", "one", "two")))

    asyncio.run(main())
    log.warning("after them")   # (no agent's context: the process's file)
    texts = {"first": main_log.read_text(), **{n: p.read_text() for n, p in paths.items()}}
    for name, text in texts.items():
        assert f"task of {name}" in text and f"thread of {name}" in text
        assert all(f"of {other}" not in text for other in texts if other != name)
    assert "after them" in texts["first"]
    assert oct(os.stat(paths["one"]).st_mode & 0o777) == "0o600"


class _StubAgent:
    """runner.Agent's part that together.py uses: run(), let_go()."""
    log: list[str] = []
    given: list[tuple] = []  # (tree, its restore begun, what ends its claim)

    def __init__(self, cfg, shared: bool, begun=None, claim_ends=None) -> None:
        assert shared
        self.name = cfg.tree_id
        _StubAgent.given.append((cfg.tree_id, begun, claim_ends))

    async def run(self) -> int:
        await asyncio.sleep(0.01)
        if self.name == "bad":
            raise RuntimeError("a bug of ours")
        if self.name == "refused":
            raise UserError("cannot restart it")
        _StubAgent.log.append(f"{self.name} ran")
        return 3 if self.name == "three" else 0

    def let_go(self) -> None:
        _StubAgent.log.append(f"{self.name} let go")


def test_an_agent_that_fails_lets_go_and_the_others_go_on(tmp_path, monkeypatch, capfd,
                                                          root_logger):
    monkeypatch.setenv("DMTCP_TMPDIR", str(tmp_path))
    monkeypatch.setattr(together, "Agent", _StubAgent)
    _StubAgent.log, _StubAgent.given = [], []
    configs = [dataclasses.make_dataclass("Cfg", ["tree_id", "image"])(name, f"/i/{name}")
               for name in ("good", "bad", "refused", "three")]
    assert together.run(configs) == [0, 1, 1, 3]
    assert sorted(_StubAgent.log) == ["bad let go", "good ran", "refused let go", "three ran"]
    assert all(begun is None and ends is None for _, begun, ends in _StubAgent.given)
    err = capfd.readouterr().err.splitlines()
    assert "dmtcp-restart: error: cannot restart it" in err
    # restores dmtcp-restart began, and the claims it made, each to its own tree's agent
    _StubAgent.given = []
    together.run(configs, [f"restore of {c.tree_id}" for c in configs],
                 [f"claim of {c.tree_id}" for c in configs])
    assert sorted(_StubAgent.given) == sorted(
        (c.tree_id, f"restore of {c.tree_id}", f"claim of {c.tree_id}") for c in configs)
    assert any(line.startswith("dmtcp-restart: error: the agent of /i/bad failed (see ")
               for line in err)
    # (the traceback is in that tree's own log)
    assert "a bug of ours" in (run_dir() / f"agent-bad-restart-{os.getpid()}.log").read_text()
