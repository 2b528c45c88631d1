"""A dry run of the host_cost benchmark suite with tiny models (on the CPU: no graph rows, the
compile rows with the eager backend): every path it would time gives a row with its spread, and
its judgement on synthetic rows."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from shufflemoe.bench.ceilings import Ceilings  # noqa: E402
from shufflemoe.bench.suites import SUITES, Context  # noqa: E402
from shufflemoe.bench.suites import host_cost  # noqa: E402
from shufflemoe.integrations.transformers.models import _COMMON, TINY  # noqa: E402

CEILINGS = Ceilings(read_gbps=3000.0, copy_gbps=2900.0, bf16_tflops=750.0, fp8_tflops=1300.0)
DEV = "cuda" if torch.cuda.is_available() else "cpu"
_WIDTHS = {k: _COMMON[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim")}


def test_real_shapes_build_their_blocks():
    names = {s.model_type: host_cost.config(s) for s in host_cost.SHAPES}
    assert set(names) == {"qwen3_moe", "llama4_text", "mixtral", "gpt_oss", "qwen3_next"}
    assert names["qwen3_moe"].num_experts == 128 and names["gpt_oss"].num_local_experts == 128
    assert names["qwen3_next"].num_experts == 512 and names["qwen3_next"].layer_types == ["full_attention"]
    assert all(c.num_hidden_layers == 1 for c in names.values())


def test_suite_dry_run(monkeypatch):
    layers = ("num_hidden_layers", "layer_types")  # (the suite's config makes one layer)
    shapes = [host_cost.Shape(f"tiny-{t}", t, {k: v for k, v in dict(_WIDTHS, **TINY[t]).items()
                                               if k not in layers},
                              ("grouped_mm", "batched_mm") if t != "llama4_text" else (None,),
                              ours_experts=t in ("qwen3_moe", "qwen3_next"))
              for t in ("qwen3_moe", "llama4_text", "gpt_oss", "qwen3_next")]
    for name, value in dict(SHAPES=shapes, DEVICE=DEV, COMPILE_OPTIONS=dict(backend="eager")).items():
        monkeypatch.setattr(host_cost, name, value)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = SUITES.get("host_cost").run(Context(ceilings=CEILINGS, quick=True, suite="host_cost"))
    finally:
        torch.set_num_threads(threads)
    rows = result.rows
    assert not [r for r in rows if "failed" in r.get("note", "")], rows
    for shape in shapes:
        mine = [r for r in rows if r["model"] == shape.name]
        modes = {(r["side"], r["mode"]) for r in mine}
        assert {("ours", "eager"), ("peer", "eager"), ("ours", "compile"), ("peer", "compile")} <= modes
        assert (("ours", "layer_graphs") in modes) == (DEV == "cuda")
        for r in mine:
            assert r["us_lo"] <= r["us"] <= r["us_hi"] and r["wall_us"] > 0 and r["samples"] == 3
    # transformers' block with experts_implementation="shufflemoe": an eager row of ours, where
    # the shape takes it, with a headline of its own (not mixed into the patched block's)
    experts = {r["model"] for r in rows if r["impl"] == host_cost.EXPERTS_PATH}
    assert experts == {"tiny-qwen3_moe", "tiny-qwen3_next"}
    a = result.analyse(rows)
    assert a.targets and a.headlines and a.ratios
    whats = [h["what"] for h in a.headlines]
    assert sum("experts_implementation" in w for w in whats) == 2  # T = 1 and 64
    assert all(host_cost.EXPERTS_PATH not in h["result"] for h in a.headlines)


def _row(impl, side, mode, us, T=1):
    return dict(model="m", T=T, impl=impl, side=side, mode=mode, us=us, us_lo=us, us_hi=us)


@pytest.mark.parametrize("eager, graphs, met", [(100.0, 25.0, [True, True]), (130.0, 25.0, [False, True]),
                                                (100.0, 31.0, [True, False])])
def test_targets(eager, graphs, met):
    rows = [_row("transformers grouped_mm", "peer", "eager", 300.0),
            _row("shufflemoe (graph_buckets=None)", "ours", "eager", eager),
            _row("shufflemoe (default: per-layer graphs)", "ours", "layer_graphs", graphs)]
    a = host_cost.analyse(rows)
    assert [t["met"] for t in a.targets] == met
    best = {r["modes"].split(" (")[0]: r["ratio"] for r in a.ratios}
    assert best["eager vs eager"] == pytest.approx(300.0 / eager)
