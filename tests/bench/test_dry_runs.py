"""CPU dry runs of the GPU suites with tiny shapes, so that the GPU run does not fail on a typo:
every row the suite would time is produced, every timed path is checked, and the analysis runs on
the rows. Timing itself is faked (graph timings run eagerly, keeping their label): only the
plumbing is under test here."""

import pytest
import torch

from shufflemoe import MoEConfig
from shufflemoe.bench import timing
from shufflemoe.bench.analysis import apply_ceilings
from shufflemoe.bench.ceilings import Ceilings
from shufflemoe.bench.suites import SUITES, Context
from shufflemoe.bench.suites import grouped_gemm as gg
from shufflemoe.bench.suites import layer, token_ops

# On a GPU machine the suites' tensors go to the GPU, where impl="triton" rows run their kernels
# (CPU tensors there have no interpreter to run them).
DEV = "cuda" if torch.cuda.is_available() else "cpu"
C = Ceilings(read_gbps=3200.0, copy_gbps=2900.0, bf16_tflops=750.0, fp8_tflops=1300.0)


def eager_time_fn(run, n_sets, *, graph=True, reps=40, warmup=3, mode=None, **kw):
    return timing.time_fn(run, n_sets, graph=False, reps=2, warmup=1, mode=mode or ("graph" if graph else "eager"), **kw)


def dry(name: str, monkeypatch, module, quick=True, **patches):
    monkeypatch.setattr(module, "time_fn", eager_time_fn)
    monkeypatch.setattr(module, "DEVICE", DEV)
    for k, v in patches.items():
        monkeypatch.setattr(module, k, v)
    result = SUITES.get(name).run(Context(ceilings=C, quick=quick, suite=name))
    apply_ceilings(result.rows, C)
    return result, result.analyse(result.rows)


def test_index_shuffle(monkeypatch):
    res, a = dry("index_shuffle", monkeypatch, token_ops, SPEC_US={(16, 8): 5.0}, SPEC_UNFUSED_US={(16, 8): 40.0},
                 TOP8_T=(), rotations=lambda *a, **k: 2)
    ours = [r for r in res.rows if r["side"] == "ours"]
    assert {r["mode"] for r in ours} == {"graph", "eager"} and all(r["check"] == "ok" for r in ours)
    assert {r["modes"] for r in a.ratios} == {"graph vs graph", "eager vs eager"} and len(a.targets) == 2


def test_token_movement(monkeypatch):
    res, a = dry("token_movement", monkeypatch, token_ops, D=64, MOVEMENT_T=(3, 5), MOVEMENT_K=(2,), TARGET_MIN_T=5,
                 rotations=lambda *a, **k: 2)
    ours = [r for r in res.rows if r["side"] == "ours"]
    assert len(ours) == 2 * len(token_ops.MOVEMENT_OPS)
    assert all(r["check"] == "ok" for r in ours), [r for r in ours if r["check"] != "ok"]
    assert all(r["pct_copy"] > 0 for r in ours) and len(a.targets) == len(token_ops.MOVEMENT_OPS)


def test_grouped_gemm(monkeypatch):
    res, a = dry("grouped_gemm", monkeypatch, gg, SPEC_US={"bf16": {(4, 3, 32, 64): 10.0}, "fp8": {}},
                 rotations=lambda *a, **k: 2)
    ours = [r for r in res.rows if r["side"] == "ours"]
    assert len(ours) == 1 and ours[0]["check"] in ("ok",) or ours[0]["check"].startswith("unchecked")
    assert ours[0]["pct_read"] > 0 and a.headlines


def test_layer(monkeypatch):
    scout = MoEConfig(hidden_size=32, intermediate_size=16, num_experts=16, router="llama4", scoring="sigmoid",
                      apply_router_weight_on_input=True, shared_intermediate_size=16)
    qwen = MoEConfig(hidden_size=32, intermediate_size=24, num_experts=8, top_k=2, renormalize=True)
    presets = [layer.Preset("llama4-scout-tp8", scout, "llama4_text", (None,), (96,)),
               layer.Preset("qwen3-30b-a3b", qwen, "qwen3_moe", ("grouped_mm", "batched_mm"), (96,))]
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: fn)  # the compile rows' plumbing only
    res, a = dry("layer", monkeypatch, layer, quick=False, PRESETS=presets, N_SETS=2, DECODE_T=(1, 64),
                 PEER_T=(1, 64), SHOOTOUT_T={}, MAX_COPY_BYTES=1 << 20, formats=lambda: ["none", "fp8_rowwise"],
                 COMPILE_CASES={("qwen3-30b-a3b", 1)}, BATCH_INVARIANT_CASES={("qwen3-30b-a3b", 1)},
                 TURN_REPS=2)
    rows = res.rows
    ours = [r for r in rows if r["side"] == "ours" and r.get("us")]
    assert ours and all(r["check"] == "ok" for r in ours), [r for r in ours if r["check"] != "ok"]
    impls = {(r["impl"], r["mode"]) for r in rows if r["preset"] == "qwen3-30b-a3b" and r.get("us")}
    assert {("torch pipeline", "graph"), ("torch pipeline", "eager"), ("per-expert loop (syncs)", "eager"),
            ("transformers grouped_mm", "eager"), ("transformers batched_mm", "eager"),
            ("shufflemoe", "compile"), ("torch pipeline", "compile")} <= impls
    spec = [r for r in rows if r.get("routing") == "all 16 experts (spec basis)"]
    assert len(spec) == 1 and spec[0]["active_experts"] == 16
    shootout = [r for r in rows if r["phase"] == "shoot-out"]
    assert len(shootout) == 2 * 7 and all(r["check"] == "ok" for r in shootout)
    assert {"graph vs graph", "eager vs eager", "compile vs compile"} <= {r["modes"] for r in a.ratios}
    assert all(r.get("pct_read") for r in ours)
    prefill = [r for r in ours if r["phase"] == "prefill"]  # eager here: graphs need CUDA
    assert prefill and all(r["dense_lo"] <= r["dense_us"] <= r["dense_hi"]
                           and r["pct_dense_lo"] <= r["pct_dense"] <= r["pct_dense_hi"] for r in prefill)


@pytest.mark.parametrize("fmt", ["none", "fp8_rowwise"])
def test_layer_copies_rotate_weights(fmt):
    cfg = MoEConfig(hidden_size=64, intermediate_size=32, num_experts=4, quantization=fmt)
    lay = layer.MoE(cfg)
    assert layer._copies(lay, 1 << 20) == 4  # 1 MB a call: capped at 4 copies
    assert layer._copies(lay, 1 << 30) == 1


def test_layer_check_is_against_float64(monkeypatch):
    """A timed path's outputs are judged against naive_moe's float64 output for their own set and
    layer copy: the layer's own outputs pass, one wrong element of the second set fails, and at
    T >= LARGE_T only the first CHECKED_LARGE sets are compared."""
    monkeypatch.setattr(layer, "DEVICE", "cpu")
    torch.manual_seed(0)
    cfg = MoEConfig(hidden_size=32, intermediate_size=24, num_experts=8, top_k=2, renormalize=True)
    copies = [layer.MoE(cfg), layer.MoE(cfg)]
    xs = [torch.randn(5, 32, dtype=cfg.dtype) for _ in range(3)]
    case = layer._Case(copies, xs)
    outs = [case.layer(i)(x) for i, x in enumerate(xs)]
    assert case.check(outs) == "ok"
    outs[1] = outs[1].clone()
    outs[1][2, 3] += 0.5 * outs[1].float().abs().max().to(outs[1].dtype)
    assert case.check(outs).startswith("set 1 vs float64")
    monkeypatch.setattr(layer, "LARGE_T", 5)
    monkeypatch.setattr(layer, "CHECKED_LARGE", 1)
    assert case.check(outs) == "ok"


def test_time_turns_interleaves_and_walks_the_sets():
    """time_turns: one call of every path a round (ABC ABC ...), call c on set c % n_sets, a
    path that fails while warming up comes back as its exception, outputs of the paths named."""
    calls = []

    def path(name):
        def run(i):
            calls.append((name, i))
            return torch.full((1,), float(i))
        return run

    def broken(i):
        raise ValueError("no kernel")

    got = timing.time_turns({"a": path("a"), "x": broken, "b": path("b")}, 3, reps=4, warmup=1,
                            mode="compile", keep_outputs=("b",))
    assert isinstance(got["x"], ValueError) and list(got) == ["a", "x", "b"]
    assert got["a"].n == got["b"].n == 4 and got["a"].mode == "compile"
    timed = calls[6:6 + 8]  # after one warm-up pass of each over the 3 sets
    assert timed == [("a", 0), ("b", 1), ("a", 2), ("b", 0), ("a", 1), ("b", 2), ("a", 0), ("b", 1)]
    assert [float(o) for o in got["b"].outputs] == [0.0, 1.0, 2.0] and not got["a"].outputs
