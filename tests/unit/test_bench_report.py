"""The benchmark table's pure logic: targets, ratios, cells, the summary."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "bench"))

import report  # noqa: E402
from report import Row, Target  # noqa: E402

CKPT = Target(1.1, 0.1, "≤ 1.1x + 0.1 s")


def test_target_is_factor_times_baseline_plus_slack():
    assert CKPT.met(1.2, 1.0)
    assert not CKPT.met(1.21, 1.0)


def test_row_compares_medians():
    row = Row("s", "ckpt", [1.0, 9.0, 1.1], [1.0, 1.0, 0.1], "criu dump", "s", CKPT)
    assert row.ratio == 1.1
    assert row.verdict == "PASS"
    assert Row("s", "x", [2.0], [1.0], "b", "s", CKPT).verdict == "MISS"
    assert Row("s", "x", [2.0], [1.0], "b", "s").verdict == ""


def test_zero_baseline_gives_an_infinite_ratio():
    assert Row("s", "x", [1.0], [0.0], "b", "s").ratio == float("inf")


def test_cell_shows_median_and_spread_in_the_display_unit():
    assert report.cell([0.1, 0.2, 0.3], "ms") == "200.0 (100.0–300.0) ms"
    assert report.cell([2**30], "MiB") == "1024 (1024–1024) MiB"
    assert report.cell([1.5, 2.5], "s") == "2.000 (1.500–2.500) s"


def test_markdown_has_a_table_per_section_and_names_the_misses():
    rows = [Row("first", "a", [1.0], [1.0], "b", "s", CKPT),
            Row("second", "c", [5.0], [1.0], "d", "s", CKPT),
            Row("first", "e", [1.0], [1.0], "f", "s")]
    text = report.markdown(rows)
    assert text.index("### first") < text.index("### second")
    assert sum(line.startswith("| --- |") for line in text.splitlines()) == 2
    assert text.endswith("Targets: 1 of 2 met: missed second: c")
    assert "| a |" in text.split("### second")[0] and "| e |" in text.split("### second")[0]


def test_a_paired_target_holds_for_the_median_run_not_the_medians():
    stop = Target(1.0, 0.020, "≤ frozen + 20 ms", paired=True)
    # two dumps stopped the program 10 ms beyond their own frozen time, one
    # 300 ms: the medians alone (1.30 against 1.09) mix different runs
    frozen = [1.09, 1.29, 1.05]
    ours = [1.10, 1.30, 1.35]
    assert Row("s", "x", ours, frozen, "b", "ms", stop).verdict == "PASS"
    assert Row("s", "x", ours, frozen, "b", "ms", Target(1.0, 0.020, "unpaired")).verdict == "MISS"
    # 30 ms beyond in two runs of three: missed
    assert Row("s", "x", [1.12, 1.32, 1.35], frozen, "b", "ms", stop).verdict == "MISS"
    # samples that do not pair up (a reading missing) fall back to the medians
    assert Row("s", "x", [1.0, 2.0], [1.5], "b", "ms", stop).verdict == "PASS"
