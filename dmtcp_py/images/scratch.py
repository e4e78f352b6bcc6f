"""Where scratch files live: gone after a reboot, never on another host,
the job's own.  A file there that the tree uses is kept in the image and
made again at restart only if it is missing."""
from __future__ import annotations

import ctypes
import os

ROOTS = ("/tmp", "/var/tmp", "/dev/shm", "/run")
# statfs f_type of the memory file systems (linux/magic.h)
_MEMORY_FS = {0x01021994,   # tmpfs
              0x858458F6}   # ramfs
_libc = ctypes.CDLL(None, use_errno=True)


def under_root(path: str) -> bool:
    return any(path == root or path.startswith(root + "/") for root in ROOTS)


def is_scratch(path: str) -> bool:
    """Under one of ROOTS, or on a memory file system anywhere."""
    if under_root(path):
        return True
    buf = ctypes.create_string_buffer(128)  # struct statfs; f_type comes first
    if _libc.statfs(os.path.dirname(path).encode(), buf) != 0:
        return False
    return int.from_bytes(buf.raw[:8], "little") in _MEMORY_FS
