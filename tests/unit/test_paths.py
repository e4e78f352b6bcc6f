"""paths.run_dir_name: the run directory, private, made once."""
from __future__ import annotations

import os
import stat
import time

from dmtcp_py import paths


def test_the_run_directory_is_made_private_and_kept_so(tmp_path, monkeypatch):
    monkeypatch.setenv("DMTCP_TMPDIR", str(tmp_path / "not yet"))
    made = paths.run_dir_name()
    assert os.path.isdir(made) and stat.S_IMODE(os.stat(made).st_mode) == 0o700
    os.chmod(made, 0o755)  # (someone opened it up)
    assert paths.run_dir_name() == made
    assert stat.S_IMODE(os.stat(made).st_mode) == 0o700


def test_asking_again_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("DMTCP_TMPDIR", str(tmp_path))
    made = paths.run_dir_name()
    before = os.stat(made).st_ctime_ns
    time.sleep(0.05)  # (past the file system's clock granularity)
    paths.run_dir_name()
    assert os.stat(made).st_ctime_ns == before
