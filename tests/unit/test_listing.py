"""Display text shared by several commands (dmtcp_py/listing.py): the exact
text that users, scripts and the e2e tests read."""
from __future__ import annotations

from dmtcp_py.cli.status import _print_status
from dmtcp_py.coordinator import console
from dmtcp_py.listing import address_text, status_lines

STATUS = {"comp_id": "c0ffee", "num_peers": 3, "num_trees": 2, "running": True,
          "state": "RUNNING", "generation": 4, "checkpoint_interval": 2.5,
          "last_checkpoint": {"generation": 4, "ok": True, "duration": 1.25, "bytes": 4096}}


def test_status_lines():
    assert status_lines(STATUS) == ["NUM_PEERS=3", "RUNNING=yes", "GENERATION=4",
                                    "CKPT_INTERVAL=2.5",
                                    "LAST_CKPT=generation 4 ok 1.250 s 4096 bytes"]
    idle = {**STATUS, "running": False, "checkpoint_interval": 0, "last_checkpoint": None}
    assert status_lines(idle) == ["NUM_PEERS=3", "RUNNING=no", "GENERATION=4", "CKPT_INTERVAL=0"]
    failed = {**STATUS, "last_checkpoint": {**STATUS["last_checkpoint"], "ok": False}}
    assert status_lines(failed)[-1] == "LAST_CKPT=generation 4 FAILED 1.250 s 4096 bytes"
    assert len(status_lines(STATUS, last_checkpoint=False)) == 4


def test_command_status_text(capsys):
    assert _print_status(STATUS, "127.0.0.1", 7779, as_json=False, listing=False) == 0
    assert capsys.readouterr().out == (
        "Coordinator: 127.0.0.1:7779, computation c0ffee\nNUM_PEERS=3\nRUNNING=yes\n"
        "GENERATION=4\nCKPT_INTERVAL=2.5\nLAST_CKPT=generation 4 ok 1.250 s 4096 bytes\n")


def test_console_status_text():
    class Machine:
        def status(self):
            return STATUS

    class Server:
        port = 7779
        machine = Machine()

    assert console.handle("s", Server()) == (
        "Status: computation c0ffee, port 7779\n  NUM_PEERS=3\n  RUNNING=yes\n"
        "  GENERATION=4\n  CKPT_INTERVAL=2.5")


def test_address_text():
    assert address_text(["10.0.0.1", 80]) == "10.0.0.1:80"
    assert address_text(("::1", 80, 0, 0)) == "::1:80"
    assert address_text("@dmtcp-agent") == "@dmtcp-agent"
    assert address_text(None) == "-"
