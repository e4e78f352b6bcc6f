"""`dmtcp-command -c/-bc/-kc/-k/-q` without click (cli/actions.py): what
it sends is the Command click's path sends, and what it prints for an
answer is what click's path prints, against a loopback coordinator of our
own (tests/unit/test_handshake.py's server)."""
from __future__ import annotations

import pytest

from dmtcp_py.cli import actions, command_click, fastargs
from dmtcp_py.cli.base import run
from dmtcp_py.errors import CoordinatorUnreachable, UserError
from dmtcp_py.protocol import messages
from dmtcp_py.protocol.messages import Cmd, Command, Reply, Welcome
from tests.unit.test_handshake import _Server

DONE = {"kind": "checkpoint", "generation": 4, "duration": 0.1234567, "bytes": 4096,
        "processes": 2, "trees": 1}


def _answers(reply: Reply) -> tuple[bytes, bytes]:
    return messages.encode(Welcome(comp_id="abc", agent_id=1)), messages.encode(reply)


def _fast(capsys, words: list[str], reply: Reply) -> tuple[list, str]:
    server = _Server(*_answers(reply))
    try:
        args = fastargs.action_args([*words, "-p", str(server.port)])
        actions.run(args)
    finally:
        server.close()
    return server.got[1:], capsys.readouterr().out


def _click(capsys, words: list[str], reply: Reply) -> tuple[list, str]:
    server = _Server(*_answers(reply))
    try:
        code = run("dmtcp-command", command_click.cli, [*words, "-p", str(server.port)])
    finally:
        server.close()
    assert code == 0
    return server.got[1:], capsys.readouterr().out


@pytest.fixture(autouse=True)
def no_env(monkeypatch, tmp_path):
    for name in ("DMTCP_COORD_HOST", "DMTCP_COORD_PORT", "DMTCP_COORD_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DMTCP_TMPDIR", str(tmp_path))  # no token file of a real coordinator


@pytest.mark.parametrize("words, reply, sent", [
    (["-bc"], Reply(ok=True, body=DONE), Command(cmd=Cmd.CHECKPOINT, blocking=True)),
    (["-kc"], Reply(ok=True, body=DONE), Command(cmd=Cmd.CHECKPOINT, blocking=True, stop=True)),
    (["-c"], Reply(ok=True, body={"generation": 5}), Command(cmd=Cmd.CHECKPOINT)),
    (["-c"], Reply(ok=True, body={"note": "a checkpoint is already in progress"}),
     Command(cmd=Cmd.CHECKPOINT)),
    (["-k"], Reply(ok=True, body={"killed": 3}), Command(cmd=Cmd.KILL)),
    (["-q"], Reply(ok=True), Command(cmd=Cmd.QUIT)),
])
def test_same_command_and_output_as_click(capsys, words, reply, sent):
    fast = _fast(capsys, words, reply)
    assert fast[0] == [sent]
    assert fast == _click(capsys, words, reply)
    if words == ["-bc"]:
        assert fast[1] == "checkpoint 4 done: 1 trees, 2 processes, 4096 bytes, 0.123 s\n"


def test_a_failed_checkpoint_is_the_coordinators_error(capsys):
    with pytest.raises(UserError, match="^no processes to checkpoint$"):
        _fast(capsys, ["-bc"], Reply(ok=False, error="no processes to checkpoint"))


def test_a_reply_without_the_figures_is_not_a_coordinators(capsys):
    with pytest.raises(CoordinatorUnreachable, match="unexpected reply"):
        _fast(capsys, ["-bc"], Reply(ok=True, body={"generation": 1}))
