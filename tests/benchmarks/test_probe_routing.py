"""A CPU dry run of benchmarks/probe_routing.py (tiny models): every MoE block gives a row whose
counts are within the tokens it saw, so the GPU call does not fail on a typo."""

from __future__ import annotations

import pytest
import torch

from dry_run import dry_run_rows

pytest.importorskip("transformers")


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the script itself runs")
def test_dry_run(tmp_path):
    rows = dry_run_rows("probe_routing", tmp_path)
    assert {r["model"] for r in rows} == {"tiny-llama4_text", "tiny-qwen3_moe"} and len(rows) == 4
    for r in rows:
        assert r["tokens"] == 5
        assert all(0 <= r[c] <= r["tokens"] for c in ("ties", "hf_vs_fp32", "ours_vs_hf", "ours_vs_fp32"))
