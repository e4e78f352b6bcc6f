"""Python counter.  usage: counter.py TICKS INTERVAL_MS

Each tick extends a sha256 chain kept with the counter in a dict and prints
"tick N DIGEST".  Exits 3 if the state it keeps stops agreeing with itself
(the list of all counters must be 1..N).
"""
import hashlib
import sys
import time

# One write per line, so that processes sharing this output never split
# each other's lines: with PYTHONUNBUFFERED=1 (set on this project's machines)
# print() writes the text and its newline in two writes.
sys.stdout = open(sys.stdout.fileno(), "w", buffering=1, closefd=False)

ticks = int(sys.argv[1]) if len(sys.argv) > 1 else 100
interval = (int(sys.argv[2]) if len(sys.argv) > 2 else 20) / 1000
state = {"n": 0, "chain": b"", "seen": []}
while state["n"] < ticks:
    state["n"] += 1
    state["chain"] = hashlib.sha256(state["chain"] + str(state["n"]).encode()).digest()
    state["seen"].append(state["n"])
    if state["seen"][-1] != len(state["seen"]):
        print(f"invariant broken at {state['n']}", file=sys.stderr)
        sys.exit(3)
    print(f"tick {state['n']} {state['chain'].hex()[:16]}", flush=True)
    time.sleep(interval)
print(f"done {state['n']} {state['chain'].hex()[:16]}", flush=True)
