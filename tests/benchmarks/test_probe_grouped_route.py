"""A CPU dry run of benchmarks/probe_grouped_route.py (interpreter, tiny counts, no timing): the
kernel and the torch ops it replaced choose the same experts for every shape, and the layer
with either router gives the same output (within one bf16 rounding: the routers' weights agree
to ~1e-6, not bit for bit), so the GPU call does not fail on a typo."""

from __future__ import annotations

import pytest
import torch

from dry_run import dry_run


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the script itself runs")
def test_dry_run(tmp_path):
    result = dry_run("probe_grouped_route", tmp_path)
    assert len(result["routing"]) == 8 and len(result["layer"]) == 1
    assert all(r["same_pairs"] and r["max_weight_diff"] < 2e-6 for r in result["routing"])
    layer = result["layer"][0]  # the same experts: at most a rounding of bf16 apart (2^-7)
    assert 0 < layer["max_abs"] and layer["max_abs_diff"] <= layer["max_abs"] * 2**-7


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the script itself runs")
def test_dry_run_tiles(tmp_path):
    """Section 3: every tiling of every shape routes as the chosen one does."""
    result = dry_run("probe_grouped_route", tmp_path, "--tiles",
                     result="probe_grouped_route_tiles")
    assert len(result["tiles"]) == 4
    for row in result["tiles"]:
        assert {"one program, 8 warps", "blocks of 1", "blocks of 2"} <= set(row["tilings"])
        assert not any(k.endswith("differs") for k in row), row
