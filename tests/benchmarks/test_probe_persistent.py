"""benchmarks/probe_persistent.py --check on the CPU: its kernel's three phases, run as three
launches under the interpreter, against the probe's float32 reference (three router kinds, with
and without a shared expert, tied logits), so a GPU call does not fail on a stale import."""

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
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "probe_persistent.py"),
                           "--check"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout.count("rel err") == 3 * 4 * 2  # shapes x configurations x inputs
