"""The benchmark table: rows of samples, each against a baseline measured in
the same run, rendered as Markdown (printed, and written to BENCHMARKS.md).
Pure: no I/O, no clock."""
from __future__ import annotations

import statistics
from dataclasses import dataclass

# display unit -> factor from the unit samples are kept in (seconds, bytes)
UNITS = {"s": 1.0, "ms": 1e3, "MiB": 1 / 2**20, "ms/GiB": 1e3 * 2**30}


@dataclass(frozen=True)
class Target:
    """ours <= factor * baseline + slack (medians, in the samples' unit).
    paired: the i-th sample of ours and of the baseline come from the same
    run (the program's stop and CRIU's frozen time of one dump), and the
    target holds for the median run: median(ours_i - factor * base_i) <=
    slack.  The medians of the two alone may come from different runs,
    and the baseline's own spread then decides the verdict."""
    factor: float
    slack: float
    text: str
    paired: bool = False

    def met(self, ours: float, base: float) -> bool:
        return ours <= self.factor * base + self.slack

    def met_by(self, ours: list[float], base: list[float]) -> bool:
        if self.paired and len(ours) == len(base):
            return statistics.median(o - self.factor * b for o, b in zip(ours, base)) <= self.slack
        return self.met(statistics.median(ours), statistics.median(base))


@dataclass(frozen=True)
class Row:
    section: str
    what: str
    ours: list[float]
    base: list[float]
    base_what: str
    unit: str
    target: Target | None = None

    @property
    def ratio(self) -> float:
        base = statistics.median(self.base)
        return statistics.median(self.ours) / base if base else float("inf")

    @property
    def verdict(self) -> str:
        if self.target is None:
            return ""
        return "PASS" if self.target.met_by(self.ours, self.base) else "MISS"


def cell(values: list[float], unit: str) -> str:
    """median (min–max) in the display unit."""
    k = UNITS[unit]
    med, lo, hi = statistics.median(values) * k, min(values) * k, max(values) * k
    digits = 3 if max(abs(med), abs(hi)) < 10 else 1 if med < 1000 else 0
    return f"{med:.{digits}f} ({lo:.{digits}f}–{hi:.{digits}f}) {unit}"


def markdown(rows: list[Row]) -> str:
    """One table per section, in the order the sections first appear."""
    out: list[str] = []
    sections = list(dict.fromkeys(r.section for r in rows))
    for section in sections:
        out += [f"### {section}", "",
                "| measurement | ours: median (min–max) | baseline | baseline: median (min–max) "
                "| ratio | target | |",
                "| --- | --- | --- | --- | --- | --- | --- |"]
        for r in (r for r in rows if r.section == section):
            out.append(f"| {r.what} | {cell(r.ours, r.unit)} | {r.base_what} | "
                       f"{cell(r.base, r.unit)} | {r.ratio:.2f}x | "
                       f"{r.target.text if r.target else ''} | {r.verdict} |")
        out.append("")
    misses = [r for r in rows if r.verdict == "MISS"]
    targets = [r for r in rows if r.target]
    out.append(f"Targets: {len(targets) - len(misses)} of {len(targets)} met"
               + (": missed " + "; ".join(f"{r.section}: {r.what}" for r in misses) if misses
                  else "."))
    return "\n".join(out)
