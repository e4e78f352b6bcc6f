"""What a PID namespace of the tree's own costs (issue 19): the same steps
with DMTCP_PID_NAMESPACE=0 (the tree on host pids, as before) and =1 (as
root, the default), interleaved, medians of RUNS runs each.

- launch: wall time of `dmtcp-launch --join /bin/true` (start to exit);
- checkpoint: wall time of `dmtcp-command -bc` of one small tree
  (sh and two sleeps);
- restart: from `dmtcp-restart --join IMAGE` to the coordinator's status
  saying its 3 processes run (polled every 5 ms).

usage: python scripts/bench/bench_pidns.py [RUNS]   (root; RUNS: 9)
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
TREE = ["sh", "-c", "sleep 600 & sleep 600 & wait"]
PROCESSES = 3  # under control: sh and the two sleeps


def tool(name: str) -> str:
    return str(BIN / name)


def status(port: int) -> dict:
    out = subprocess.run([tool("dmtcp-command"), "-p", str(port), "-s", "--json"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def wait_running(port: int, n: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = status(port)
        if st["num_peers"] >= n and st["running"]:
            return
        time.sleep(0.005)
    raise SystemExit(f"bench_pidns: error: {n} processes never ran under control")


def one_round(port: int, ckptdir: Path, env: dict, samples: dict[str, list[float]]) -> None:
    quiet = dict(stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0 = time.monotonic()
    subprocess.run([tool("dmtcp-launch"), "--join", "-p", str(port), "/bin/true"],
                   env=env, check=True, **quiet)
    samples["launch"].append(time.monotonic() - t0)

    tree = subprocess.Popen([tool("dmtcp-launch"), "--join", "-p", str(port), *TREE],
                            env=env, **quiet)
    wait_running(port, PROCESSES)
    t0 = time.monotonic()
    subprocess.run([tool("dmtcp-command"), "-p", str(port), "-bc"], check=True, **quiet)
    samples["checkpoint"].append(time.monotonic() - t0)
    subprocess.run([tool("dmtcp-command"), "-p", str(port), "-k"], check=True, **quiet)
    tree.wait(timeout=30)

    (image,) = ckptdir.glob("ckpt_*.dmtcp")
    t0 = time.monotonic()
    restarted = subprocess.Popen([tool("dmtcp-restart"), "--join", "-p", str(port), str(image)],
                                 env=env, **quiet)
    wait_running(port, PROCESSES)
    samples["restart"].append(time.monotonic() - t0)
    subprocess.run([tool("dmtcp-command"), "-p", str(port), "-k"], check=True, **quiet)
    restarted.wait(timeout=30)
    for old in ckptdir.glob("ckpt_*"):
        shutil.rmtree(old, ignore_errors=True)


def main() -> int:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 9
    if os.geteuid() != 0:
        print("bench_pidns: error: run as root (a user who is not root gets no namespace)",
              file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="bench-pidns-"))
    os.environ["DMTCP_TMPDIR"] = str(work)  # logs and the coordinator's token
    env = dict(os.environ)
    ckptdir = work / "ckpt"
    ckptdir.mkdir()
    port_file = work / "port"
    coordinator = subprocess.Popen(
        [tool("dmtcp-coordinator"), "--coord-port", "0", "--port-file", str(port_file),
         "--ckptdir", str(ckptdir), "-q"], env=env, stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not port_file.exists():
            time.sleep(0.01)
        port = int(port_file.read_text())
        results = {mode: {"launch": [], "checkpoint": [], "restart": []} for mode in ("0", "1")}
        for _ in range(runs):
            for mode in ("0", "1"):
                one_round(port, ckptdir, {**env, "DMTCP_PID_NAMESPACE": mode}, results[mode])
    finally:
        coordinator.kill()
        coordinator.wait()
        shutil.rmtree(work, ignore_errors=True)
    print(f"medians of {runs} runs (ms)      host pids   own PID namespace   difference")
    for step in ("launch", "checkpoint", "restart"):
        off = statistics.median(results["0"][step]) * 1000
        on = statistics.median(results["1"][step]) * 1000
        print(f"  {step:<27}{off:9.1f}   {on:17.1f}   {on - off:+10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
