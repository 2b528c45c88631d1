"""benchmarks/probe_ws_gemm.py --check on the CPU: its grouped GEMM kernel under the interpreter,
uneven groups with an empty one, against a float64 reference, so a GPU call does not fail on a
stale import."""

from __future__ import annotations

import pytest
import torch

from dry_run import check


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the script itself runs")
def test_check():
    stdout = check("probe_ws_gemm")
    assert stdout.startswith("ok: max relative error")
