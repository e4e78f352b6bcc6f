"""The coordinator's console: one-letter commands on stdin, as in DMTCP."""
from __future__ import annotations

import math
import time

from dmtcp_py import graph_view
from dmtcp_py.listing import proc_lines, status_lines

HELP = """Commands:
  l : list the connected trees (host, pid, program, state)
  g : who talks to whom (bytes per second between trees, groups)
  s : status
  c : checkpoint now
  m TREE[,TREE...] [HOST] : move these trees (ids from l, or HOST:PID) to HOST
      (else a fresh copy on their host) while the others run
  v HOST [HOST2] : move every tree off HOST (to HOST2)
  i N : checkpoint every N seconds (0 disables)
  i auto : let the coordinator choose the interval (checkpoint cost, failures)
  k : kill the computation
  q : kill the computation and quit
  h, ? : this help"""


def handle(line: str, server) -> str | None:
    """Run one console line against the server; return text to print."""
    words = line.split()
    if not words:
        return None
    cmd, args = words[0], words[1:]
    m = server.machine
    now = time.monotonic()
    if cmd in ("h", "?"):
        return HELP
    if cmd == "s":
        st = m.status()
        return "\n".join([f"Status: computation {st['comp_id']}, port {server.port}",
                          *(f"  {line}" for line in status_lines(st, last_checkpoint=False))])
    if cmd == "l":
        rows = m.listing()
        if not rows:
            return "no trees connected"
        out = []
        for r in rows:
            out.append(f"{r['host']}  agent {r['agent_pid']}  {r['program']}  {r['state']}  "
                       f"{r['peers']} processes")
            out += proc_lines(r["procs"])
            out += [f"    outside: {c}" for c in r.get("external", [])]
        return "\n".join(out)
    if cmd == "g":
        return "\n".join(graph_view.lines(m.graph(now)))
    if cmd == "c":
        server.apply(m.request_checkpoint(None, now))
        return None
    if cmd in ("m", "v"):
        if not args or len(args) > 2:
            return "usage: m TREE[,TREE...] [HOST] | v HOST [HOST2]"
        to = args[1] if len(args) > 1 else ""
        if cmd == "m":
            specs = tuple(t for t in args[0].split(",") if t)
            server.apply(m.migrate(None, specs, now, to=to))
        else:
            server.apply(m.migrate(None, (), now, to=to, vacate=args[0]))
        return None
    if cmd == "i":
        auto = args[:1] == ["auto"]
        try:
            seconds = 0.0 if auto else float(args[0])
        except (IndexError, ValueError):
            return "usage: i SECONDS|auto"
        if not math.isfinite(seconds):
            return "usage: i SECONDS|auto"
        server.apply(m.set_interval(None, seconds, now, auto=auto))
        if auto:
            return f"checkpoint interval: auto, {m.interval:.1f} s for now"
        return f"checkpoint interval: {m.interval:g} s" + (" (disabled)" if not m.interval else "")
    if cmd == "k":
        server.apply(m.kill(None))
        return "killing the computation"
    if cmd == "q":
        server.apply(m.quit(None))
        return None
    return f"unknown command {cmd!r}; h for help"
