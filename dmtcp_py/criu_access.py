"""Can this user run CRIU at all?  Asked before a program starts or a
restart begins, so that a user who is not root hears in one line what is
missing instead of a failed first checkpoint."""
from __future__ import annotations

import os
import struct

from dmtcp_py.paths import criu_binary, unprivileged, user

CAP_CHECKPOINT_RESTORE = 40
# struct vfs_cap_data (linux/capability.h): magic_etc, then (permitted,
# inheritable) for capabilities 0-31 and for 32-63
_VFS_CAP = struct.Struct("<IIIII")


def has_file_capability(path: str, cap: int) -> bool:
    """The file gives its runner capability `cap` (permitted and effective)."""
    try:
        raw = os.getxattr(path, "security.capability")
    except OSError:
        return False
    if len(raw) < _VFS_CAP.size:
        return False
    magic, perm_lo, _, perm_hi, _ = _VFS_CAP.unpack_from(raw)
    effective = magic & 0x1
    permitted = perm_lo | (perm_hi << 32)
    return bool(effective and permitted >> cap & 1)


def problem() -> str | None:
    """Why this user cannot checkpoint or restore, in one line; None if they can."""
    path = criu_binary()
    if not os.path.exists(path):
        return f"{path} is not installed (an administrator runs `make setup`)"
    if not os.access(path, os.X_OK):
        return (f"{path} may not be run by {user()} (an administrator "
                "decides who may: README, Users who are not root)")
    if unprivileged() and not has_file_capability(path, CAP_CHECKPOINT_RESTORE):
        return (f"{path} lacks the file capability CAP_CHECKPOINT_RESTORE that users who "
                f"are not root need (as root: `make setup`, or "
                f"setcap cap_checkpoint_restore+ep {path})")
    return None
