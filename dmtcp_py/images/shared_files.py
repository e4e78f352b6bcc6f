"""Files the tree maps MAP_SHARED (a data file, a segment in /dev/shm).

CRIU saves a shared file mapping as a reference to the file, not its
contents: after a kill the file holds newer data than the restored
processes, or is gone (tmpfs after a reboot, another host).  So the agent
copies each such file into the image while the program is stopped, and
writes it back before CRIU restores.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path


def mapped_files(pids: list[int]) -> list[str]:
    """Regular files mapped shared by any of pids."""
    found: set[str] = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as maps:
                lines = maps.readlines()
        except OSError:
            continue
        for line in lines:
            fields = line.split(maxsplit=5)
            if len(fields) < 6 or fields[1][3] != "s" or fields[4] == "0":
                continue
            path = fields[5].strip()
            if path.startswith("/") and not path.endswith(" (deleted)") and os.path.isfile(path):
                found.add(path)
    return sorted(found)


def save(paths: list[str], image_dir: Path) -> list[dict]:
    """Copy each file into image_dir as shared-<n>.data; return the entries
    for the manifest."""
    entries = []
    for n, path in enumerate(paths):
        name = f"shared-{n}.data"
        try:
            st = os.stat(path)
            shutil.copyfile(path, image_dir / name)
        except OSError:
            continue  # unmapped and removed meanwhile: nothing to keep
        entries.append({"path": path, "data": name, "mode": st.st_mode & 0o7777,
                        "uid": st.st_uid, "gid": st.st_gid})
    return entries


def restore(entries: list[dict], image_dir: Path) -> None:
    """Put every saved file back, in place (its inode is kept when it still
    exists, for anything else that maps it)."""
    for entry in entries:
        path = Path(entry["path"])
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, entry["mode"])
        try:
            with open(image_dir / entry["data"], "rb") as src, os.fdopen(fd, "wb") as dst:
                fd = -1
                dst.truncate(0)
                shutil.copyfileobj(src, dst, 1 << 20)
        finally:
            if fd >= 0:
                os.close(fd)
        os.chmod(path, entry["mode"])
        os.chown(path, entry["uid"], entry["gid"])
