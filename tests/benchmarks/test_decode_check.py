"""A CPU dry run of benchmarks/decode_check.py (the Triton interpreter, tiny shapes, no timing):
every section runs its checks and produces its rows, so the one GPU call does not fail on a typo."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import sys

import pytest
import torch

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "decode_check.py"


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the script itself runs")
def test_dry_run(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("decode_check", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "decode_check", script)  # its dataclasses look it up
    spec.loader.exec_module(script)
    result = script.main(["--dry-run", "--out", str(tmp_path)])
    assert not result["errors"], result["errors"]
    assert result["checks"] and all(c["ok"] for c in result["checks"])
    for part in ("decode", "sweep", "prefill"):
        assert result[part], f"no {part} rows"
    assert {r["candidate"] for r in result["prefill"]} >= {"heuristic", "fused kernels 64x64"}
    saved = json.loads((tmp_path / "decode_check.json").read_text())
    assert saved["checks"] == result["checks"]
