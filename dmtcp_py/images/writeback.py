"""Start the kernel's writeback of a file's range without waiting for it
(sync_file_range): the fsync that makes the file durable later finds most
of its pages on the disk already (images.follow, images.chunks)."""
from __future__ import annotations

import ctypes

_SYNC_FILE_RANGE_WRITE = 2
_libc: ctypes.CDLL | None = None


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Start writing the range to the disk; do not wait (the fsync will)."""
    global _libc
    if _libc is None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64,
                                         ctypes.c_uint]
        _libc = libc
    _libc.sync_file_range(fd, offset, length, _SYNC_FILE_RANGE_WRITE)  # a hint: errors ignored
