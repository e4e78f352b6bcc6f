"""Which SysV objects a tree without an IPC namespace of its own uses."""
from dmtcp_py.agent import sysv

MSG = """       key      msqid perms      cbytes       qnum lspid lrpid   uid   gid  cuid  cgid      stime      rtime      ctime
         0          3   600          64          1   100     0  1000  1000  1000  1000 1795540197          0 1795540197
         0          4   600           0          0     7   101  1000  1000  1000  1000 1795540197          0 1795540197
         0          5   600           0          0     7     8  1000  1000  1000  1000 1795540197          0 1795540197
"""


def test_queues_last_used_by_the_tree_count():
    assert sysv.queues({100, 101}, MSG) == 2
    assert sysv.queues({9}, MSG) == 0
    assert sysv.queues({100}, "header only\n") == 0


def test_segments_are_counted_once_each():
    one = ("7f0000000000-7f0000001000 rw-s 00000000 00:01 0          /SYSV00000000 (deleted)\n"
           "7f0000002000-7f0000003000 rw-s 00000000 00:01 32769      /SYSV00000000 (deleted)\n"
           "7f0000004000-7f0000005000 rw-s 00000000 00:1a 12         /dev/shm/x\n")
    two = "7f0000000000-7f0000001000 r--s 00000000 00:01 0          /SYSV00000000 (deleted)\n"
    assert sysv.segments([one, two]) == 2
