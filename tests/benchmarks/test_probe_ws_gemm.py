"""benchmarks/probe_ws_gemm.py --check on the CPU: its grouped GEMM kernel under the interpreter,
uneven groups with an empty one, against a float64 reference, so a GPU call does not fail on a
stale import."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from dry_run import ROOT


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the script itself runs")
def test_check():
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1",
               TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "probe_ws_gemm.py"),
                           "--check"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout.startswith("ok: max relative error")
