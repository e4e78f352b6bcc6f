"""agent/tracking.py: which mappings are registered for write tracking."""
from __future__ import annotations

from dmtcp_py.agent.tracking import trackable_ranges

MAPS = """\
55d0c0000000-55d0c0001000 r--p 00000000 fe:01 1234 /usr/bin/prog
55d0c0001000-55d0c0002000 rw-p 00001000 fe:01 1234 /usr/bin/prog
55d0c1000000-55d0c1021000 rw-p 00000000 00:00 0 [heap]
7f0000000000-7f0004000000 rw-p 00000000 00:00 0
7f0004000000-7f0004001000 ---p 00000000 00:00 0
7f0005000000-7f0005001000 rw-s 00000000 00:01 99 /dev/zero (deleted)
7f0006000000-7f0006001000 rw-p 00000000 00:05 77 /memfd:x (deleted)
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]
7ffd00100000-7ffd00102000 r--p 00000000 00:00 0 [vvar]
7ffd00102000-7ffd00104000 r-xp 00000000 00:00 0 [vdso]
"""


def test_only_private_writable_anonymous_ranges():
    assert trackable_ranges(MAPS) == [
        (0x55D0C1000000, 0x55D0C1021000),  # heap
        (0x7F0000000000, 0x7F0004000000),  # anonymous mapping
        (0x7FFD00000000, 0x7FFD00021000),  # stack
    ]


def test_nothing_from_nothing():
    assert trackable_ranges("") == []
    assert trackable_ranges("garbage\n") == []
