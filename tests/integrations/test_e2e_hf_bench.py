"""A CPU dry run of the e2e_hf benchmark suite with tiny shapes: every row it would time on the
GPU is produced (CUDA-graph rows are marked skipped; torch.compile and compiled generate run with
the eager backend), so the GPU run does not fail on a typo; and its judgement on synthetic rows."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from transformers import CompileConfig  # noqa: E402

from shufflemoe.bench.analysis import apply_ceilings  # noqa: E402
from shufflemoe.bench.ceilings import Ceilings  # noqa: E402
from shufflemoe.bench.suites import SUITES, Context  # noqa: E402
from shufflemoe.bench.suites import e2e_hf, e2e_paths  # noqa: E402
from shufflemoe.integrations.transformers.models import _COMMON, TINY  # noqa: E402

_ATTN = {k: _COMMON[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim")}
CEILINGS = Ceilings(read_gbps=3000.0, copy_gbps=2900.0, bf16_tflops=750.0, fp8_tflops=1300.0)


@pytest.fixture
def tiny_suite(monkeypatch):
    shapes = [
        e2e_hf.Shape("tiny-llama4", "llama4_text", dict(_ATTN, **TINY["llama4_text"]), layers=2,
                     quick_layers=2, full_layers=48, full_vocab=202048 // 24),
        e2e_hf.Shape("tiny-qwen3", "qwen3_moe", dict(_ATTN, **TINY["qwen3_moe"]), layers=2,
                     quick_layers=2, full_layers=48, full_vocab=151936 // 24),
    ]
    config = CompileConfig(backend="eager")
    config._compile_all_devices = True  # transformers compiles generate on the CPU only when asked
    for module, values in ((e2e_hf, dict(SHAPES=shapes, BATCHES=(1, 3), GENERATE_TOKENS=(2, 4),
                                          COMPILE_OPTIONS=dict(backend="eager"))),
                           (e2e_paths, dict(DEVICE="cpu", PREFILL_TOKENS=16, PROMPT_TOKENS=8,
                                            COMPILE_CONFIG=config))):
        for name, value in values.items():
            monkeypatch.setattr(module, name, value)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: see test_transformers.py
    yield shapes
    torch.set_num_threads(threads)


def test_real_shapes():
    scout, qwen = (s.config(quick=False) for s in e2e_hf.SHAPES)
    assert (scout.hidden_size, scout.num_local_experts, scout.intermediate_size,
            scout.num_experts_per_tok, scout.moe_layers) == (5120, 16, 8192, 1, list(range(4)))
    assert (qwen.hidden_size, qwen.num_experts, qwen.moe_intermediate_size,
            qwen.num_experts_per_tok, qwen.num_hidden_layers) == (2048, 128, 768, 8, 8)
    assert scout.vocab_size == 16832 and qwen.vocab_size == 25344  # scaled with depth


def test_every_mode_has_both_sides():
    for shape in e2e_hf.SHAPES:
        ps = e2e_hf.paths(shape.model_type)
        assert ps[0].side == "peer" and ps[0].mode == "eager"  # the checks' reference runs first
        modes = {(p.side, p.mode) for p in ps}
        for mode in ("eager", "step_graph", "compile", "compiled_generate"):
            assert {("ours", mode), ("peer", mode)} <= modes, (shape.name, mode)
        assert ("ours", "layer_graphs") in modes


def test_suite_dry_run_on_cpu(tiny_suite):
    result = SUITES.get("e2e_hf").run(Context(ceilings=CEILINGS, quick=True))
    rows = result.rows
    for r in rows:
        assert r.get("ms") or r["note"].startswith("skipped: CUDA graphs"), r
    for shape in tiny_suite:
        mine = [r for r in rows if r["model"] == shape.name]
        assert {r["mode"] for r in mine} == {"eager", "layer_graphs", "step_graph", "compile", "compiled_generate"}
        for r in mine:
            if r["mode"] != "step_graph":  # timed paths are checked against the float32 model
                assert r["check"].startswith("ok"), r
                assert r["hf_rel_l2_vs_fp32"] > 0  # bf16 is not float32: the reference is not the model itself
            if r["phase"] == "decode" and r.get("ms"):
                assert r["repeats"] >= 3 and r["ms_lo"] <= r["ms"] <= r["ms_hi"]
        # host-bound decode rows are timed in turns (ABAB...), transformers' and ours
        turns = [r for r in mine if r["phase"] == "decode" and r["mode"] in e2e_hf.INTERLEAVED_MODES]
        assert {r["side"] for r in turns} == {"ours", "peer"}
        assert all("interleaved" in r["note"] and r["repeats"] == e2e_hf.INTERLEAVED_REPEATS_QUICK for r in turns)
    apply_ceilings(rows, CEILINGS)
    a = result.analyse(rows)
    assert a.targets and a.headlines
    assert any(not r["like_for_like"] for r in a.ratios)  # the default-path pair, labelled
    assert all(r["modes"].split(" vs ")[0] == r["modes"].split(" vs ")[1] for r in a.ratios if r["like_for_like"])


def test_fp32_references_restore_the_bf16_model(tiny_suite):
    """The float32 reference runs the same weights upcast and leaves the bf16 model bit-identical
    (dtype and values of every parameter; buffers such as rotary frequencies untouched)."""
    from shufflemoe.integrations.transformers.models import build_model

    model = build_model(tiny_suite[0].config(quick=True), torch.bfloat16, "cpu")
    before = {n: t.clone() for n, t in list(model.named_parameters()) + list(model.named_buffers())}
    with torch.no_grad():
        refs = e2e_hf.fp32_references(model, (1, 3))
        bf16 = e2e_paths.Decoder(model, 3, 2, graph=False).checked_logits()
    after = dict(list(model.named_parameters()) + list(model.named_buffers()))
    assert all(after[n].dtype == t.dtype and torch.equal(after[n], t) for n, t in before.items())
    assert refs[("decode", 3)].shape == bf16.shape == (3, model.config.vocab_size)
    err = e2e_hf._rel_l2(bf16, refs[("decode", 3)])
    assert 1e-4 < err < 0.1  # bf16 rounding against float32, not a different model
    assert set(refs) == {("prefill", 1), ("decode", 1), ("decode", 3), ("first token", 1), ("first token", 3),
                         ("generate", 1), ("generate", 3)}
    # compiled generate's check: at least GENERATE_CHECK_SEQUENCES sequences, distinct prompts
    assert refs[("generate", 1)].shape[0] == refs[("first token", 1)].shape[0] == 8
    assert refs[("generate", 3)].shape[0] == 9
    assert not torch.equal(refs[("generate", 1)][0], refs[("generate", 1)][1])


@pytest.mark.parametrize("err, hf_err, ok", [
    (0.0125, 0.01, True), (0.0125 + e2e_hf.ACCURACY_FLOOR, 0.01, True),
    (0.0126 + e2e_hf.ACCURACY_FLOOR, 0.01, False), (0.9, 0.02, False),
    (e2e_hf.ACCURACY_FLOOR, 0.0, True), (0.005, 0.0, False), (None, None, False),
])
def test_accuracy_check_against_fp32(err, hf_err, ok):
    assert e2e_hf.accuracy_check(err, hf_err).startswith("ok") == ok


def _row(impl, side, mode, ms, phase="decode", batch=1, **extra):
    return dict(model="qwen3-30b-a3b", phase=phase, batch=batch, impl=impl, side=side, mode=mode, ms=ms,
                ms_lo=ms * 0.9, ms_hi=ms * 1.1, check="ok", **extra)


def synthetic(eager=9.0, layer_graphs=5.0, compiled=6.0, generate=2.0, step_b64=1.1) -> list[dict]:
    """transformers at eager 12 (batched_mm 11), compiled 8, compiled generate 2.6, step graph 1.6
    at b64; ours as given; floor 1.0 ms at b64."""
    return [_row("transformers grouped_mm (default)", "peer", "eager", 12.0),
            _row("transformers batched_mm", "peer", "eager", 11.0),
            _row("transformers grouped_mm (default) + torch.compile", "peer", "compile", 8.0),
            _row("transformers grouped_mm (default) + compiled generate", "peer", "compiled_generate", 2.6),
            _row("transformers grouped_mm (default) + step graph", "peer", "step_graph", 1.6, batch=64),
            _row("shufflemoe (graph_buckets=None)", "ours", "eager", eager),
            _row("shufflemoe (default: per-layer graphs)", "ours", "layer_graphs", layer_graphs),
            _row("shufflemoe + torch.compile", "ours", "compile", compiled),
            _row("shufflemoe + compiled generate", "ours", "compiled_generate", generate),
            _row("shufflemoe + step graph", "ours", "step_graph", step_b64, batch=64, x_floor=step_b64)]


def _met(rows) -> dict:
    return {t["target"].split(": ")[0]: t["met"] for t in e2e_hf.analyse(rows).targets}


Q = "qwen3-30b-a3b decode"


def test_targets_met_on_good_numbers():
    met = _met(synthetic())
    assert met == {f"{Q} b1 eager vs transformers eager (best)": True,
                   f"{Q} b1 per-layer graphs vs transformers eager (best)": True,
                   f"{Q} b1 torch.compile vs transformers' torch.compile (best)": True,
                   f"{Q} b1 compiled generate vs transformers' compiled generate (best)": True,
                   f"{Q} b64 step graph vs transformers' step graph (best)": True,
                   f"{Q} b64 step graph time / bytes floor": True}


@pytest.mark.parametrize("bad, target", [
    (dict(eager=9.0), None),
    (dict(eager=10.5), f"{Q} b1 eager vs transformers eager (best)"),  # 11 / 10.5 = 1.05 < 1.1
    (dict(layer_graphs=9.5), f"{Q} b1 per-layer graphs vs transformers eager (best)"),  # 1.16 < 1.2
    (dict(compiled=6.5), f"{Q} b1 torch.compile vs transformers' torch.compile (best)"),  # 1.23
    (dict(generate=2.1), f"{Q} b1 compiled generate vs transformers' compiled generate (best)"),  # 1.24
    (dict(step_b64=1.2), f"{Q} b64 step graph time / bytes floor"),
])
def test_each_target_can_fail(bad, target):
    met = _met(synthetic(**bad))
    assert [k for k, v in met.items() if not v] == ([target] if target else [])


def test_decode_targets_are_per_model():
    """Scout's eager and per-layer graph targets are higher (1.5x, 1.8x) than Qwen3's; a model
    the issue names no targets for gets none of those two."""
    scout = [dict(r, model="llama4-scout") for r in synthetic()]
    met = _met(scout)
    assert not met["llama4-scout decode b1 eager vs transformers eager (best)"]  # 11 / 9 = 1.22 < 1.5
    assert met["llama4-scout decode b1 per-layer graphs vs transformers eager (best)"]  # 2.2
    other = _met([dict(r, model="m") for r in synthetic()])
    assert not any("eager (best)" in k for k in other) and len(other) == 4


def test_ratios_are_against_the_fastest_peer_of_the_same_mode():
    rs = e2e_hf.analyse(synthetic()).ratios
    best = {(r["ours"], r["modes"]): r["ratio"] for r in rs if r["best_peer"]}
    assert best[("shufflemoe (graph_buckets=None)", "eager vs eager")] == pytest.approx(11 / 9)  # batched_mm
    assert best[("shufflemoe + compiled generate", "compiled_generate vs compiled_generate")] == pytest.approx(1.3)
    cross = [r for r in rs if not r["like_for_like"]]
    assert {r["ours"] for r in cross} == {"shufflemoe (default: per-layer graphs)"}
    assert all(r["modes"].startswith("default path vs default path") for r in cross)


def test_a_failed_check_fails_its_target():
    rows = synthetic()
    next(r for r in rows if r["impl"] == "shufflemoe (graph_buckets=None)")["check"] = "logits rel L2 0.9"
    assert not _met(rows)[f"{Q} b1 eager vs transformers eager (best)"]


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
            dec = e2e_paths.Decoder(model, 3, 12, graph)
            tokens = []
            for _ in range(10):
                dec.advance()
                tokens.append(dec.token.clone())
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
    kv = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * e2e_paths.PROMPT_TOKENS * 4
    E = cfg.num_local_experts
    assert cfg.num_experts_per_tok == 1
    assert e2e_hf.decode_bytes(model, 1) == pytest.approx(dense + expert / E + kv)
    many = e2e_hf.decode_bytes(model, 1000)
    assert many == pytest.approx(dense + expert + 1000 * kv)
