"""A coordinator started by a launch or a restart (cli/coordinators.py
Starting): its port is bound, and its token file written, before the
program (or CRIU) starts; given up, it leaves neither behind."""
from __future__ import annotations

import socket

import pytest

from dmtcp_py.cli.coordinators import Starting
from dmtcp_py.errors import UserError
from dmtcp_py.paths import token_path
from dmtcp_py.tokens import resolve_token


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("DMTCP_TMPDIR", str(tmp_path))
    monkeypatch.delenv("DMTCP_COORD_TOKEN", raising=False)
    return tmp_path


def test_the_port_listens_and_the_token_is_there_before_the_coordinator(run_dir):
    starting = Starting(0, token="secret")
    try:
        port = starting.bind()
        assert port > 0 and starting.bind() == port  # (once)
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # queued, for the coordinator to accept once loaded
        assert resolve_token(port) == "secret"
    finally:
        starting.release()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    assert resolve_token(port) == ""


def test_a_taken_port_is_refused_before_anything_starts(run_dir):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        port = busy.getsockname()[1]
        with pytest.raises(UserError, match="already in use"):
            Starting(port, token="secret").bind()
    assert not (run_dir / token_path(port)).exists()


def test_stop_before_begin_releases_the_port(run_dir):
    starting = Starting(0, token="secret")
    port = starting.bind()
    starting.stop()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
