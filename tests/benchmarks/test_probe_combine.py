"""A CPU dry run of benchmarks/probe_combine.py (tiny shapes, no timing): both parts produce their
rows and every check passes, so the GPU call does not fail on a typo."""

from __future__ import annotations

import pytest
import torch

from dry_run import dry_run_rows


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the script itself runs")
def test_dry_run(tmp_path):
    rows = dry_run_rows("probe_combine", tmp_path)
    assert {r["part"] for r in rows} == {"combine", "switch"}
    assert all(r["check_token_sum"] == r["check_atomic"] == "ok" for r in rows if r["part"] == "combine")
    assert (tmp_path / "probe_combine.md").read_text().count("|") > 10
