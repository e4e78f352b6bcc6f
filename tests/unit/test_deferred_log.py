"""deferred_log: what a restart says before the agent's log exists waits
for it (hold, release), with the time it was said."""
from __future__ import annotations

import logging
import time

import pytest

from dmtcp_py import deferred_log


@pytest.fixture
def root_handler():
    """A handler on the root logger (what logs.setup installs), taken off after."""
    got: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            got.append(record)

    handler, root = Keep(), logging.getLogger()
    level = root.level
    try:
        yield handler, got
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
        deferred_log.release()


def test_what_is_said_while_held_comes_out_once_released_with_its_time(root_handler):
    handler, got = root_handler
    log = deferred_log.logger("test.held")
    deferred_log.hold()
    said = time.time()
    log.warning("%s grew after the checkpoint", "/data/run.log")
    log.debug("not wanted at INFO")
    time.sleep(0.05)
    logging.getLogger().addHandler(handler)  # (the log appears)
    logging.getLogger().setLevel(logging.INFO)
    assert got == []
    deferred_log.release()
    assert [r.getMessage() for r in got] == ["/data/run.log grew after the checkpoint"]
    assert got[0].name == "test.held" and got[0].levelno == logging.WARNING
    assert abs(got[0].created - said) < 0.04  # when said, not when released
    log.info("after")  # not held any more: straight through
    assert [r.getMessage() for r in got][-1] == "after"


def test_released_before_any_log_the_records_still_go_out(caplog):
    """(Without pytest's handler, logging's last resort prints the warnings
    on stderr: a restart that failed before its agent's log was there.)"""
    log = deferred_log.logger("test.nolog")
    deferred_log.hold()
    log.warning("cut back")
    assert caplog.records == []
    deferred_log.release()
    assert [(r.name, r.getMessage()) for r in caplog.records] == [("test.nolog", "cut back")]
