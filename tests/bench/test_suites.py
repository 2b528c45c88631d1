"""The suites' bookkeeping on the CPU (their timing needs a GPU; their judgement does not): every
target is met on good synthetic rows and fails on bad ones, and the layer suite's byte counts and
spec-basis inputs are right."""

import pytest
import torch

from factories import make_layer
from shufflemoe import MoEConfig
from shufflemoe.bench.analysis import apply_ceilings
from shufflemoe.bench.ceilings import Ceilings
from shufflemoe.bench.run import load_suites
from shufflemoe.bench.suites import SUITES
from shufflemoe.bench.suites import grouped_gemm as gg
from shufflemoe.bench.suites import layer, layer_report, token_ops

C = Ceilings(read_gbps=3200.0, copy_gbps=2900.0, bf16_tflops=750.0, fp8_tflops=1300.0)


def timed(us, **fields):
    return dict(us=us, us_lo=0.95 * us, us_hi=1.05 * us, **fields)


def failed(targets) -> list[str]:
    return [t["target"] for t in targets if not t["met"]]


def test_suites_register_with_parts_within_the_budget():
    names = load_suites()
    assert set(names) >= {"index_shuffle", "token_movement", "grouped_gemm", "grouped_gemm_sweep", "layer", "e2e_hf"}
    parts = {}
    for n in names:
        s = SUITES.get(n)
        parts[s.part] = parts.get(s.part, 0) + s.est_s
    assert set(parts) == {1, 2} and sum(parts.values()) <= 15 * 60 and max(parts.values()) <= 8 * 60


# ---- index_shuffle / token_movement / grouped_gemm -------------------------------------------------

def shuffle_rows(us=4.0, peer_graph=60.0, check="ok"):
    rows = []
    for (T, E), spec in token_ops.SPEC_US.items():
        case = dict(case="index_shuffle top1", shape=f"T={T} E={E}")
        rows += [dict(case, **timed(us * spec / 5), impl="shufflemoe", side="ours", mode="graph", check=check),
                 dict(case, **timed(peer_graph * spec / 5), impl="torch sync-free ops", side="peer", mode="graph"),
                 dict(case, **timed(50.0), impl="shufflemoe", side="ours", mode="eager", check=check),
                 dict(case, **timed(400.0), impl="torch ops with bincount (syncs)", side="peer", mode="eager")]
    return rows


def test_index_shuffle_targets():
    assert failed(token_ops.analyse_index_shuffle(shuffle_rows()).targets) == []
    slow = failed(token_ops.analyse_index_shuffle(shuffle_rows(us=5.5, peer_graph=90.0)).targets)
    assert len(slow) == 8 and all("time in a graph" in t for t in slow)  # over every spec time
    # 12x the spec's fused/unfused ratio is not reached where the spec's own ratio is 13.4
    close = failed(token_ops.analyse_index_shuffle(shuffle_rows(peer_graph=48.0)).targets)
    assert close == ["T=8192 E=16 vs sync-free torch ops, graph vs graph: >= 13.38x (the spec's ratio)"]
    assert len(failed(token_ops.analyse_index_shuffle(shuffle_rows(check="MISMATCH")).targets)) == 16


def test_index_shuffle_eager_peer_that_syncs_is_only_compared_eagerly():
    rs = token_ops.analyse_index_shuffle(shuffle_rows()).ratios
    assert {r["modes"] for r in rs if "bincount" in r["peer"]} == {"eager vs eager"}


def movement_rows(us):
    case = dict(case="silu_mul", shape="T=2048 k=1 D=5120", read_bytes=2.9e8, write_bytes=1.45e8, bound="copy")
    small = dict(case, shape="T=64 k=1 D=5120")
    return [dict(case, **timed(us), impl="shufflemoe", side="ours", mode="graph", check="ok"),
            dict(case, **timed(8 * us), impl="torch reference", side="peer", mode="graph"),
            dict(small, **timed(100.0), impl="shufflemoe", side="ours", mode="graph", check="ok")]


@pytest.mark.parametrize("us, met", [(150.0, True), (180.0, False)])  # 435 MB at 2.9 TB/s: 150 us
def test_movement_target_against_copy(us, met):
    rows = movement_rows(us)
    apply_ceilings(rows, C)
    ts = token_ops.analyse_movement(rows).targets
    assert len(ts) == 1 and ts[0]["met"] is met  # T = 64 is reported, not a target


def gemm_rows(decode_us=110.0, prefill_ratio=1.05, decode_ratio=1.2):
    rows = []
    for shape, us, ratio in (("G=16 M=1024 N=2048 K=5120", 450.0, prefill_ratio),
                             ("G=16 M=8 N=2048 K=5120", decode_us, decode_ratio)):
        c = gg.Case("bf16", [int(shape.split()[1][2:])] * 16, 2048, 5120)
        base = dict(dtype="bf16", shape=shape, read_bytes=c.read_bytes(), write_bytes=c.write_bytes(),
                    flops=c.flops(), bound="read")
        rows += [dict(base, **timed(us), impl="shufflemoe", side="ours", mode="graph", check="ok"),
                 dict(base, **timed(us * ratio), impl="torch._grouped_mm", side="peer", mode="graph")]
    apply_ceilings(rows, C)
    return rows


def test_grouped_gemm_targets_can_fail():
    assert failed(gg.analyse_spec_shapes(gemm_rows()).targets) == []
    assert [t.split(":")[0] for t in failed(gg.analyse_spec_shapes(gemm_rows(prefill_ratio=0.98)).targets)] == [
        "bf16 G=16 M=1024 N=2048 K=5120 vs torch, graph vs graph"]
    slow = failed(gg.analyse_spec_shapes(gemm_rows(decode_us=125.0, decode_ratio=1.1)).targets)
    assert len(slow) == 2 and "of the bytes floor" in slow[0] and "attainable" in slow[1]


def test_grouped_gemm_floor_uses_the_read_ceiling():
    ours = [r for r in gemm_rows() if r["side"] == "ours" and "M=8 " in r["shape"]][0]
    c = gg.Case("bf16", [8] * 16, 2048, 5120)
    assert ours["floor_us"] == pytest.approx((c.read_bytes() / 3200 + c.write_bytes() * (2 / 2900 - 1 / 3200)) / 1e3)


# ---- layer -------------------------------------------------------------------------------------------

def test_presets_are_the_issue_shapes():
    by_name = {p.name: p.cfg for p in layer.PRESETS}
    scout = by_name["llama4-scout-tp8"]
    assert (scout.hidden_size, scout.intermediate_size, scout.num_experts, scout.top_k,
            scout.shared_intermediate_size) == (5120, 1024, 16, 1, 1024)
    assert by_name["llama4-maverick-tp8"].num_experts == 128
    q = by_name["qwen3-30b-a3b"]
    assert (q.hidden_size, q.intermediate_size, q.num_experts, q.top_k) == (2048, 768, 128, 8)
    m = by_name["mixtral-8x7b-tp2"]
    assert (m.hidden_size, m.intermediate_size, m.num_experts, m.top_k) == (4096, 7168, 8, 2)
    assert set(layer.DECODE_T) >= {1, 2, 4, 8, 64}
    assert {"none", "fp8_rowwise"} <= set(layer.formats())


@pytest.mark.parametrize("quantization", ["none", "fp8_rowwise"])
def test_activated_bytes_count_the_tensors_as_stored(quantization):
    cfg = MoEConfig(hidden_size=64, intermediate_size=32, num_experts=4, top_k=2, shared_intermediate_size=16,
                    quantization=quantization)
    lay = make_layer(cfg)
    item = 1 if quantization != "none" else 2
    scales = 4 * (2 * 32 + 64) if quantization != "none" else 0
    assert layer.expert_bytes(lay) == 3 * 32 * 64 * item + scales
    assert layer.fixed_bytes(lay) == (4 * 64 + 3 * 16 * 64) * 2  # router and shared expert, bf16


def test_covering_inputs_route_to_every_expert_equally():
    cfg = MoEConfig(hidden_size=32, intermediate_size=16, num_experts=8, router="llama4", scoring="sigmoid",
                    apply_router_weight_on_input=True, dtype=torch.float32)
    lay = make_layer(cfg)
    x = layer.covering_inputs(lay, 32, seed=3)
    assert x.shape == (32, 32)
    assert lay.route(x).counts.tolist() == [4] * 8


def layer_row(preset, fmt, T, us, phase="decode", pct_read=None, pct_dense=None, check="ok", **extra):
    return dict(preset=preset, format=fmt, T=T, phase=phase, routing="random", impl="shufflemoe", side="ours",
                mode="graph", **timed(us), pct_read=pct_read, pct_dense=pct_dense, check=check, **extra)


def good_layer_rows(small=85.0, large=95.0, scout_dense=90.0, bi_us=150.0, spec_us=190.0, compiled_us=300.0):
    rows = []
    for name in layer_report.PRESET_NAMES:
        for fmt in ("bf16", "fp8_rowwise"):
            rows += [layer_row(name, fmt, 1, 40.0, pct_read=small), layer_row(name, fmt, 128, 200.0, pct_read=large)]
    for name in layer_report.PREFILL_DENSE_PCT:
        for fmt in ("bf16", "fp8_rowwise"):
            rows.append(layer_row(name, fmt, 16384, 1800.0, "prefill", pct_dense=scout_dense))
    rows += [layer_row("llama4-scout-tp8", "bf16", 64, 120.0, pct_read=large),
             dict(layer_row("llama4-scout-tp8", "bf16", 64, bi_us), impl="shufflemoe batch_invariant", side="variant"),
             dict(layer_row("llama4-scout-tp8", "bf16", 64, spec_us), routing=layer_report.SPEC_BASIS,
                  spec_us=layer.SPEC_SCOUT_T64_US),
             dict(layer_row("llama4-scout-tp8", "bf16", 64, 300.0), impl="torch pipeline", side="peer")]
    for T, peer_us in ((1, 400.0), (64, 300.0)):  # compiled, from Python: judged at T <= 8 only
        rows += [dict(layer_row("qwen3-30b-a3b", "bf16", T, compiled_us), mode="compile"),
                 dict(layer_row("qwen3-30b-a3b", "bf16", T, peer_us), mode="compile", impl="torch pipeline",
                      side="peer")]
    return rows


def test_layer_targets_met_on_good_rows():
    a = layer_report.analyse(good_layer_rows())
    assert failed(a.targets) == []
    assert len(a.targets) == 8 * 2 + 1 + 4 + 1 + 1 + 1  # decode (2 per preset and format, Scout T=64), prefill,
    # BI, spec, compiled at T = 1 (400 / 300 = 1.33x)
    assert any(r["modes"] == "graph vs graph" and r["peer"] == "torch pipeline" for r in a.ratios)


@pytest.mark.parametrize("bad, count, words", [
    (dict(small=79.0), 8, "T=1 of the read ceiling: >= 80%"),
    (dict(large=91.0), 9, "T=128 of the read ceiling: >= 92%"),
    (dict(scout_dense=80.0), 2, "llama4-scout-tp8 bf16 T=16384 of dense cuBLAS: >= 85%"),
    (dict(bi_us=181.0), 1, "batch-invariant time / default: <= 1.5x"),
    (dict(spec_us=198.0), 1, "the spec's basis), time: <= 197.456 us (spec)"),
    (dict(compiled_us=320.0), 1, "qwen3-30b-a3b bf16 T=1 compiled / compiled torch pipeline: >= 1.3x"),
])
def test_each_layer_target_can_fail(bad, count, words):
    missed = failed(layer_report.analyse(good_layer_rows(**bad)).targets)
    assert len(missed) == count and any(words in t for t in missed), missed


def test_a_layer_row_that_fails_its_check_misses_its_target():
    rows = good_layer_rows()
    rows[0]["check"] = "set 3 vs eager: 5 elements out of tolerance"
    assert failed(layer_report.analyse(rows).targets) == ["llama4-scout-tp8 bf16 T=1 of the read ceiling: >= 80%"]


def test_batch_invariant_not_measured_is_not_met():
    rows = good_layer_rows()
    bi = next(r for r in rows if r["impl"] == "shufflemoe batch_invariant")
    for k in ("us", "us_lo", "us_hi", "check"):
        del bi[k]
    bi["note"] = "skipped: MoEConfig has no batch_invariant field in this version"
    assert failed(layer_report.analyse(rows).targets) == [
        "llama4-scout-tp8 bf16 T=64 batch-invariant time / default: <= 1.5x"]


def test_other_formats_have_their_own_decode_targets():
    """fp8_w8a16, fp8_block and mxfp4 rows are judged at 70% (T = 1..8) and 85% (T >= 64) of
    the read ceiling, bf16 and fp8 rowwise at 80% and 92%."""
    rows = good_layer_rows() + [layer_row("qwen3-30b-a3b", fmt, T, 50.0, pct_read=pct)
                                for fmt in ("fp8_w8a16", "fp8_block", "mxfp4")
                                for T, pct in ((1, 71.0), (64, 84.0))]
    missed = failed(layer_report.analyse(rows).targets)
    assert missed == [f"qwen3-30b-a3b {fmt} T=64 of the read ceiling: >= 85%"
                      for fmt in ("fp8_w8a16", "fp8_block", "mxfp4")], missed
