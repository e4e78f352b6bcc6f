"""agent.restoring.Restore.check_pages: the memory pages of a restart are
checked in a thread beside the agent's start, with threads taking turns
often until the check ends (else it waited a switch interval at every
step), and a damaged page file is named."""
from __future__ import annotations

import os
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from dmtcp_py.agent import restoring
from dmtcp_py.errors import ImageError
from dmtcp_py.images import integrity


def image_with_pages(tmp_path, damaged: bool = False):
    data = os.urandom(4 << 20)
    h = integrity.hasher(integrity.ALGORITHM)
    h.update(data)
    # damage flips bits: writing a fixed byte left the file as it was
    # whenever the random byte already had that value (1 run in 256, seen in CI)
    (tmp_path / "pages-1.img").write_bytes(
        data[:-1] + bytes([data[-1] ^ 0xFF]) if damaged else data)
    digests = {"pages-1.img": h.hexdigest()}
    # what check_pages reads of a manifest: its digests (no chunked data)
    m = SimpleNamespace(data=None, **{a: (digests if a == integrity.ALGORITHM else {})
                                      for a in integrity.ALGORITHMS})
    return restoring.Restore(tmp_path, m, lazy=False)


def restored_interval(before: float) -> bool:
    deadline = time.monotonic() + 5
    while sys.getswitchinterval() != before and time.monotonic() < deadline:
        time.sleep(0.001)  # (the future's callback runs just after its result)
    return sys.getswitchinterval() == before


def test_threads_take_turns_often_while_the_pages_are_checked(tmp_path, monkeypatch):
    before = sys.getswitchinterval()
    restore = image_with_pages(tmp_path)
    # the check waits until the interval was looked at: 4 MiB were once
    # checked, and the interval given back, before the assertion (seen in CI)
    looked = threading.Event()
    verify = integrity.verify

    def held(*args, **kwargs):
        looked.wait(30)
        return verify(*args, **kwargs)

    monkeypatch.setattr(integrity, "verify", held)
    restore.check_pages()
    assert sys.getswitchinterval() == min(before, restoring.CHECK_SWITCH_INTERVAL)
    looked.set()
    assert restore.pages.result(timeout=30) is None
    assert restored_interval(before)


def test_a_damaged_page_file_is_named_and_the_interval_comes_back(tmp_path):
    before = sys.getswitchinterval()
    restore = image_with_pages(tmp_path, damaged=True)
    restore.check_pages()
    with pytest.raises(ImageError, match="pages-1.img does not match"):
        restore.pages.result(timeout=30)
    assert restored_interval(before)
