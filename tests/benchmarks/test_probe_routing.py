"""A CPU dry run of benchmarks/probe_routing.py (tiny models): every MoE block gives a row whose
counts are within the tokens it saw, so the GPU call does not fail on a typo."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers")
ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the script itself runs")
def test_dry_run(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "probe_routing.py"),
                           "--dry-run", "--out", str(tmp_path)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = json.loads((tmp_path / "probe_routing.json").read_text())["rows"]
    assert {r["model"] for r in rows} == {"tiny-llama4_text", "tiny-qwen3_moe"} and len(rows) == 4
    for r in rows:
        assert r["tokens"] == 5
        assert all(0 <= r[c] <= r["tokens"] for c in ("ties", "hf_vs_fp32", "ours_vs_hf", "ours_vs_fp32"))
