"""benchmarks/gpu_tests_summary.py counts a finished run from pytest's last line, and a run cut off
by its timeout from the per-test lines, naming the tests that never reported."""

from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "benchmarks"))

from gpu_tests_summary import summarize  # noqa: E402

META = {"commit": "x"}
CUT = """tests/a.py::t1 
tests/a.py::t2 
[gw0] [ 10%] PASSED tests/a.py::t1 
tests/b.py::t3[8-fp8] 
[gw1] [ 20%] SKIPPED tests/a.py::t2 
tests/b.py::t4 
[gw0] [ 30%] FAILED tests/b.py::t4 
"""


def test_cut_off_run_counts_per_test_and_names_the_unfinished():
    d = summarize(CUT, 450, 124, META)
    assert (d["passed"], d["skipped"], d["failed"]) == (1, 1, 1)
    assert d["unfinished"] == ["tests/b.py::t3[8-fp8]"] and d["failed_tests"] == ["tests/b.py::t4"]
    assert d["summary"].startswith("no summary line") and d["meta"] == META


def test_finished_run_takes_the_last_line():
    log = CUT + "FAILED tests/b.py::t4 - boom\n=== 1 failed, 7 passed, 2 skipped in 3.0s ===\n"
    d = summarize(log, 3, 1, META)
    assert (d["passed"], d["skipped"], d["failed"]) == (7, 2, 1)
    assert d["failed_tests"] == ["tests/b.py::t4"] and d["unfinished"] == []
