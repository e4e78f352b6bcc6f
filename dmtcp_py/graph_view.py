"""`dmtcp-command --graph`: the coordinator's traffic graph as lines, as
Graphviz DOT, or as a picture (Graphviz's dot draws it).

The graph is CoordinatorMachine.graph(): trees (with host and program),
edges (bytes per second, weighted over the time scales, and per scale),
groups of frequent communicators.  Trees are drawn grouped by host, edges
as thick as their traffic, each group of frequent communicators in one
colour.
"""
from __future__ import annotations

import math
import subprocess

from dmtcp_py.errors import UserError

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2",
           "#17becf", "#bcbd22", "#7f7f7f")
OUTSIDE_NODE = "outside"


def rate(bps: float) -> str:
    for unit, size in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bps >= size:
            return f"{bps / size:.1f} {unit}"
    return f"{bps:.0f} B/s"


def _names(graph: dict) -> dict[str, str]:
    return {t["tree_id"]: f"{t.get('program', '?')} {t['tree_id']}" for t in graph["trees"]}


def lines(graph: dict) -> list[str]:
    names = _names(graph)
    by_host: dict[str, list[str]] = {}
    for t in graph["trees"]:
        by_host.setdefault(t["host"], []).append(names[t["tree_id"]])
    out = [f"{host}: {', '.join(trees)}" for host, trees in sorted(by_host.items())]
    scales = "/".join(f"{h:g}" for h in graph.get("half_lives", []))
    for e in graph["edges"]:
        far = names.get(e["b"], e["b"]) if e["b"] else "(outside the computation)"
        out.append(f"  {names.get(e['a'], e['a'])} <-> {far}: {rate(e['bytes_per_s'])}"
                   f" (half-lives {scales} s: "
                   + ", ".join(rate(r) for r in e["by_scale"]) + ")")
    if not graph["edges"]:
        out.append("  no traffic between trees seen yet (sampled every few seconds)")
    groups = [g for g in graph["groups"] if len(g) > 1]
    out.append("groups: " + (" ".join("[" + ", ".join(names.get(t, t) for t in g) + "]"
                                      for g in groups)
                             if groups else "none (no pair of trees talks much)"))
    return out


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def dot(graph: dict) -> str:
    names = _names(graph)
    colour = {t: PALETTE[i % len(PALETTE)]
              for i, g in enumerate(g for g in graph["groups"] if len(g) > 1) for t in g}
    out = ["graph dmtcp {", "  graph [fontname=Helvetica, rankdir=LR, nodesep=0.6, ranksep=1.2];",
           "  node [fontname=Helvetica, shape=box, style=\"rounded,filled\", fillcolor=white];",
           "  edge [fontname=Helvetica, fontsize=10];"]
    by_host: dict[str, list[str]] = {}
    for t in graph["trees"]:
        by_host.setdefault(t["host"], []).append(t["tree_id"])
    for n, (host, trees) in enumerate(sorted(by_host.items())):
        out.append(f"  subgraph cluster_{n} {{ label={_quote(host)}; style=dashed;")
        for tree in trees:
            fill = colour.get(tree)
            extra = f", fillcolor={_quote(fill)}, fontcolor=white" if fill else ""
            out.append(f"    {_quote(tree)} [label={_quote(names[tree])}{extra}];")
        out.append("  }")
    busiest = max((e["bytes_per_s"] for e in graph["edges"]), default=1.0) or 1.0
    if any(not e["b"] for e in graph["edges"]):
        out.append(f"  {_quote(OUTSIDE_NODE)} [label=\"outside\", shape=ellipse, style=dashed];")
    for e in graph["edges"]:
        width = 1 + 5 * math.sqrt(e["bytes_per_s"] / busiest)
        far = e["b"] or OUTSIDE_NODE
        out.append(f"  {_quote(e['a'])} -- {_quote(far)} [xlabel={_quote(rate(e['bytes_per_s']))}, "
                   f"penwidth={width:.1f}];")
    out.append("}")
    return "\n".join(out) + "\n"


def png(graph: dict, path: str) -> None:
    """Draw the graph into a PNG file with Graphviz."""
    import shutil  # (here: the coordinator a restart starts loads this module)
    exe = shutil.which("dot")
    if exe is None:
        raise UserError("--png needs Graphviz's dot (apt install graphviz); --dot prints "
                        "the graph for it")
    res = subprocess.run([exe, "-Tpng", "-o", path], input=dot(graph), text=True,
                         capture_output=True, timeout=60)
    if res.returncode != 0:
        detail = (res.stderr.strip().splitlines() or ["failed"])[-1]
        raise UserError(f"cannot draw {path}: {detail}")
