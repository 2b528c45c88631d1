"""A CPU dry run of the e2e_hf benchmark suite with tiny shapes: every row it would time on the
GPU is produced (CUDA-graph rows are marked skipped), so the GPU run does not fail on a typo."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from shufflemoe.bench.suites import SUITES, Context  # noqa: E402
from shufflemoe.bench.suites import e2e_hf  # noqa: E402
from shufflemoe.bench.timing import Ceilings  # noqa: E402
from shufflemoe.integrations.transformers.models import _COMMON, TINY  # noqa: E402
from shufflemoe.testing import tolerance_for  # noqa: E402

_ATTN = {k: _COMMON[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim")}


@pytest.fixture
def tiny_suite(monkeypatch):
    shapes = [
        e2e_hf.Shape("tiny-llama4", "llama4_text", dict(_ATTN, **TINY["llama4_text"]), layers=2,
                     quick_layers=2, full_layers=48, full_vocab=202048 // 24),
        e2e_hf.Shape("tiny-qwen3", "qwen3_moe", dict(_ATTN, **TINY["qwen3_moe"]), layers=2,
                     quick_layers=2, full_layers=48, full_vocab=151936 // 24),
    ]
    for name, value in dict(DEVICE="cpu", SHAPES=shapes, PREFILL_TOKENS=16, PROMPT_TOKENS=8,
                            BATCHES=(1, 3), COMPILE=dict(backend="aot_eager", fullgraph=True)).items():
        monkeypatch.setattr(e2e_hf, name, value)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: see test_transformers.py
    yield shapes
    torch.set_num_threads(threads)


def test_real_shapes_are_the_brief_ones():
    scout, qwen = (s.config(quick=False) for s in e2e_hf.SHAPES)
    assert (scout.hidden_size, scout.num_local_experts, scout.intermediate_size,
            scout.num_experts_per_tok, scout.moe_layers) == (5120, 16, 8192, 1, list(range(8)))
    assert (qwen.hidden_size, qwen.num_experts, qwen.moe_intermediate_size,
            qwen.num_experts_per_tok) == (2048, 128, 768, 8)
    assert scout.vocab_size == 33664 and qwen.vocab_size == 50624  # scaled with depth
    assert e2e_hf.SHAPES[0].config(quick=True).num_hidden_layers == 2


def test_suite_dry_run_on_cpu(tiny_suite):
    result = SUITES.get("e2e_hf")(Context(ceilings=Ceilings(0.0, 0.0, 0.0), quick=True))
    rows = result.rows
    for shape in tiny_suite:
        names = {r["implementation"] for r in rows if r["model"] == shape.name}
        assert {"shufflemoe", "shufflemoe, graph_buckets=None", "shufflemoe + CUDA graph",
                "hf default + CUDA graph", "shufflemoe + torch.compile",
                "hf default + torch.compile"} <= names
    timed = [r for r in rows if "CUDA graph" not in r["implementation"]]
    assert all(r["ms"] and r["ms"] > 0 for r in timed), [r for r in timed if not r["ms"]]
    assert all(r["note"].startswith("skipped") for r in rows if "CUDA graph" in r["implementation"])
    qwen = {(r["implementation"], r["phase"], r["batch"]) for r in rows if r["model"] == "tiny-qwen3"}
    assert ("hf batched_mm", "decode", 3) in qwen and ("hf batched_mm", "prefill", 1) not in qwen
    for r in rows:  # the patched model's logits are checked against transformers' in every run
        if r["phase"] == "prefill" and r["family"] == "shufflemoe" and r["ms"]:
            assert r["logits_rel_l2_vs_hf"] is not None
            assert r["logits_rel_l2_vs_hf"] < tolerance_for(torch.bfloat16).rel_l2
        if r["ms"]:
            assert r["ratio_vs_hf_best"] > 0
    assert {t["target"].split(":")[0] for t in result.targets} >= {
        "tiny-llama4 prefill b1", "tiny-qwen3 prefill b1"}
    assert set(result.columns) <= set(rows[0])


def test_graph_rows_are_compared_with_graph_rows():
    def row(impl, family, phase, ms):
        return dict(model="m", phase=phase, batch=1, implementation=impl, family=family, ms=ms)

    rows = [row("hf grouped_mm", "transformers", "prefill", 30.0),
            row("hf default + CUDA graph", "transformers+graph", "prefill", 20.0),
            row("shufflemoe", "shufflemoe", "prefill", 40.0),
            row("shufflemoe + CUDA graph", "shufflemoe", "prefill", 10.0),
            row("hf grouped_mm", "transformers", "decode", 8.0),
            row("hf default + CUDA graph", "transformers+graph", "decode", 4.0),
            row("shufflemoe + CUDA graph", "shufflemoe", "decode", 5.0)]
    rows[-1]["floor_ms"] = 3.2  # a decode step's bytes floor bounds the attainable ratio: 8 / 3.2
    rows, targets = e2e_hf._with_ratios(rows)
    got = {t["target"]: (t["measured"], t["met"]) for t in targets}
    assert got == {"m prefill b1: shufflemoe >= 1x HF best": (0.75, False),
                   "m prefill b1: shufflemoe + CUDA graph >= 1x HF default + CUDA graph": (2.0, True),
                   "m decode b1: shufflemoe + CUDA graph >= 2x HF best (attainable: 2.50x at the floor)":
                       (1.6, False)}
    assert rows[3]["ratio_vs_hf_best"] == 3.0 and rows[2]["ratio_vs_hf_graph"] is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("model_type", ["llama4_text", "qwen3_moe"])
def test_captured_decode_step_matches_eager(model_type):
    """The bench's whole-step CUDA graph replays decode correctly with a patched model (and with
    graphs per MoE layer): the same greedy tokens as eager decoding, float32."""
    from shufflemoe.integrations.transformers import patch
    from shufflemoe.integrations.transformers.models import build_model, tiny_config

    cfg = tiny_config(model_type, layer_types=["full_attention"] * 2)
    model = patch(build_model(cfg, torch.float32, "cuda"))
    runs = {}
    with torch.no_grad():
        for name, graph, buckets in (("eager", False, None), ("graph", True, None),
                                     ("layer graphs", False, (1, 2, 4))):
            patch(model, graph_buckets=buckets)
            advance, token = e2e_hf.decoder(model, 3, 12, graph)
            tokens = []
            for _ in range(10):
                advance()
                tokens.append(token.clone())
            runs[name] = torch.cat(tokens, 1)
    assert torch.equal(runs["graph"], runs["eager"]) and torch.equal(runs["layer graphs"], runs["eager"])


def test_decode_floor_counts_weights_in_use(tiny_suite):
    """Batch 1 on a top-1 model reads one expert of each layer, every other weight but the
    embedding table, and the prompt's keys and values; a large batch reads nearly every expert."""
    from shufflemoe.integrations.transformers.models import build_model

    model = build_model(tiny_suite[0].config(quick=True), torch.float32, "cpu")
    cfg = model.config
    params = dict(model.named_parameters())
    expert = sum(p.numel() for n, p in params.items() if ".experts." in n) * 4
    dense = sum(p.numel() for n, p in params.items()
                if ".experts." not in n and "embed_tokens" not in n) * 4
    kv = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * e2e_hf.PROMPT_TOKENS * 4
    E = cfg.num_local_experts
    assert cfg.num_experts_per_tok == 1
    assert e2e_hf.decode_bytes(model, 1) == pytest.approx(dense + expert / E + kv)
    many = e2e_hf.decode_bytes(model, 1000)
    assert many == pytest.approx(dense + expert + 1000 * kv)
