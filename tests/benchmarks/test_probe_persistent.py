"""benchmarks/probe_persistent.py --check on the CPU: its kernel's three phases, run as three
launches under the interpreter, against the probe's float32 reference (three router kinds, with
and without a shared expert, tied logits), so a GPU call does not fail on a stale import."""

from __future__ import annotations

import pytest
import torch

from dry_run import check


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the script itself runs")
def test_check():
    stdout = check("probe_persistent")
    assert stdout.count("rel err") == 3 * 4 * 2  # shapes x configurations x inputs
