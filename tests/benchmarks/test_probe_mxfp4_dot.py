"""benchmarks/probe_mxfp4_dot.py --compare on its committed results (CPU): one row a case both
trees timed, the ratio first / second, both checks."""

from __future__ import annotations

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("probe_mxfp4_dot",
                                              ROOT / "benchmarks" / "probe_mxfp4_dot.py")
probe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(probe)
RESULTS = ROOT / "benchmarks" / "results"


def test_compare_joins_the_two_trees_rows():
    table = probe.compare(RESULTS / "probe_mxfp4_dot_af29fe7.json",
                          RESULTS / "probe_mxfp4_dot_11200dc.json").splitlines()
    assert table[0].startswith("| preset | T | af29fe7 us | 11200dc us | ratio |")
    assert len(table) == 2 + 12  # 12 cases, all timed in both
    maverick = next(row for row in table if row.startswith("| llama4-maverick TP8 | 64 |"))
    assert "| 1.161 |" in maverick and maverick.endswith("| ok / ok |")
