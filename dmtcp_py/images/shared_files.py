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


def _mappings(pids: list[int]):
    """(path, dev, inode) of every shared file mapping of pids."""
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
            major, minor = (int(x, 16) for x in fields[3].split(":"))
            yield fields[5].strip(), os.makedev(major, minor), int(fields[4])


def _live_name(deleted: str, dev: int, ino: int) -> str | None:
    """Another name of a mapped file whose own name was removed, in the
    same directory: glibc's sem_open maps a temporary name, links the file
    to the semaphore's name and removes the temporary one."""
    directory = os.path.dirname(deleted)
    try:
        names = os.listdir(directory)
    except OSError:
        return None
    for name in names:
        path = os.path.join(directory, name)
        try:
            st = os.stat(path, follow_symlinks=False)
        except OSError:
            continue
        if st.st_ino == ino and st.st_dev == dev:
            return path
    return None


def deleted_aliases(pids: list[int]) -> dict[str, str]:
    """Removed name of a shared mapping -> a name the file still has."""
    out = {}
    for path, dev, ino in _mappings(pids):
        if path.endswith(" (deleted)"):
            live = _live_name(path[:-len(" (deleted)")], dev, ino)
            if live is not None:
                out[path[:-len(" (deleted)")]] = live
    return out


def mapped_files(pids: list[int]) -> list[str]:
    """Regular files mapped shared by any of pids (by a name they still
    have, for one mapped through a removed name)."""
    found: set[str] = set(deleted_aliases(pids).values())
    for path, _dev, _ino in _mappings(pids):
        if path.startswith("/") and not path.endswith(" (deleted)") and os.path.isfile(path):
            found.add(path)
    return sorted(found)


def relink(remaps: list[dict]) -> None:
    """Before CRIU restores: the links CRIU reopens removed-name mappings
    through (link_remap.N, made at dump time and gone since), made again to
    the file's living name (written back by restore() first)."""
    for entry in remaps:
        if not os.path.lexists(entry["remap"]) and os.path.exists(entry["live"]):
            os.link(entry["live"], entry["remap"])


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
