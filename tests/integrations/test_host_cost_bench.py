"""A CPU dry run of the host_cost benchmark suite with tiny shapes: every path it would time on
the GPU makes a row (per-layer graphs need CUDA: absent; torch.compile with the eager backend),
so the GPU run does not fail on a typo."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from shufflemoe.bench.suites import SUITES, Context  # noqa: E402
from shufflemoe.bench.suites import host_cost  # noqa: E402
from shufflemoe.integrations.transformers.models import _COMMON, TINY  # noqa: E402

_ATTN = {k: _COMMON[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim")}


@pytest.fixture
def tiny_suite(monkeypatch):
    shapes = [
        host_cost.Shape("tiny-qwen3", "qwen3_moe", dict(_ATTN, **TINY["qwen3_moe"]),
                        ("grouped_mm", "batched_mm"), True),
        host_cost.Shape("tiny-llama4", "llama4_text", dict(_ATTN, **TINY["llama4_text"]), (None,)),
    ]
    for name, value in dict(SHAPES=shapes, DEVICE="cpu", TOKENS=(1, 3),
                            COMPILE_OPTIONS=dict(backend="eager")).items():
        monkeypatch.setattr(host_cost, name, value)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: see test_transformers.py
    yield shapes
    torch.set_num_threads(threads)


def test_suite_dry_run_on_cpu(tiny_suite):
    result = SUITES.get("host_cost").run(Context(ceilings=None, quick=True))
    rows = result.rows
    assert not [r for r in rows if r.get("note", "").startswith(("failed", "skipped"))], rows
    paths = {(r["model"], r["impl"]) for r in rows if r["T"] == 1}
    assert paths == {
        ("tiny-qwen3", "transformers grouped_mm"), ("tiny-qwen3", "transformers batched_mm"),
        ("tiny-qwen3", "shufflemoe (graph_buckets=None)"), ("tiny-qwen3", host_cost.EXPERTS_PATH),
        ("tiny-qwen3", "transformers grouped_mm + torch.compile"),
        ("tiny-qwen3", "shufflemoe + torch.compile"),
        ("tiny-llama4", "transformers default"), ("tiny-llama4", "shufflemoe (graph_buckets=None)"),
        ("tiny-llama4", "transformers default + torch.compile"),
        ("tiny-llama4", "shufflemoe + torch.compile")}
    assert all(r["us"] > 0 and r["us_lo"] <= r["us"] <= r["us_hi"] for r in rows)
    a = result.analyse(rows)
    whats = [h["what"] for h in a.headlines]
    assert any("experts_implementation" in w for w in whats)
    assert all(host_cost.EXPERTS_PATH not in h["result"] for h in a.headlines)
    assert len(a.targets) == 4  # eager and per-layer graphs, each shape
