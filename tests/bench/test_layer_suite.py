"""The layer benchmark suite's bookkeeping (its timing needs a GPU; its targets logic does not)."""

from shufflemoe.bench.run import load_suites
from shufflemoe.bench.suites.layer import PRESETS, _targets


def test_suites_register():
    names = load_suites()
    for name in ("layer", "grouped_gemm", "grouped_gemm_sweep", "e2e_hf"):
        assert name in names


def test_presets_are_the_issue_shapes():
    by_name = {p.name: p.cfg for p in PRESETS}
    scout = by_name["llama4-scout-tp8"]
    assert (scout.hidden_size, scout.intermediate_size, scout.num_experts, scout.top_k,
            scout.shared_intermediate_size) == (5120, 1024, 16, 1, 1024)
    assert by_name["llama4-maverick-tp8"].num_experts == 128
    q = by_name["qwen3-30b-a3b"]
    assert (q.hidden_size, q.intermediate_size, q.num_experts, q.top_k) == (2048, 768, 128, 8)
    m = by_name["mixtral-8x7b-tp2"]
    assert (m.hidden_size, m.intermediate_size, m.num_experts, m.top_k) == (4096, 7168, 8, 2)


def test_targets_judge_the_rows():
    row = dict(preset="llama4-scout-tp8", dtype="bf16", T=64, phase="decode", us=150.0,
               x_floor=1.05, vs_torch=3.0, vs_loop=12.0, pct_copy_bw=90.0, check="ok",
               torch_us=450.0, floor_us=150.0 / 1.05)
    fp8 = dict(row, dtype="fp8", us=100.0, vs_bf16=0.66, pct_copy_bw=80.0)
    prefill = dict(row, T=16384, phase="prefill", pct_dense=86.0)
    shootout = dict(preset="llama4-scout-tp8", dtype="bf16", T=64, phase="shoot-out", us=400.0,
                    check="padded (2.00x shuffled)")
    met = {t["target"]: t["met"] for t in _targets([row, fp8, prefill, shootout])}
    assert met["llama4-scout-tp8 bf16 T=64: time <= 1.10 x floor"]
    assert met["llama4-scout-tp8 bf16 T=64: time (us) < spec's 197"]
    assert met["llama4-scout-tp8 bf16 T=64: >= 2.5x stock-torch pipeline (attainable: 3.15x at the floor)"]
    assert not met["llama4-scout-tp8 fp8 T=64: fp8 time <= 0.6 x bf16"]
    assert not met["llama4-scout-tp8 fp8 T=64: >= 85% of copy bandwidth"]
    assert met["llama4-scout-tp8 bf16 T=16384: >= 85% of dense cuBLAS TFLOP/s"]
