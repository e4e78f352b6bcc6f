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


def keep(path: str, image_dir: Path, name: str) -> dict | None:
    """Copy path into image_dir/name; its manifest entry, or None if it is
    gone meanwhile."""
    try:
        st = os.stat(path)
        shutil.copyfile(path, image_dir / name)
    except OSError:
        return None
    return {"path": path, "data": name, "mode": st.st_mode & 0o7777,
            "uid": st.st_uid, "gid": st.st_gid}


def put_back(entry: dict, image_dir: Path, *, only_if_missing: bool = False) -> bool:
    """Write a kept file back to its path, with its mode and owner; in place
    when it exists (its inode is kept, for anything else that maps it), or
    not at all with only_if_missing.  True if written."""
    path = Path(entry["path"])
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if only_if_missing else 0)
    try:
        fd = os.open(path, flags, entry["mode"])
    except FileExistsError:
        return False
    with os.fdopen(fd, "wb") as dst, open(image_dir / entry["data"], "rb") as src:
        dst.truncate(0)
        shutil.copyfileobj(src, dst, 1 << 20)
    os.chmod(path, entry["mode"])
    os.chown(path, entry["uid"], entry["gid"])
    return True


def save(paths: list[str], image_dir: Path) -> list[dict]:
    """Copy each file into image_dir as shared-<n>.data; return the entries
    for the manifest (a file unmapped and removed meanwhile has none)."""
    entries = [keep(path, image_dir, f"shared-{n}.data") for n, path in enumerate(paths)]
    return [e for e in entries if e is not None]


def restore(entries: list[dict], image_dir: Path) -> None:
    """Put every saved file back, in place."""
    for entry in entries:
        put_back(entry, image_dir)
