"""A CPU dry run of benchmarks/probe_combine.py (tiny shapes, no timing): both parts produce their
rows and every check passes, so the GPU call does not fail on a typo."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the script itself runs")
def test_dry_run(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "probe_combine.py"),
                           "--dry-run", "--out", str(tmp_path)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = json.loads((tmp_path / "probe_combine.json").read_text())["rows"]
    assert {r["part"] for r in rows} == {"combine", "switch"}
    assert all(r["check_token_sum"] == r["check_atomic"] == "ok" for r in rows if r["part"] == "combine")
    assert (tmp_path / "probe_combine.md").read_text().count("|") > 10
