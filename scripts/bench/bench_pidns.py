"""What a PID namespace of the tree's own costs (issue 19): the same steps
with DMTCP_PID_NAMESPACE=0 (the tree on host pids, as before) and =1 (as
root, the default), interleaved, medians of RUNS runs each.

- launch: wall time of `dmtcp-launch --join /bin/true` (start to exit);
- checkpoint: wall time of `dmtcp-command -bc` of one small tree
  (sh and two sleeps);
- restart: from `dmtcp-restart --join IMAGE` to the coordinator's status
  saying its 3 processes run (polled every 5 ms).

With --before CHECKOUT, a third column: the same steps with another
checkout's commands (its .venv/bin), say the commit before the namespace.

usage: python scripts/bench/bench_pidns.py [RUNS] [--before CHECKOUT]
       (root; RUNS: 9)
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


class Mode:
    """One column: whose commands, with what environment, under a
    coordinator and a checkpoint directory of its own."""

    def __init__(self, label: str, bindir: Path, env: dict, work: Path) -> None:
        self.label, self.bindir, self.env = label, bindir, env
        self.ckptdir = work / label.replace(" ", "-")
        self.ckptdir.mkdir()
        port_file = self.ckptdir / "port"
        self.coordinator = subprocess.Popen(
            [self.tool("dmtcp-coordinator"), "--coord-port", "0", "--port-file", str(port_file),
             "--ckptdir", str(self.ckptdir), "-q"], env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while not port_file.exists():
            time.sleep(0.01)
        self.port = int(port_file.read_text())
        self.samples: dict[str, list[float]] = {"launch": [], "checkpoint": [], "restart": []}

    def tool(self, name: str) -> str:
        return str(self.bindir / name)

    def close(self) -> None:
        self.coordinator.kill()
        self.coordinator.wait()


def status(mode: Mode) -> dict:
    out = subprocess.run([mode.tool("dmtcp-command"), "-p", str(mode.port), "-s", "--json"],
                         capture_output=True, text=True, check=True, env=mode.env).stdout
    return json.loads(out)


def wait_running(mode: Mode, n: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = status(mode)
        if st["num_peers"] >= n and st["running"]:
            return
        time.sleep(0.005)
    raise SystemExit(f"bench_pidns: error: {n} processes never ran under control")


def one_round(mode: Mode) -> None:
    port, ckptdir, env, samples, tool = mode.port, mode.ckptdir, mode.env, mode.samples, mode.tool
    quiet = dict(stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                 env=env)
    t0 = time.monotonic()
    subprocess.run([tool("dmtcp-launch"), "--join", "-p", str(port), "/bin/true"],
                   check=True, **quiet)
    samples["launch"].append(time.monotonic() - t0)

    tree = subprocess.Popen([tool("dmtcp-launch"), "--join", "-p", str(port), *TREE], **quiet)
    wait_running(mode, PROCESSES)
    t0 = time.monotonic()
    subprocess.run([tool("dmtcp-command"), "-p", str(port), "-bc"], check=True, **quiet)
    samples["checkpoint"].append(time.monotonic() - t0)
    subprocess.run([tool("dmtcp-command"), "-p", str(port), "-k"], check=True, **quiet)
    tree.wait(timeout=30)

    (image,) = ckptdir.glob("ckpt_*.dmtcp")
    t0 = time.monotonic()
    restarted = subprocess.Popen([tool("dmtcp-restart"), "--join", "-p", str(port), str(image)],
                                 **quiet)
    wait_running(mode, PROCESSES)
    samples["restart"].append(time.monotonic() - t0)
    subprocess.run([tool("dmtcp-command"), "-p", str(port), "-k"], check=True, **quiet)
    restarted.wait(timeout=30)
    for old in ckptdir.glob("ckpt_*"):
        shutil.rmtree(old, ignore_errors=True)


def main() -> int:
    args = sys.argv[1:]
    before = None
    if "--before" in args:
        at = args.index("--before")
        before = Path(args[at + 1]).resolve() / ".venv" / "bin"
        del args[at:at + 2]
        if not (before / "dmtcp-launch").exists():
            print(f"bench_pidns: error: no {before / 'dmtcp-launch'} (run `make setup` there)",
                  file=sys.stderr)
            return 2
    runs = int(args[0]) if args else 9
    if os.geteuid() != 0:
        print("bench_pidns: error: run as root (a user who is not root gets no namespace)",
              file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="bench-pidns-"))
    os.environ["DMTCP_TMPDIR"] = str(work)  # logs and the coordinators' tokens
    modes: list[Mode] = []
    try:
        if before is not None:
            modes.append(Mode("before", before, dict(os.environ), work))
        modes.append(Mode("host pids", BIN, {**os.environ, "DMTCP_PID_NAMESPACE": "0"}, work))
        modes.append(Mode("own PID namespace", BIN, {**os.environ, "DMTCP_PID_NAMESPACE": "1"},
                          work))
        for _ in range(runs):
            for mode in modes:  # interleaved: drift on a shared machine hits all alike
                one_round(mode)
    finally:
        for mode in modes:
            mode.close()
        shutil.rmtree(work, ignore_errors=True)
    print(f"medians of {runs} runs, ms  " + "".join(f"{m.label:>20}" for m in modes))
    for step in ("launch", "checkpoint", "restart"):
        print(f"  {step:<22}" + "".join(f"{statistics.median(m.samples[step]) * 1000:20.1f}"
                                         for m in modes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
