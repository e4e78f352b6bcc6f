"""A user who is not root, made for a test and removed with all it left:
its processes (by pid), its files in its home, /tmp and /dev/shm, its
account, and the ACL entries that let it reach the checkout."""
from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil

CHECKOUT = Path(__file__).resolve().parent.parent.parent
SCRATCH = (Path("/dev/shm"), Path("/tmp"))


class TestUser:
    """Popen/run as this user: its own uid, gid, no other groups, its home
    as cwd, and an environment of its own (DMTCP_TMPDIR and TMPDIR inside its
    home, so that its run directory and scratch go with it)."""

    def __init__(self, name: str, home: Path) -> None:
        self.name = name
        self.home = home
        entry = _pwnam(name)
        self.uid, self.gid = entry.pw_uid, entry.pw_gid

    def env(self, **extra: str) -> dict:
        tmp = self.home / "tmp"
        base = {k: v for k, v in os.environ.items()
                if not k.startswith(("DMTCP_", "XDG_", "OMPI_", "_DMTCP"))}
        base.update(HOME=str(self.home), USER=self.name, LOGNAME=self.name,
                    DMTCP_TMPDIR=str(tmp), TMPDIR=str(tmp),
                    PATH=f"{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin")
        base.update(extra)
        return base

    def _as_me(self, kwargs: dict) -> dict:
        env = kwargs.pop("env", None) or self.env()
        return {"user": self.uid, "group": self.gid, "extra_groups": [],
                "cwd": str(self.home), "env": env, **kwargs}

    def popen(self, argv: list[str], **kwargs) -> subprocess.Popen:
        return subprocess.Popen(argv, **self._as_me(kwargs))

    def run(self, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        kwargs.setdefault("timeout", 120)
        return subprocess.run(argv, **self._as_me(kwargs))

    def give(self, path: Path) -> Path:
        os.chown(path, self.uid, self.gid)
        return path

    def processes(self) -> list[psutil.Process]:
        found = []
        for proc in psutil.process_iter(["uids"]):
            uids = proc.info["uids"]
            if uids and self.uid in (uids.real, uids.effective):
                found.append(proc)
        return found


def _pwnam(name: str):
    import pwd
    return pwd.getpwnam(name)


def _reachable_by_others(path: Path) -> bool:
    return bool(path.stat().st_mode & stat.S_IXOTH)


@contextlib.contextmanager
def created_user():
    """A fresh account (dmtcpt<hex>), with a 0700 home of its own under
    /tmp; every trace of it is gone at the end, also on failure."""
    name = "dmtcpt" + os.urandom(4).hex()
    home = Path(tempfile.mkdtemp(prefix=f"{name}-", dir="/tmp"))
    acl: list[Path] = []
    made = False
    try:
        subprocess.run(["useradd", "-M", "-d", str(home), "-s", "/bin/sh", "-U", name],
                       check=True, capture_output=True)
        made = True
        user = TestUser(name, home)
        user.give(home)
        os.chmod(home, 0o700)
        (home / "tmp").mkdir(mode=0o700)
        user.give(home / "tmp")
        # the checkout (venv, shim) must be reachable: a clone in a 0700
        # home (root's) gets an ACL entry for this user on each such step
        for step in reversed([CHECKOUT, *CHECKOUT.parents]):
            if not _reachable_by_others(step):
                subprocess.run(["setfacl", "-m", f"u:{name}:x", str(step)],
                               check=True, capture_output=True)
                acl.append(step)
        yield user
    finally:
        if made:
            _remove(name, home, acl)
        else:
            shutil.rmtree(home, ignore_errors=True)


def _remove_ipc(uid: int) -> None:
    """The user's System V objects (ipcrm by id)."""
    for kind, flag, id_col in (("shm", "-m", 1), ("msg", "-q", 1), ("sem", "-s", 1)):
        try:
            rows = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()[1:]
        except OSError:
            continue
        header = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()[0].split()
        uid_col = header.index("uid")
        for row in rows:
            fields = row.split()
            if len(fields) > uid_col and fields[uid_col] == str(uid):
                subprocess.run(["ipcrm", flag, fields[id_col]], capture_output=True)


def _remove(name: str, home: Path, acl: list[Path]) -> None:
    user = TestUser(name, home)
    for _ in range(3):
        procs = user.processes()
        if not procs:
            break
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(procs, timeout=5)
    for scratch in SCRATCH:
        with contextlib.suppress(OSError):
            for entry in os.scandir(scratch):
                with contextlib.suppress(OSError):
                    if entry.stat(follow_symlinks=False).st_uid == user.uid:
                        if entry.is_dir(follow_symlinks=False):
                            shutil.rmtree(entry.path, ignore_errors=True)
                        else:
                            os.unlink(entry.path)
    _remove_ipc(user.uid)
    for step in acl:
        subprocess.run(["setfacl", "-x", f"u:{name}", str(step)], capture_output=True)
    subprocess.run(["userdel", name], capture_output=True)
    shutil.rmtree(home, ignore_errors=True)
