"""A small Python program with a name.  usage: named_ticker.py NAME INTERVAL_MS

Prints "tick N NAME" every interval until killed, so that many of them can
share one output and each still be followed.  Like every Python program,
it maps glibc's gconv-modules.cache read-only MAP_SHARED.
"""
import sys
import time

# One write per line, so that processes sharing this output never split
# each other's lines: with PYTHONUNBUFFERED=1 (set on this project's machines)
# print() writes the text and its newline in two writes.
sys.stdout = open(sys.stdout.fileno(), "w", buffering=1, closefd=False)

name = sys.argv[1]
interval = int(sys.argv[2]) / 1000
n = 0
while True:
    n += 1
    print(f"tick {n} {name}", flush=True)
    time.sleep(interval)
