"""The usual command lines, read without click (cli/fastargs.py), give
what click gives for them; anything unusual is left to click (None)."""
from __future__ import annotations

import pytest

from dmtcp_py.cli import fastargs, launch_click, restart_click

ENV = ("DMTCP_COORD_HOST", "DMTCP_COORD_PORT", "DMTCP_CHECKPOINT_INTERVAL", "DMTCP_GZIP",
       "DMTCP_KEEP", "DMTCP_INCREMENTAL", "DMTCP_PRECOPY")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ENV:
        monkeypatch.delenv(name, raising=False)


def _handed_by_click(monkeypatch, module, function: str, words: list[str]) -> dict:
    """What module's click command hands to its function for words."""
    seen = {}
    monkeypatch.setattr(module, function, lambda a: seen.update(vars(a)) or 0)
    module.cli.main(args=words, prog_name=f"dmtcp-{function}", standalone_mode=False)
    return seen


def _by_click(monkeypatch, words: list[str]) -> dict:
    return _handed_by_click(monkeypatch, launch_click, "launch", words)


@pytest.mark.parametrize("words", [
    ["/bin/true"],
    ["-j", "-p", "7001", "prog", "a", "-x", "--join"],
    ["--join", "--coord-port=7002", "--coord-host", "h1", "prog"],
    ["-h", "10.0.0.1", "--ckptdir", "/data", "--gzip", "prog", "--", "b"],
    ["--new-coordinator", "-i", "auto", "--no-gzip", "--", "-prog-", "x"],
    ["-i", "2.5", "--ckptdir=/c", "--interval=0", "prog"],
    ["-p", "0", "prog"],
    ["--keep", "3", "--incremental", "prog"],
    ["--keep=0", "--no-incremental", "--gzip", "prog", "--keep", "9"],
    ["--precopy", "prog"],
    ["--precopy", "--no-incremental", "prog"],
    ["--incremental", "--no-precopy", "prog"],
])
def test_same_as_click(monkeypatch, words):
    fast = fastargs.launch_args(words)
    assert fast is not None
    assert vars(fast) == _by_click(monkeypatch, words)


@pytest.mark.parametrize("env", [
    {"DMTCP_COORD_PORT": "7100", "DMTCP_COORD_HOST": "h2"},
    {"DMTCP_CHECKPOINT_INTERVAL": "auto", "DMTCP_GZIP": "yes"},
    {"DMTCP_GZIP": "0", "DMTCP_CHECKPOINT_INTERVAL": "3"},
    {"DMTCP_KEEP": "2", "DMTCP_INCREMENTAL": "1"},
    {"DMTCP_PRECOPY": "yes"},
])
def test_same_environment_as_click(monkeypatch, env):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    words = ["prog", "arg"]
    assert vars(fastargs.launch_args(words)) == _by_click(monkeypatch, words)


@pytest.mark.parametrize("words", [
    [], ["--help"], ["--version"], ["-j"], ["-p", "notaport", "prog"], ["-p", "70000", "prog"],
    ["-p"], ["-i", "-1", "prog"], ["-i", "inf", "prog"], ["--bogus", "prog"], ["-jp", "7", "x"],
    ["--join=yes", "prog"], ["-p7000", "prog"], ["--keep", "-1", "prog"], ["--keep", "x", "prog"],
    ["--incremental=1", "prog"],
])
def test_the_unusual_is_left_to_click(words):
    assert fastargs.launch_args(words) is None


@pytest.mark.parametrize("env", [{"DMTCP_COORD_PORT": "x"}, {"DMTCP_GZIP": "maybe"},
                                 {"DMTCP_CHECKPOINT_INTERVAL": "soon"}, {"DMTCP_KEEP": "-2"},
                                 {"DMTCP_INCREMENTAL": "perhaps"}, {"DMTCP_PRECOPY": "often"}])
def test_an_environment_to_complain_about_is_left_to_click(monkeypatch, env):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert fastargs.launch_args(["prog"]) is None


@pytest.mark.parametrize("words, listing, as_json, port", [
    (["-s"], False, False, 7779),
    (["--status", "--json", "-p", "7001"], False, True, 7001),
    (["-l", "--coord-port=7002"], True, False, 7002),
    (["--json", "--list", "-h", "h1"], True, True, 7779),
])
def test_status_lines(words, listing, as_json, port):
    a = fastargs.status_args(words)
    assert (a.listing, a.as_json, a.port) == (listing, as_json, port)


@pytest.mark.parametrize("words", [
    [], ["-s", "-l"], ["-c"], ["-s", "extra"], ["--help"], ["-s", "-p", "x"], ["--json"],
    ["-s", "--json=1"],
])
def test_other_commands_are_left_to_click(words):
    assert fastargs.status_args(words) is None


def _restart_by_click(monkeypatch, words: list[str]) -> dict:
    return _handed_by_click(monkeypatch, restart_click, "run_restart", words)


@pytest.mark.parametrize("words", [
    ["ckpt_a.dmtcp"],
    ["-p", "7001", "-j", "a", "b"],
    ["a", "--lazy", "--coord-port=7002", "b", "--any-owner"],
    ["--new-coordinator", "--ckptdir", "/c", "--gzip", "--keep=2", "a"],
    ["--generation", "3", "--allow-changed-files", "--no-incremental", "a"],
    ["-h", "h1", "--incremental", "--no-gzip", "--generation=1", "a"],
    ["--precopy", "a"],
])
def test_restart_same_as_click(monkeypatch, words):
    fast = fastargs.restart_args(words)
    assert fast is not None
    assert vars(fast) == _restart_by_click(monkeypatch, words)


def test_precopy_implies_incremental():
    """(a pre-copy is stored as chunks, its generation shares them)"""
    a = fastargs.launch_args(["--precopy", "--no-incremental", "prog"])
    assert a.precopy and a.incremental


@pytest.mark.parametrize("words, env, kept, expected", [
    # not said: as the image's tree had it; an older image says nothing: off
    ([], {}, {"compress": True, "precopy": True}, (True, True, True)),
    ([], {}, {}, (False, False, False)),
    ([], {}, {"precopy": "yes"}, (False, False, False)),  # (not a bool: not said)
    # said, on the command line or in the environment: as said
    (["--no-gzip", "--no-precopy"], {}, {"compress": True, "precopy": True,
                                          "incremental": True}, (False, True, False)),
    ([], {"DMTCP_GZIP": "0", "DMTCP_INCREMENTAL": "1"}, {"compress": True},
     (False, True, False)),
    (["--precopy"], {}, {}, (False, True, True)),
])
def test_a_restart_goes_on_with_the_trees_options_unless_told(monkeypatch, words, env, kept,
                                                                expected):
    from dmtcp_py.cli.restarting import tree_options
    from dmtcp_py.images.manifest import Manifest
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    a = fastargs.restart_args([*words, "a"])
    assert vars(a) == _restart_by_click(monkeypatch, [*words, "a"])
    m = Manifest(comp_id="c", tree_id="t", program="p", argv=[], host="h", generation=1,
                 time=0.0, root_pid=1, pids=[1], peers=1, agent_socket="s", num_trees=1,
                 stdio={}, external=[], criu_version="4.2", options=kept)
    got = tree_options(a, m)
    assert (got["compress"], got["incremental"], got["precopy"]) == expected


def test_restart_environment_same_as_click(monkeypatch):
    for name, value in {"DMTCP_COORD_PORT": "7100", "DMTCP_GZIP": "1", "DMTCP_KEEP": "4"}.items():
        monkeypatch.setenv(name, value)
    assert vars(fastargs.restart_args(["a"])) == _restart_by_click(monkeypatch, ["a"])


@pytest.mark.parametrize("words", [
    [], ["--help"], ["--version"], ["--generation", "0", "a"], ["--generation", "x", "a"],
    ["--lazy=1", "a"], ["--bogus", "a"], ["-p"], ["--", "-a"], ["--keep", "-1", "a"],
])
def test_unusual_restart_lines_are_left_to_click(words):
    assert fastargs.restart_args(words) is None


def _action_by_click(monkeypatch, words: list[str]) -> tuple:
    """(host, port, action) that command_click.cli reads from words: what
    it would hand to CoordinatorClient, caught before any connection."""
    from dmtcp_py.cli import command_click
    seen = {}

    class Caught(Exception):
        pass

    def client(host, port, **_):
        seen.update(host=host, port=port)
        raise Caught

    monkeypatch.setattr(command_click, "CoordinatorClient", client)
    monkeypatch.setattr(command_click, "_checkpoint", lambda *a, **k: None)
    with pytest.raises(Caught):
        command_click.cli.main(args=words, prog_name="dmtcp-command", standalone_mode=False)
    return seen["host"], seen["port"]


@pytest.mark.parametrize("words, action", [
    (["-c"], "checkpoint"),
    (["-bc", "-p", "7001"], "bcheckpoint"),
    (["--bcheckpoint", "--coord-port=7002", "-h", "h1"], "bcheckpoint"),
    (["-kc"], "kcheckpoint"),
    (["--kill", "-h", "10.0.0.1"], "kill"),
    (["-q", "-p", "0"], "quit"),
    (["-bc", "-bc"], "bcheckpoint"),
])
def test_action_lines_same_as_click(monkeypatch, words, action):
    a = fastargs.action_args(words)
    assert a is not None and a.action == action
    assert (a.host, a.port) == _action_by_click(monkeypatch, words)
    assert a.blocking == (action in ("bcheckpoint", "kcheckpoint"))


@pytest.mark.parametrize("words", [
    [], ["-s"], ["-c", "-k"], ["-bc", "extra"], ["--help"], ["-bc", "--json"], ["-c", "-p", "x"],
    ["--kill=1"], ["-i", "3"], ["--migrate", "t1"], ["-bc", "-p"],
])
def test_other_action_lines_are_left_to_click(words):
    assert fastargs.action_args(words) is None


def _coordinator_by_click(monkeypatch, words: list[str]) -> dict:
    from dmtcp_py.cli import coordinator_click
    return _handed_by_click(monkeypatch, coordinator_click, "serve", words)


def _with_defaults(fast: fastargs.CoordinatorArgs) -> dict:
    """fast's options, those it left None as coordinating.serve takes them."""
    from dmtcp_py.cli import coordinating
    got = vars(fast)
    return {**got, **{k: v for k, v in coordinating.defaults().items() if got[k] is None}}


@pytest.mark.parametrize("words", [
    [],
    ["--daemon", "--exit-on-last", "-q", "--coord-port", "0", "--port-file", "/tmp/pf"],
    ["-p", "7003", "--listen", "0.0.0.0", "--ckptdir=/data", "-i", "auto", "--keep", "2"],
    ["--interval=1.5", "--exit-after-ckpt", "--quiet"],
])
def test_coordinator_same_as_click(monkeypatch, words):
    fast = fastargs.coordinator_args(words)
    assert fast is not None
    assert _with_defaults(fast) == _coordinator_by_click(monkeypatch, words)


def test_coordinator_environment_same_as_click(monkeypatch):
    env = {"DMTCP_COORD_PORT": "7100", "DMTCP_CHECKPOINT_INTERVAL": "4", "DMTCP_KEEP": "3",
           "DMTCP_CHECKPOINT_DIR": "/ck"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    fast = fastargs.coordinator_args([])
    assert _with_defaults(fast) == _coordinator_by_click(monkeypatch, [])


@pytest.mark.parametrize("words", [
    ["--help"], ["--version"], ["-h"], ["-p", "70000"], ["--auto-restart"], ["--bogus"],
    ["-i", "-1"], ["--daemon=1"], ["--hosts", "a,b"], ["extra"], ["--port-file", "/"],
])
def test_unusual_coordinator_lines_are_left_to_click(words):
    assert fastargs.coordinator_args(words) is None


@pytest.mark.parametrize("name", ["DMTCP_AUTO_RESTART", "DMTCP_HOSTS", "DMTCP_HEARTBEAT",
                                  "DMTCP_REPLICAS", "DMTCP_REBALANCE"])
def test_coordinator_recovery_variables_are_left_to_click(monkeypatch, name):
    monkeypatch.setenv(name, "1")
    assert fastargs.coordinator_args(["--daemon"]) is None
