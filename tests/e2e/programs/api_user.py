"""A Python program that uses the dmtcp module and checks what it is told
(the twin of api_user.c).  usage: api_user.py TICKS INTERVAL_MS"""
import os
import sys
import time

import dmtcp

calls = {"before": 0, "resume": 0, "restart": 0}


def fail(what):
    print(f"FAIL {what}", file=sys.stderr, flush=True)
    sys.exit(3)


def main():
    ticks, ms = int(sys.argv[1]), int(sys.argv[2])
    if not dmtcp.is_enabled():
        fail("dmtcp.is_enabled() under dmtcp-launch")
    if dmtcp.checkpoint_dir() != os.environ.get("DMTCP_CHECKPOINT_DIR"):
        fail("checkpoint_dir()")
    dmtcp.register(before_checkpoint=lambda: calls.__setitem__("before", calls["before"] + 1),
                   after_resume=lambda: calls.__setitem__("resume", calls["resume"] + 1),
                   after_restart=lambda: calls.__setitem__("restart", calls["restart"] + 1))
    for i in range(1, ticks + 1):
        print(f"tick {i}", flush=True)
        if i == 5:
            with dmtcp.critical_section():
                pass  # nests and ends: later checkpoints are not held up
            r = dmtcp.checkpoint()
            ckpts, restarts = dmtcp.local_status()
            print(f"returned {r} gen {dmtcp.generation()} ckpts {ckpts} restarts {restarts} "
                  f"hooks {calls['before']} {calls['resume']} {calls['restart']}", flush=True)
            if dmtcp.generation() != 1 or calls["before"] != 1:
                fail("generation 1, one before_checkpoint call")
            if r == dmtcp.AFTER_CHECKPOINT and (calls["resume"], calls["restart"]) != (1, 0):
                fail("after_resume once, no after_restart")
            if r == dmtcp.AFTER_RESTART and (calls["resume"], calls["restart"]) != (0, 1):
                fail("after_restart once, no after_resume")
            if r not in (dmtcp.AFTER_CHECKPOINT, dmtcp.AFTER_RESTART):
                fail(f"checkpoint() returned {r}")
        time.sleep(ms / 1000)
    print("done", flush=True)


main()
