"""Fused decode kernels (decode_gate_up, decode_down): the torch reference and the Triton kernels
(interpreter on the CPU, the GPU when there is one) against float64 of the same rounded or
quantized inputs, on routings from sort_by_expert: T = 0 and 1, odd sizes, k up to 8, E up to
256, empty experts, every token on one expert (two m-tiles), pairs past num_valid (capacity
drops, ids routed nowhere), every split-K factor (ones that do not divide K, more than K steps).
Outputs start as NaN, down's out as random values, and the inputs' rows past num_valid are NaN,
so a row written, read or summed where it should not be fails."""

from __future__ import annotations

import contextlib

import pytest
import torch

from shufflemoe.ops import FP8_DTYPE, gather_scale, quantize_fp8_rowwise, sort_by_expert
from shufflemoe.ops.moe_decode import W8A8, configs, decode_down, decode_gate_up, kernel
from shufflemoe.ops.quantize.formats import weight_format
from shufflemoe.ops.quantize.reference import dequantize_fp8_groups, quantize_fp8_groups
from shufflemoe.ops.silu_mul.reference import glu
from shufflemoe.testing import assert_close, poisoned

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
D, I = 40, 24  # K steps of 16: gate_up 3 (the last partial), down 2 (the last partial)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp8": FP8_DTYPE}


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def small(split: int, fp8: bool = False) -> configs.DecodeConfig:
    """16-wide tiles (fp8 dots need K steps of 32 on the GPU), ``split`` for both GEMMs."""
    bk = 32 if fp8 and CUDA else 16
    gemm = configs.GemmConfig(16, bk, split)
    return configs.DecodeConfig(gemm, gemm)


# (expert ids [T, k] (ids outside [0, E) are routed nowhere), E, capacity)
ROUTINGS = {
    "T=0": lambda: (torch.zeros(0, 2, dtype=torch.int64), 8, None),
    "T=1 k=1 E=16": lambda: (torch.tensor([[5]]), 16, None),
    "odd T=9 k=3 E=7": lambda: (torch.stack([torch.randperm(7, generator=gen(t))[:3]
                                             for t in range(9)]), 7, None),
    "k=8 E=256": lambda: (torch.stack([torch.randperm(256, generator=gen(t))[:8]
                                       for t in range(2)]), 256, None),
    "all tokens on one expert": lambda: (torch.full((21, 1), 2), 4, None),
    "most experts empty": lambda: (torch.tensor([[0, 15], [15, 0], [7, 0]]), 16, None),
    "capacity drops": lambda: (torch.randint(0, 3, (11, 2), generator=gen(1)).sort(1).values
                               + torch.tensor([0, 3]), 6, 2),
    "ids routed nowhere": lambda: (torch.tensor([[1, -1], [9, 1], [2, 1]]), 4, None),
}


def routing(case: str, seed: int = 3):
    ids, E, cap = ROUTINGS[case]()
    w = torch.rand(ids.shape, generator=gen(seed)) + 0.25
    r = sort_by_expert(ids.to(DEV), E, w.to(DEV), capacity=cap, impl="torch")
    return r, ids.shape[0], E


def weights(E: int, dtype: torch.dtype, seed: int = 0):
    """(w13, w2, w13_scale, w2_scale) and their float64 values."""
    g = gen(seed)
    w13 = torch.randn(E, 2 * I, D, generator=g) / D**0.5
    w2 = torch.randn(E, D, I, generator=g) / I**0.5
    if dtype == FP8_DTYPE:
        (q13, s13), (q2, s2) = quantize_fp8_rowwise(w13), quantize_fp8_rowwise(w2)
        w64 = (q13.double() * s13.double()[..., None], q2.double() * s2.double()[..., None])
        return (q13.to(DEV), q2.to(DEV), s13.to(DEV), s2.to(DEV)), w64
    w13, w2 = w13.to(dtype), w2.to(dtype)
    return (w13.to(DEV), w2.to(DEV), None, None), (w13.double(), w2.double())


def act_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.bfloat16 if dtype == FP8_DTYPE else dtype


def tol(dtype: torch.dtype) -> str:
    return "fp8_rowwise" if dtype == FP8_DTYPE else str(dtype).replace("torch.", "")


def pairs(r):
    """(valid pair count, expert of each valid pair) on the host."""
    n = int(r.num_valid)
    return n, r.expert_ids[:n].cpu().long()


def gate_up64(x, r, w13_64, on_input: bool, fp8: bool | str):
    """float64 silu(gate) * up of the valid pairs, from the rows the kernel multiplies: x
    gathered and scaled (rounded to x's dtype, or quantized) exactly as gather_scale does (fp8
    True or "fp8_rowwise": quantized per row; "fp8_block": in groups of 128 after it)."""
    n, experts = pairs(r)
    rowwise = fp8 is True or fp8 == "fp8_rowwise"
    xs = gather_scale(x, r.token_ids, r.weights if on_input else None, quantize=rowwise,
                      impl="torch")
    if fp8 == "fp8_block":
        xs = quantize_fp8_groups(xs)
    x64 = (dequantized(*xs) if fp8 else xs.double()).cpu()[:n]
    h = torch.einsum("pd,pnd->pn", x64, w13_64[experts])
    g, u = h.chunk(2, dim=1)
    return g / (1 + torch.exp(-g)) * u


def tiles(split: int | configs.DecodeConfig, fp8: bool) -> configs.DecodeConfig:
    return split if isinstance(split, configs.DecodeConfig) else small(split, fp8)


def run_gate_up(case, dtype, split, on_input=True, impl="triton", seed=0):
    r, T, E = routing(case, seed + 3)
    (w13, _, s13, _), (w13_64, _) = weights(E, dtype, seed)
    fp8 = dtype == FP8_DTYPE
    x = torch.randn(T, D, generator=gen(seed + 1)).to(DEV, act_dtype(dtype))
    A = r.num_pairs
    out = ((poisoned(A, I, dtype=torch.uint8, device=DEV).view(FP8_DTYPE),
            poisoned(A, dtype=torch.float32, device=DEV)) if fp8
           else poisoned(A, I, dtype=dtype, device=DEV))
    if fp8:
        out[0].view(torch.uint8).fill_(0x7F)  # e4m3 NaN
    with configs.override(tiles(split, fp8)):
        got = decode_gate_up(x, w13, r.counts, r.token_ids, r.weights if on_input else None,
                             w13_scale=s13, out=out, impl=impl)
    assert got is out
    n, _ = pairs(r)
    a = got[0].double() * got[1].double()[:, None] if fp8 else got.double()
    assert_close(a[:n], gate_up64(x, r, w13_64, on_input, fp8), tol(dtype))
    assert torch.isnan(a[n:]).all(), "rows past num_valid were written"


def run_down(case, dtype, split, on_output=True, impl="triton", seed=0, accumulate=True):
    r, T, E = routing(case, seed + 3)
    (_, w2, _, s2), (_, w2_64) = weights(E, dtype, seed)
    n, experts = pairs(r)
    A, fp8 = r.num_pairs, dtype == FP8_DTYPE
    a = torch.randn(A, I, generator=gen(seed + 2)) * 2
    if fp8:
        q, s = quantize_fp8_rowwise(a)
        q.view(torch.uint8)[n:] = 0x7F  # NaN rows past num_valid: never read
        a64, inp = q.double() * s.double()[:, None], (q.to(DEV), s.to(DEV))
    else:
        a = a.to(dtype)
        a[n:] = float("nan")
        a64, inp = a.double(), a.to(DEV)
    out_dtype = act_dtype(dtype)
    base = torch.randn(T, D, generator=gen(seed + 4)).to(out_dtype)
    out = base.clone().to(DEV)
    rw = r.weights if on_output else None
    with configs.override(tiles(split, fp8)):
        got = decode_down(inp, w2, r.counts, r.token_ids, r.positions, out, rw, w2_scale=s2,
                          accumulate=accumulate, impl=impl)
    assert got is out
    y = torch.einsum("pi,pdi->pd", a64[:n], w2_64[experts])
    if on_output:
        y = y * r.weights[:n].double().cpu()[:, None]
    tokens = r.token_ids[:n].long().cpu()
    ref = base.double()
    if not accumulate:  # written where a token has a routed pair, kept elsewhere
        ref[tokens] = 0.0
    ref = ref.index_add_(0, tokens, y)
    assert_close(out, ref, tol(out_dtype))


MAIN = [(c, "bf16") for c in ROUTINGS] + [
    (c, "fp8") for c in ("T=1 k=1 E=16", "odd T=9 k=3 E=7", "k=8 E=256", "capacity drops")] + [
    ("odd T=9 k=3 E=7", "fp16"), ("ids routed nowhere", "fp32")]


@pytest.mark.parametrize("case,dtype", MAIN, ids=[f"{c}-{d}" for c, d in MAIN])
def test_gate_up_matches_float64(case, dtype):
    run_gate_up(case, DTYPES[dtype], split=2)


@pytest.mark.parametrize("case,dtype", MAIN, ids=[f"{c}-{d}" for c, d in MAIN])
def test_down_matches_float64(case, dtype):
    run_down(case, DTYPES[dtype], split=2)


OVERWRITE = ["T=1 k=1 E=16", "all tokens on one expert", "capacity drops", "ids routed nowhere"]


@pytest.mark.parametrize("impl", ["triton", "torch"])
@pytest.mark.parametrize("case", OVERWRITE)
def test_down_overwrites_without_accumulate(case, impl):
    """accumulate=False: out = the sum for tokens with a routed pair (top-1 epilogue and k > 1
    combine), the other tokens' rows (dropped or routed nowhere) keep their values."""
    run_down(case, torch.bfloat16, split=2, impl=impl, accumulate=False)
    if case == "capacity drops":
        run_down(case, FP8_DTYPE, split=1, impl=impl, accumulate=False)


@pytest.mark.parametrize("split", [1, 2, 3, 5])  # 3 K steps in gate_up, 2 in down
@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_every_split_factor(split, dtype):
    run_gate_up("odd T=9 k=3 E=7", DTYPES[dtype], split, on_input=False)
    run_down("all tokens on one expert", DTYPES[dtype], split, on_output=False)


ONE_PAIR = ["T=1 k=1 E=16", "odd T=9 k=3 E=7", "k=8 E=256", "all tokens on one expert",
            "capacity drops", "ids routed nowhere"]


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("case", ONE_PAIR)
def test_one_pair_tiles(case, dtype):
    """block_m = 1: each pair its own m-tile, multiplied on the CUDA cores (a GEMV), split-K."""
    fp8 = dtype == "fp8"
    cfg = configs.DecodeConfig(small(2, fp8).gate_up.with_(block_m=1),
                               small(3, fp8).down.with_(block_m=1))
    run_gate_up(case, DTYPES[dtype], cfg)
    run_down(case, DTYPES[dtype], cfg, on_output=False)


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("case", ["T=1 k=1 E=16", "k=8 E=256", "capacity drops"])
def test_narrow_one_pair_tiles(case, dtype):
    """The tuning table's narrow one-pair tiles: 4 and 8 rows, one K step wider than K (masked
    lanes), no split-K."""
    cfg = configs.DecodeConfig(configs.GemmConfig(4, 64, 1, block_m=1),
                               configs.GemmConfig(8, 32, 1, block_m=1))
    run_gate_up(case, DTYPES[dtype], cfg)
    run_down(case, DTYPES[dtype], cfg, on_output=False)


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("case", ["T=1 k=1 E=16", "odd T=9 k=3 E=7", "k=8 E=256",
                                  "capacity drops"])
def test_one_pair_runs(case, dtype, monkeypatch):
    """One-pair tiles over enough K steps sum each 16-byte run of a weight row per thread and
    reduce once after the loop (kernel._runs): gate_up over D = 72 (bf16: 5 steps of 16 values;
    fp8: 3 of 32, the last partial) takes it, down over I = 40 too in fp8 (2 steps) but not in
    bf16 (3 steps), so both sides of the rule run."""
    monkeypatch.setitem(globals(), "D", 72)
    monkeypatch.setitem(globals(), "I", 40)
    fp8 = dtype == "fp8"
    gemm = configs.GemmConfig(4, 32 if fp8 else 16, 1, block_m=1)
    quant = "fp8_rowwise" if fp8 else "none"
    assert kernel._runs(gemm, kernel._k_split(72, gemm)[0], quant)
    assert kernel._runs(gemm, kernel._k_split(40, gemm)[0], quant) == fp8
    cfg = configs.DecodeConfig(gemm, gemm)
    run_gate_up(case, DTYPES[dtype], cfg)
    run_down(case, DTYPES[dtype], cfg, on_output=False)



FP32_ROWS_TILES = {
    "one pair, split 3": configs.DecodeConfig(small(2, True).gate_up.with_(block_m=1),
                                              small(3, True).down.with_(block_m=1)),
    "one pair, wide": configs.DecodeConfig(configs.GemmConfig(4, 64, 1, block_m=1),
                                           configs.GemmConfig(8, 32, 1, block_m=1)),
    "16-pair tiles, split 2": small(2, True),
}


@pytest.mark.parametrize("impl", ["triton", "torch"])
@pytest.mark.parametrize("tiles_name", list(FP32_ROWS_TILES))
@pytest.mark.parametrize("case", ONE_PAIR + ["T=0", "most experts empty"])
def test_fp8_rows_quantized_in_down(case, tiles_name, impl):
    """fp8 rowwise with a's rows in float32 (out=(a, None)): gate_up writes them unquantized
    (against float64; rows past num_valid untouched) and down quantizes them in its loads with
    ops.quantize's formula: bit for bit what it gives for quantize_fp8_rowwise's (q, scale),
    itself against float64 (rows past num_valid NaN, never read)."""
    cfg = FP32_ROWS_TILES[tiles_name]
    r, T, E = routing(case, 3)
    (w13, w2, s13, s2), (w13_64, w2_64) = weights(E, FP8_DTYPE, 0)
    n, experts = pairs(r)
    A = r.num_pairs
    x = torch.randn(T, D, generator=gen(1)).to(DEV, torch.bfloat16)
    a = poisoned(A, I, dtype=torch.float32, device=DEV)
    with configs.override(cfg):
        got = decode_gate_up(x, w13, r.counts, r.token_ids, r.weights, w13_scale=s13,
                             out=(a, None), impl=impl)
    assert got[0] is a and got[1] is None
    assert_close(a[:n], gate_up64(x, r, w13_64, True, True), tol(torch.float32))
    assert torch.isnan(a[n:]).all(), "rows past num_valid were written"

    rows = (torch.randn(A, I, generator=gen(2)) * 2).to(DEV)
    rows[n:] = float("nan")
    q, s = quantize_fp8_rowwise(rows)
    base = torch.randn(T, D, generator=gen(4)).to(DEV, torch.bfloat16)
    outs = []
    for inp in ((q, s), (rows, None)):
        out = base.clone()
        with configs.override(cfg):
            outs.append(decode_down(inp, w2, r.counts, r.token_ids, r.positions, out, r.weights,
                                    w2_scale=s2, impl=impl))
    assert torch.equal(outs[0], outs[1])
    y = torch.einsum("pi,pdi->pd", (q.double() * s.double()[:, None]).cpu()[:n], w2_64[experts])
    ref = base.double().cpu().index_add_(0, r.token_ids[:n].long().cpu(),
                                         y * r.weights[:n].double().cpu()[:, None])
    assert_close(outs[1], ref, tol(torch.bfloat16))


@pytest.mark.parametrize("out_rows", ["q, scale", "fp32"])
@pytest.mark.parametrize("tiles_name", list(FP32_ROWS_TILES))
@pytest.mark.parametrize("on_input", [True, False])
def test_fp8_one_token_gives_a_batch_of_its_copies_bits(on_input, tiles_name, out_rows):
    """fp8 rowwise gate_up at T = 1 with x ready before the launch (the layer's early) takes
    x[0]'s amax once, before the routing is known (times each pair's |input weight|), where
    T > 1 takes each pair's gathered row's: a token alone gives bit for bit its rows in a batch
    of its copies routed alike (the same tiles), so the one-token amax is the gathered one.
    Against float64 too. (The torch reference's einsum sums in an order that follows the
    batch, so only the kernel can be held to this.)"""
    from shufflemoe.ops._impl import ops_for

    cfg = FP32_ROWS_TILES[tiles_name]
    E, experts, T2 = 16, torch.tensor([5, 0, 11, 3, 14, 8, 1, 9]), 3
    (w13, _, s13, _), (w13_64, _) = weights(E, FP8_DTYPE, 0)
    w = torch.rand(1, len(experts), generator=gen(5)) + 0.25
    x = (torch.randn(1, D, generator=gen(1)) * 3).to(DEV, torch.bfloat16)
    got = []
    for T in (1, T2):
        r = sort_by_expert(experts.expand(T, -1).to(DEV), E, w.expand(T, -1).to(DEV),
                           impl="torch")
        A = r.num_pairs
        out = ((poisoned(A, I, dtype=torch.uint8, device=DEV).view(FP8_DTYPE),
                poisoned(A, dtype=torch.float32, device=DEV)) if out_rows == "q, scale"
               else (poisoned(A, I, dtype=torch.float32, device=DEV), None))
        with configs.override(cfg):
            ops_for("triton").decode_gate_up(
                x.expand(T, -1).contiguous(), w13, s13, r.counts, r.token_ids,
                r.weights if on_input else None, out, 0, "fp8_rowwise", None,
                ("silu", 1.0, None), early=True)
        if T == 1:
            a = out[0].double() * out[1].double()[:, None] if out[1] is not None else out[0]
            assert_close(a, gate_up64(x, r, w13_64, on_input, True),
                         tol(torch.float32 if out[1] is None else FP8_DTYPE))
        got.append([o for o in out if o is not None])
    for one, batch in zip(*got):  # pairs sorted by expert, each expert's T2 copies in a row
        for t in range(T2):
            assert torch.equal(one.view(torch.uint8) if one.dtype == FP8_DTYPE else one,
                               (batch[t::T2].view(torch.uint8) if batch.dtype == FP8_DTYPE
                                else batch[t::T2]))


def test_down_quantizes_where_its_tiles_hold_one_pair():
    """configs.down_quantizes: fp8 rowwise with one-pair down tiles only."""
    key, cpu = (3, 16, 640, 128, FP8_DTYPE), torch.device("cpu")
    with configs.override(FP32_ROWS_TILES["one pair, wide"]):
        assert configs.down_quantizes(*key, cpu, "fp8_rowwise")
        assert not configs.down_quantizes(*key, cpu, "fp8_block")
        assert not configs.down_quantizes(*key[:4], torch.bfloat16, cpu, "none")
    with configs.override(small(1, True)):
        assert not configs.down_quantizes(*key, cpu, "fp8_rowwise")


def test_fp8_rows_bad_input_raises():
    """(a, None) is fp8 rowwise's only: float32 rows, not with fp8_block or bf16 weights."""
    r, T, E = routing("odd T=9 k=3 E=7")
    (w13, w2, s13, s2), _ = weights(E, FP8_DTYPE, 0)
    x = torch.randn(T, D).to(DEV, torch.bfloat16)
    out = torch.zeros(T, D, dtype=torch.bfloat16, device=DEV)
    A = r.num_pairs
    with pytest.raises(TypeError, match="out\\[0\\] must have dtype"):
        decode_gate_up(x, w13, r.counts, r.token_ids, w13_scale=s13,
                       out=(torch.zeros(A, I, dtype=torch.bfloat16, device=DEV), None))
    with pytest.raises(TypeError, match="a must have dtype"):
        decode_down((torch.zeros(A, I, dtype=torch.bfloat16, device=DEV), None), w2, r.counts,
                    r.token_ids, r.positions, out, w2_scale=s2)
    (_, w2b, _, _), _ = weights(E, torch.bfloat16, 0)
    with pytest.raises(TypeError, match="fp8_rowwise and fp8_block need"):
        decode_down((torch.zeros(A, I, device=DEV), None), w2b, r.counts, r.token_ids,
                    r.positions, out)

@pytest.mark.parametrize("dtype", ["bf16", "fp8", "fp32"])
def test_reference_matches_float64(dtype):
    for case in ("odd T=9 k=3 E=7", "capacity drops", "T=0"):
        run_gate_up(case, DTYPES[dtype], 1, impl="torch")
        run_down(case, DTYPES[dtype], 1, impl="torch")


def test_arrival_words_end_at_zero():
    """Every launch leaves its arrival words at zero: the next launch (or graph replay) relies
    on it, with no memset in between."""
    run_gate_up("odd T=9 k=3 E=7", FP8_DTYPE, 3)
    run_down("odd T=9 k=3 E=7", torch.bfloat16, 2)
    words = [w for buffers in kernel._WORDS.values() for w in buffers]
    assert words and all(int(w.abs().sum()) == 0 for w in words)


def test_default_heuristic_runs():
    """No override: the heuristic's own tiles (64 x 128, wider than these shapes)."""
    r, T, E = routing("T=1 k=1 E=16")
    (w13, w2, _, _), _ = weights(E, torch.bfloat16)
    x = torch.randn(T, D, generator=gen(1)).to(DEV, torch.bfloat16)
    out = torch.zeros(T, D, dtype=torch.bfloat16, device=DEV)
    a = decode_gate_up(x, w13, r.counts, r.token_ids, impl="triton")
    decode_down(a, w2, r.counts, r.token_ids, r.positions, out, r.weights, impl="triton")
    ref = torch.zeros_like(out)
    a_ref = decode_gate_up(x, w13, r.counts, r.token_ids, impl="torch")
    decode_down(a_ref, w2, r.counts, r.token_ids, r.positions, ref, r.weights, impl="torch")
    assert_close(out, ref.double(), "bfloat16")


def test_split_heuristic():
    """Scout TP8 at T = 1 (one expert, 16 tiles of 64 columns): K is split until 132 SMs have
    work; Mixtral TP2's 224 tiles are not split; a split keeps at least two K steps."""
    scout = configs.heuristic((1, 16, 5120, 1024, torch.bfloat16, 132))
    assert 16 * scout.gate_up.split_k >= 132 and scout.down.split_k == 2
    assert configs.heuristic((2, 8, 4096, 7168, torch.bfloat16, 132)).gate_up.split_k == 1
    assert configs.split_for(1, 3, 132) == 1 and configs.split_for(1, 40, 132) == 20
    assert configs.use_fused(64) and not configs.use_fused(65)
    assert not configs.use_fused(1, batch_invariant=True)
    assert configs.use_fused(8, top_k=8) and not configs.use_fused(1, quant="fp8_rowwise")
    assert configs.use_fused(32, 8, "fp8_rowwise") and configs.use_fused(4, 4, "fp8_rowwise")
    assert not configs.use_fused(40, 8, "fp8_rowwise") and not configs.use_fused(2, 2, "fp8_rowwise")
    # fp8 rowwise top-1 with 16 experts or more: fused at T <= 8 on an H200 or H100, not elsewhere
    h200, h100, a100 = "NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"
    assert configs.use_fused(8, 1, "fp8_rowwise", 16, device=h200)
    assert configs.use_fused(1, 1, "fp8_rowwise", 128, device=h200)
    assert not configs.use_fused(9, 1, "fp8_rowwise", 128, device=h200)
    assert not configs.use_fused(8, 1, "fp8_rowwise", 8, device=h200)
    assert not configs.use_fused(4, 2, "fp8_rowwise", 128, device=h200)
    assert configs.use_fused(8, 1, "fp8_rowwise", 16, device=h100)
    assert not configs.use_fused(9, 1, "fp8_rowwise", 16, device=h100)
    assert not configs.use_fused(1, 1, "fp8_rowwise", 16, device=a100)
    assert not configs.use_fused(8, 1, "fp8_rowwise", 16, True, device=h200)
    with configs.override(configs.Switch(fp8_top1_tokens=())):
        assert not configs.use_fused(2, 1, "fp8_rowwise", 16, device=h200)
    with configs.override(configs.ALWAYS):
        assert configs.use_fused(72, top_k=8, quant="fp8_rowwise")
        assert configs.use_fused(64 * 8, 8, "mxfp4", 128)
    with configs.override(configs.NEVER):
        assert not configs.use_fused(1)
    # fp8_block: T <= 4 in layers of 16 experts or more (Mixtral's 8 large ones: never)
    assert configs.use_fused(4 * 8, 8, "fp8_block", 128)
    assert configs.use_fused(4, 1, "fp8_block", 16)
    assert not configs.use_fused(5 * 8, 8, "fp8_block", 128)
    assert not configs.use_fused(2, 2, "fp8_block", 8)
    assert configs.merges_shared(1, 1, "fp8_block", 128)
    assert not configs.merges_shared(2, 1, "fp8_block", 128)
    # fp8_w8a16: T <= 4, or T <= 8 with at most one pair per two experts
    assert configs.use_fused(4 * 8, 8, "fp8_w8a16", 64)
    assert not configs.use_fused(5 * 8, 8, "fp8_w8a16", 64)
    assert configs.use_fused(8 * 8, 8, "fp8_w8a16", 128)
    assert configs.use_fused(8, 1, "fp8_w8a16", 16)
    assert not configs.use_fused(9, 1, "fp8_w8a16", 128)
    assert not configs.use_fused(16, 2, "fp8_w8a16", 8)
    # mxfp4: top-1 while T <= 8, any k at T = 1
    assert configs.use_fused(1, 1, "mxfp4", 16) and configs.use_fused(8, 1, "mxfp4", 16)
    assert not configs.use_fused(9, 1, "mxfp4", 128)
    assert configs.use_fused(2, 2, "mxfp4", 8) and configs.use_fused(8, 8, "mxfp4", 128)
    assert not configs.use_fused(4, 2, "mxfp4", 8) and not configs.use_fused(16, 8, "mxfp4", 128)


def test_mxfp4_one_pair_rows_per_gemm():
    """mxfp4 decode: one-pair tiles of 32 rows for gate_up, 16 for down, at every size
    (configs.MXFP4_GEMV), K split to fill the SMs."""
    for A, E, D, I in ((1, 16, 5120, 1024), (8, 16, 5120, 1024), (2, 8, 4096, 7168)):
        plan = configs.heuristic((A, E, D, I, torch.uint8, 132))
        assert (plan.gate_up.block_n, plan.down.block_n) == (32, 16)
        assert plan.gate_up.block_m == plan.down.block_m == 1
    assert configs.heuristic((1, 16, 5120, 1024, torch.uint8, 132)).gate_up.split_k == 5  # 32 tiles


def test_w8a16_rule_takes_one_pair_tiles():
    """fp8_w8a16 shapes without rows of their own keep the fp8 table's one-pair (GEMV) rows and
    replace its MMA tiles, tuned for fp8 dots, with W8A16_GEMV (split to fill the SMs); shapes
    the fp8 table lacks take W8A16_GEMV for both GEMMs."""
    for key in ((2, 8, 4096, 7168, FP8_DTYPE, 132), (1, 16, 5120, 1024, FP8_DTYPE, 132),
                (3, 16, 640, 128, FP8_DTYPE, 132)):
        w8a8, rule = configs.select(*key, "fp8_rowwise"), configs.w8a16_rule(key)
        assert configs.untuned(key, "fp8_w8a16") == rule
        for a, b in ((w8a8.gate_up, rule.gate_up), (w8a8.down, rule.down)):
            assert b.block_m == 1
            if a.block_m == 1:
                assert a == b
            else:
                assert b.with_(split_k=1) == configs.W8A16_GEMV


def test_w8a16_reads_its_own_rows(monkeypatch):
    """fp8_w8a16 rows (the format in the dtype's place of the key) serve that format only; fp8
    rowwise layers of the same e4m3 weights keep theirs, and another A bucket takes the rule."""
    row = ((8, 2048, 1, 8, 2, 1), (64, 128, 2, 4, 3, 16), True)
    want = configs.DecodeConfig(configs.GemmConfig(*row[0]), configs.GemmConfig(*row[1]),
                                pdl=True)
    key = (3, 16, 640, 128, FP8_DTYPE, 132)
    assert configs.table_key(*key, quant="fp8_w8a16") == (132, 16, 640, 128, "fp8_w8a16", 4)
    monkeypatch.setitem(configs.TABLE, (132, 16, 640, 128, "fp8_w8a16", 4), row)
    configs.table_changed()
    try:
        assert configs.select(*key, "fp8_w8a16") == configs.planned(key, "fp8_w8a16") == want
        assert configs.select(*key, "fp8_rowwise") == configs.heuristic(key) != want
        other = (5, 16, 640, 128, FP8_DTYPE, 132)
        assert configs.select(*other, "fp8_w8a16") == configs.w8a16_rule(other) != want
    finally:
        configs.table_changed()


def test_select_reads_the_table_then_the_heuristic(monkeypatch):
    """A shape the table holds takes its row for every A of its power-of-two bucket; another
    bucket, SM count or dtype takes the heuristic (a shape no preset has)."""
    row = ((32, 64, 3, 8, 5), (128, 128, 1, 4, 2), True)
    want = configs.DecodeConfig(configs.GemmConfig(*row[0]), configs.GemmConfig(*row[1]),
                                pdl=True)
    monkeypatch.setitem(configs.TABLE, (132, 16, 640, 128, "bfloat16", 4), row)
    configs.table_changed()
    try:
        assert configs.select(3, 16, 640, 128, torch.bfloat16, 132) == want
        assert configs.select(4, 16, 640, 128, torch.bfloat16, 132) == want
        for key in ((5, 16, 640, 128, torch.bfloat16, 132),
                    (4, 16, 640, 128, torch.bfloat16, 114),
                    (4, 16, 640, 128, FP8_DTYPE, 132)):
            assert configs.select(*key) == configs.heuristic(key) != want
    finally:
        configs.table_changed()


def test_a_gpu_reads_its_own_rows_first(monkeypatch):
    """BY_DEVICE[name]'s rows serve that GPU alone, before the base table's; where it has none
    it takes the base table's row, and other GPUs (and no GPU: "") take the base table's.
    tune_decode's baseline on such a GPU (untuned) is the base table's row; on the base GPU, the
    heuristic."""
    base = ((32, 64, 3, 8, 5), (128, 128, 1, 4, 2), True)
    own = ((4, 2048, 1, 4, 2, 1), (16, 512, 1, 4, 2, 1), False)
    as_config = lambda row: configs.DecodeConfig(  # noqa: E731
        configs.GemmConfig(*row[0]), configs.GemmConfig(*row[1]), pdl=row[2])
    monkeypatch.setitem(configs.TABLE, (132, 16, 640, 128, "bfloat16", 4), base)
    monkeypatch.setitem(configs.TABLE, (132, 16, 640, 128, "bfloat16", 8), base)
    monkeypatch.setitem(configs.BY_DEVICE, "Fake GPU", {(132, 16, 640, 128, "bfloat16", 4): own})
    configs.table_changed()
    try:
        key = (4, 16, 640, 128, torch.bfloat16, 132)
        other_bucket = (8, 16, 640, 128, torch.bfloat16, 132)
        assert configs.select(*key, device="Fake GPU") == as_config(own)
        assert configs.planned(key, device="Fake GPU") == as_config(own)
        assert configs.select(*other_bucket, device="Fake GPU") == as_config(base)
        for device in ("", "Another GPU", configs.BASE_DEVICE):
            assert configs.select(*key, device=device) == as_config(base)
        assert configs.untuned(key, device="Fake GPU") == as_config(base)
        assert configs.untuned(key, device=configs.BASE_DEVICE) == configs.heuristic(key)
        assert configs.untuned(key) == configs.heuristic(key)
        # fp8_w8a16 without rows of its own borrows the GPU's fp8 one-pair rows
        fp8 = (4, 16, 640, 128, FP8_DTYPE, 132)
        configs.BY_DEVICE["Fake GPU"][(132, 16, 640, 128, "float8_e4m3fn", 4)] = own
        configs.table_changed()
        one_pair = configs.GemmConfig(*own[0])
        assert configs.select(*fp8, "fp8_w8a16", "Fake GPU").gate_up == one_pair
        assert configs.select(*fp8, "fp8_w8a16").gate_up != one_pair
    finally:
        configs.table_changed()


# every distinct GEMM tiling of the tuning table's bf16 and fp8 rowwise rows, by weight dtype
# (fp8_w8a16's: tests/experts/test_fused_decode.py)
TUNED = sorted({(key[4], gemm, fields)
                for table in (configs.TABLE, *configs.BY_DEVICE.values())
                for key, rows in table.items()
                if key[4] != "fp8_w8a16" for gemm, fields in zip(("gate_up", "down"), rows)})


@pytest.mark.parametrize("dtype,gemm,fields", TUNED)
def test_tuned_tilings_match_float64(dtype, gemm, fields):
    """The tilings the table picked (wide tiles, deep K steps, their splits) on small shapes:
    masks past D and I, partial K steps, split-K fixups."""
    dt = DTYPES["fp8" if dtype == "float8_e4m3fn" else "bf16"]
    g, other = configs.GemmConfig(*fields), small(1, dt == FP8_DTYPE).down
    cfg = configs.DecodeConfig(*((g, other) if gemm == "gate_up" else (other, g)))
    run_gate_up("odd T=9 k=3 E=7", dt, cfg)
    run_down("odd T=9 k=3 E=7", dt, cfg)


def shared_weights(dtype: torch.dtype, seed: int = 9):
    """A shared expert's (w13 [2I, D], w2 [D, I]) on DEV."""
    g = gen(seed)
    return ((torch.randn(2 * I, D, generator=g) / D**0.5).to(DEV, dtype),
            (torch.randn(D, I, generator=g) / I**0.5).to(DEV, dtype))


SHARED_CASES = ["T=1 k=1 E=16", "odd T=9 k=3 E=7", "capacity drops", "ids routed nowhere", "T=0"]
SHARED_TILES = {  # (split, block_m): one m-tile of shared rows, several (4 and 1 a tile)
    "16 rows": (1, 16), "16 rows split 3": (3, 16), "4 rows split 2": (2, 4), "one pair": (1, 1)}


@pytest.mark.parametrize("impl", ["triton", "torch"])
@pytest.mark.parametrize("tiles_name", SHARED_TILES)
@pytest.mark.parametrize("case", SHARED_CASES)
def test_shared_expert_in_the_same_launches(case, tiles_name, impl):
    """shared_w13 / shared_w2: a's first T rows are the shared expert's SwiGLU of every token,
    the pairs' follow (rows past num_valid untouched); down adds each token's shared row and its
    pairs' (row weights on the pairs only) into out (accumulate) or writes the sum (every token,
    routed or not). Against float64; a's poison rows stay NaN."""
    split, bm = SHARED_TILES[tiles_name]
    gemm = configs.GemmConfig(16, 16, split, block_m=bm)
    r, T, E = routing(case)
    (w13, w2, _, _), (w13_64, w2_64) = weights(E, torch.bfloat16)
    sw13, sw2 = shared_weights(torch.bfloat16)
    x = torch.randn(T, D, generator=gen(1)).to(DEV, torch.bfloat16)
    n, experts = pairs(r)
    on_input = split != 3  # Llama 4: the weights on the gathered rows; else on the outputs
    a = poisoned(T + r.num_pairs, I, dtype=torch.bfloat16, device=DEV)
    with configs.override(configs.DecodeConfig(gemm, gemm)):
        got = decode_gate_up(x, w13, r.counts, r.token_ids, r.weights if on_input else None,
                             out=a, shared_w13=sw13, impl=impl)
    assert got is a
    g, u = (x.double().cpu() @ sw13.double().cpu().t()).chunk(2, dim=1)
    assert_close(a[:T], g / (1 + torch.exp(-g)) * u, "bfloat16")
    assert_close(a[T:T + n], gate_up64(x, r, w13_64, on_input, False), "bfloat16")
    assert torch.isnan(a[T + n:].float()).all(), "rows past num_valid were written"
    for accumulate in (True, False):
        base = torch.randn(T, D, generator=gen(4)).to(torch.bfloat16)
        out = base.clone().to(DEV)
        with configs.override(configs.DecodeConfig(gemm, gemm)):
            decode_down(a, w2, r.counts, r.token_ids, r.positions, out,
                        None if on_input else r.weights, accumulate=accumulate, shared_w2=sw2,
                        impl=impl)
        y = torch.einsum("pi,pdi->pd", a[T:T + n].double().cpu(), w2_64[experts])
        if not on_input:
            y = y * r.weights[:n].double().cpu()[:, None]
        ref = a[:T].double().cpu() @ sw2.double().cpu().t()
        if accumulate:
            ref += base.double()
        ref.index_add_(0, r.token_ids[:n].long().cpu(), y)
        assert_close(out, ref, "bfloat16")


@pytest.mark.parametrize("tiles_name", ["16 rows", "one pair", "4 rows split 2"])
@pytest.mark.parametrize("case", ["T=1 k=1 E=16", "odd T=9 k=3 E=7", "capacity drops"])
def test_early_shared_programs_give_the_same_bits(case, tiles_name):
    """The layer's merged call (early=True): gate_up's shared programs count their stored rows
    in a handshake word and down's shared programs wait for that count instead of the whole of
    gate_up (with PDL on a GPU they overlap it). The same bits as without, and the words end at
    zero (the next call starts from them)."""
    split, bm = SHARED_TILES[tiles_name]
    gate_up_tiles = configs.GemmConfig(16, 16, 1, block_m=bm)  # early needs gate_up unsplit
    down_tiles = configs.GemmConfig(16, 16, split, block_m=bm)
    r, T, E = routing(case)
    (w13, w2, _, _), _ = weights(E, torch.bfloat16)
    sw13, sw2 = shared_weights(torch.bfloat16)
    x = torch.randn(T, D, generator=gen(1)).to(DEV, torch.bfloat16)
    outs = []
    for early in (False, True, True):  # twice: the second starts from the words the first left
        a = poisoned(T + r.num_pairs, I, dtype=torch.bfloat16, device=DEV)
        out = poisoned(T, D, dtype=torch.bfloat16, device=DEV)
        with configs.override(configs.DecodeConfig(gate_up_tiles, down_tiles)):
            kernel.gate_up(x, w13, None, r.counts, r.token_ids, r.weights, a, shared=sw13,
                           early=early)
            kernel.down(a, None, w2, None, r.counts, r.token_ids, r.positions, None, out,
                        False, shared=sw2, early=early)
        outs.append(out)
        assert int(kernel.arrival_words(x, 2, kernel.FLAG_WORKSPACE).abs().sum()) == 0
    assert not torch.isnan(outs[0].float()).any()
    assert torch.equal(outs[1], outs[0]) and torch.equal(outs[2], outs[0])


def shared_gate(seed: int = 11):
    """A gated shared expert's gate [1, D] (x . gate ~ N(0, 1): sigmoids over (0, 1))."""
    return (torch.randn(1, D, generator=gen(seed)) / D**0.5).to(DEV, torch.bfloat16)


def gate64(x, gate):
    """float64 sigmoid(x . gate) [T, 1]."""
    return torch.sigmoid(x.double().cpu() @ gate.double().cpu().t())


GATE_TILES = ["16 rows split 3", "one pair", "4 rows split 2"]


@pytest.mark.parametrize("impl", ["triton", "torch"])
@pytest.mark.parametrize("tiles_name", GATE_TILES)
@pytest.mark.parametrize("case", ["T=1 k=1 E=16", "odd T=9 k=3 E=7", "capacity drops"])
def test_gated_shared_expert(case, tiles_name, impl):
    """shared_gate / gate_input (Qwen2-MoE, Qwen3-Next): down multiplies each token's shared row
    by sigmoid(x . gate), in the routed experts' launches (merged, with shared_w2; pairs
    ungated) and in the shared expert's own (E = 1, every row gated; accumulate or write), each
    against float64 of the same a; merged with the early handshake, the same bits."""
    split, bm = SHARED_TILES[tiles_name]
    gemm = configs.GemmConfig(16, 16, split, block_m=bm)
    r, T, E = routing(case)
    (w13, w2, _, _), (_, w2_64) = weights(E, torch.bfloat16)
    sw13, sw2 = shared_weights(torch.bfloat16)
    gate = shared_gate()
    x = torch.randn(T, D, generator=gen(1)).to(DEV, torch.bfloat16)
    n, experts = pairs(r)
    sig = gate64(x, gate)
    # the gate matters, and differs by token (a row gated with another token's fails)
    assert 0.05 < sig.min() and sig.max() < 0.95 and (T == 1 or sig.std() > 0.1)
    a = poisoned(T + r.num_pairs, I, dtype=torch.bfloat16, device=DEV)
    base = torch.randn(T, D, generator=gen(4)).to(DEV, torch.bfloat16)
    with configs.override(configs.DecodeConfig(gemm, gemm)):
        decode_gate_up(x, w13, r.counts, r.token_ids, None, out=a, shared_w13=sw13, impl=impl)
        shared64 = a[:T].double().cpu() @ sw2.double().cpu().t()
        out = base.clone()
        decode_down(a, w2, r.counts, r.token_ids, r.positions, out, r.weights, shared_w2=sw2,
                    shared_gate=gate, gate_input=x, impl=impl)
    y = torch.einsum("pi,pdi->pd", a[T:T + n].double().cpu(), w2_64[experts])
    y = y * r.weights[:n].double().cpu()[:, None]
    ref = base.double().cpu() + shared64 * sig
    assert_close(out, ref.index_add_(0, r.token_ids[:n].long().cpu(), y), "bfloat16",
                 name="merged")
    if impl == "triton":  # the layer's merged call
        early = poisoned(T, D, dtype=torch.bfloat16, device=DEV)
        b = poisoned(T + r.num_pairs, I, dtype=torch.bfloat16, device=DEV)
        unsplit = configs.GemmConfig(16, 16, 1, block_m=bm)  # early needs gate_up unsplit
        with configs.override(configs.DecodeConfig(unsplit, gemm)):
            kernel.gate_up(x, w13, None, r.counts, r.token_ids, None, b, shared=sw13,
                           early=True)
            kernel.down(b, None, w2, None, r.counts, r.token_ids, r.positions, r.weights,
                        early, False, shared=sw2, early=True, shared_gate=gate, gate_input=x)
        ref = shared64 * sig
        assert_close(early, ref.index_add_(0, r.token_ids[:n].long().cpu(), y), "bfloat16",
                     name="early")
    # the shared expert alone: one expert every token visits, every row gated
    one = sort_by_expert(torch.zeros(T, 1, dtype=torch.int64, device=DEV), 1, impl="torch")
    for accumulate in (True, False):
        out = base.clone()
        with configs.override(configs.DecodeConfig(gemm, gemm)):
            decode_down(a[:T].contiguous(), sw2[None], one.counts, one.token_ids,
                        one.positions, out, accumulate=accumulate, shared_gate=gate,
                        gate_input=x, impl=impl)
        ref = shared64 * sig + (base.double().cpu() if accumulate else 0.0)
        assert_close(out, ref, "bfloat16", name=f"alone, accumulate={accumulate}")


@pytest.mark.parametrize("call, error, match", [
    (lambda x, w, r, s, g: decode_down(x[:, :I].contiguous(), w, r.counts, r.token_ids,
                                       r.positions, x.clone(), shared_gate=g), TypeError,
     "shared_gate and gate_input go together"),
    (lambda x, w, r, s, g: decode_down(x[:, :I].contiguous(), w, r.counts, r.token_ids,
                                       r.positions, x.clone(), shared_gate=g[0], gate_input=x),
     ValueError, "shared_gate must"),
    (lambda x, w, r, s, g: decode_down(x[:, :I].contiguous(), w, r.counts, r.token_ids,
                                       r.positions, x.clone(), shared_gate=g.float(),
                                       gate_input=x), TypeError, "shared_gate must have dtype"),
    (lambda x, w, r, s, g: decode_down(x[:, :I].contiguous(), w, r.counts, r.token_ids,
                                       r.positions, x.clone(), shared_gate=g,
                                       gate_input=x[:1]), ValueError, "gate_input must"),
    (lambda x, w, r, s, g: decode_down(x[:, :I].contiguous(), w, r.counts, r.token_ids,
                                       r.positions, x.clone(), shared_gate=g, gate_input=x),
     ValueError, "without shared_w2 gates every row"),
])
def test_gated_shared_expert_bad_input_raises(call, error, match):
    E = 2 if match.startswith("without") else 1  # two experts: not the shared expert alone
    r = sort_by_expert(torch.zeros(9, 1, dtype=torch.int64, device=DEV), E, impl="torch")
    x = torch.randn(9, D).to(DEV, torch.bfloat16)
    w2 = shared_weights(torch.bfloat16)[1][None].expand(E, -1, -1).contiguous()
    with pytest.raises(error, match=match):
        call(x, w2, r, None, shared_gate())


@pytest.mark.parametrize("call, error, match", [
    (lambda x, w, r, s: decode_gate_up(x, w, r.counts, r.token_ids, shared_w13=s.t()),
     ValueError, "shared_w13 must"),
    (lambda x, w, r, s: decode_gate_up(x, w, r.counts, r.token_ids, shared_w13=s.float()),
     TypeError, "shared_w13 must have dtype"),
    (lambda x, w, r, s: decode_gate_up(x, w, r.counts, r.token_ids, out=torch.empty(
        r.num_pairs, I, dtype=x.dtype, device=x.device), shared_w13=s), ValueError, "out must"),
    (lambda x, w, r, s: decode_gate_up(x, w, r.counts, r.token_ids, shared_w13=s,
                                       w13_bias=torch.zeros(w.shape[:2], device=x.device)),
     ValueError, "only taken with"),
    (lambda x, w, r, s: decode_down(torch.zeros(r.num_pairs, I, dtype=x.dtype, device=x.device),
                                    w[:, :D, :I].contiguous(), r.counts, r.token_ids,
                                    r.positions, x, shared_w2=s[:D, :I].contiguous()),
     ValueError, "a must have T \\+ A="),
])
def test_shared_expert_bad_input_raises(call, error, match):
    r, T, E = routing("odd T=9 k=3 E=7")
    (w13, _, _, _), _ = weights(E, torch.bfloat16)
    x = torch.randn(T, D).to(DEV, torch.bfloat16)
    with pytest.raises(error, match=match):
        call(x, w13, r, shared_weights(torch.bfloat16)[0])


@pytest.mark.parametrize("call, error, match", [
    (lambda x, w, r: decode_gate_up(x.float(), w, r.counts, r.token_ids), TypeError,
     "w13 must be torch.float32"),
    (lambda x, w, r: decode_gate_up(x[:, :5], w, r.counts, r.token_ids), ValueError, "contiguous"),
    (lambda x, w, r: decode_gate_up(x, w[:, :, :8].contiguous(), r.counts, r.token_ids),
     ValueError, "w13 must be"),
    (lambda x, w, r: decode_gate_up(x, w, r.counts[:3], r.token_ids), ValueError, "counts must"),
    (lambda x, w, r: decode_gate_up(x, w, r.counts, r.token_ids, r.weights[:1]), ValueError,
     "row_weights must"),
    (lambda x, w, r: decode_gate_up(x, w, r.counts, r.token_ids, w13_scale=r.weights),
     ValueError, "w13_scale is not used"),
    (lambda x, w, r: decode_down(x[:, :I].contiguous(), w.transpose(1, 2).contiguous()[:, :D],
                                 r.counts, r.token_ids, r.positions, x), ValueError,
     "a must have A="),
    (lambda x, w, r: decode_gate_up(x, w.to(FP8_DTYPE), r.counts, r.token_ids,
                                    quantization="none"), TypeError, "w13 must be torch.bfloat16"),
])
def test_bad_input_raises(call, error, match):
    r, T, E = routing("odd T=9 k=3 E=7")
    (w13, _, _, _), _ = weights(E, torch.bfloat16)
    x = torch.randn(T, D).to(DEV, torch.bfloat16)
    with pytest.raises(error, match=match):
        call(x, w13, r)


@needs_cuda
@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_graph_replays_with_changing_routing(dtype):
    """One capture of gate_up + down with split-K, replayed with new tokens and routing: the
    arrival words must come back to zero every replay, and every replay matches float64."""
    E, T, k = 16, 4, 2
    dt = DTYPES[dtype]
    (w13, w2, s13, s2), (w13_64, w2_64) = weights(E, dt)
    x = torch.zeros(T, D, dtype=act_dtype(dt), device=DEV)
    ids = torch.zeros(T, k, dtype=torch.int64, device=DEV)
    wts = torch.zeros(T, k, device=DEV)
    out = torch.zeros(T, D, dtype=act_dtype(dt), device=DEV)

    def step():
        r = sort_by_expert(ids, E, wts)
        out.zero_()
        a = decode_gate_up(x, w13, r.counts, r.token_ids, w13_scale=s13)
        decode_down(a, w2, r.counts, r.token_ids, r.positions, out, r.weights, w2_scale=s2)
        return r

    with configs.override(small(3, dt == FP8_DTYPE)):
        step()  # compile and size the arrival words outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        for rep in range(6):
            g = gen(50 + rep)
            x.copy_(torch.randn(T, D, generator=g))
            ids.copy_(torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]))
            wts.copy_(torch.rand(T, k, generator=g) + 0.25)
            graph.replay()
            r = sort_by_expert(ids, E, wts, impl="torch")
            n, experts = pairs(r)
            a64 = gate_up64(x, r, w13_64, False, dt == FP8_DTYPE)
            if dt == FP8_DTYPE:  # the kernel's a is quantized; so is its float64 stand-in
                q, s = quantize_fp8_rowwise(a64.float())
                a64 = q.double() * s.double()[:, None]
            y = torch.einsum("pi,pdi->pd", a64, w2_64[experts])
            y = y * r.weights[:n].double().cpu()[:, None]
            ref = torch.zeros(T, D, dtype=torch.float64).index_add_(
                0, r.token_ids[:n].long().cpu(), y)
            assert_close(out, ref, tol(dt), name=f"replay {rep}")


@pytest.mark.skipif(not CUDA, reason="the workspace is reserved on a GPU only")
@pytest.mark.parametrize("dims", [(8, 64, 96, 2, "none"), (128, 2048, 768, 8, "none"),
                                  (16, 5120, 8192, 1, "none"), (8, 64, 96, 2, "fp8_w8a16"),
                                  (128, 2048, 768, 8, "mxfp4")])
def test_layer_reserves_every_fused_calls_arrival_words(dims):
    """A layer on a GPU allocates the fused kernels' arrival words when it gathers its weights,
    for every A the default Switch fuses: no later call allocates (a first allocation inside
    torch.compile's CUDA-graph-tree warm-up would sit in their pool and fail its check)."""
    from shufflemoe import MoE, MoEConfig

    E, D, I, k, quant = dims
    layer = MoE(MoEConfig(hidden_size=D, intermediate_size=I, num_experts=E, top_k=k,
                          quantization=quant), device="cuda")
    layer._hot()
    words = kernel._WORDS[torch.device("cuda", torch.cuda.current_device()), 0]
    held = (len(words), words[-1].data_ptr())
    for T in range(1, configs.Switch().max_pairs // k + 1):
        layer(torch.randn(T, D, device="cuda", dtype=torch.bfloat16))
    assert (len(words), words[-1].data_ptr()) == held


# ---------------------------------------------------------------------- weight-only formats
# fp8_w8a16 and mxfp4: x and a stay bf16, the kernels dequantize the weight tile in registers.
# mxfp4 needs K in whole 32-column groups: its own widths (gate_up K = 96, down K = 64).
WO_D, WO_I = 96, 64
WEIGHT_ONLY = ("fp8_w8a16", "mxfp4")


def wo_tiles(split: int, block_k: int = 32, block_m: int = 16) -> configs.DecodeConfig:
    gemm = configs.GemmConfig(16, block_k, split, block_m=block_m)
    return configs.DecodeConfig(gemm, gemm)


def wo_weights(E: int, quant: str, seed: int = 0, dims: tuple[int, int] = (WO_D, WO_I)):
    """(w13, w2, w13_scale, w2_scale) stored in ``quant`` (bf16 and no scales for "none"; w13's
    fp8_block scale blocks restart at the up half) and their exact float64 values."""
    fmt = weight_format(quant)
    g = gen(seed)
    stored, exact = [], []
    d, i = dims
    for N, K, split in ((2 * i, d, i), (d, i, None)):
        w = torch.randn(E, N, K, generator=g) / K**0.5
        q, s = fmt.quantize(w, split) if fmt.quantized else (w.to(torch.bfloat16), None)
        stored.append((q.to(DEV), None if s is None else s.to(DEV)))
        exact.append(fmt.dequantize(q, s, split).double() if fmt.quantized else q.double())
    (q13, s13), (q2, s2) = stored
    return (q13, q2, s13, s2), tuple(exact)


def run_wo(case: str, quant: str, cfg: configs.DecodeConfig | None, impl: str = "triton",
           accumulate: bool = True, seed: int = 0) -> None:
    """gate_up then down (each against float64 of its own bf16 inputs), x times the pairs'
    input weights, the output weights on down; cfg None: the default tiles."""
    r, T, E = routing(case, seed + 3)
    (w13, w2, s13, s2), (w13_64, w2_64) = wo_weights(E, quant, seed)
    n, experts = pairs(r)
    x = torch.randn(T, WO_D, generator=gen(seed + 1)).to(DEV, torch.bfloat16)
    a = poisoned(r.num_pairs, WO_I, dtype=torch.bfloat16, device=DEV)
    base = torch.randn(T, WO_D, generator=gen(seed + 4)).to(DEV, torch.bfloat16)
    out = base.clone()
    with configs.override(cfg) if cfg else contextlib.nullcontext():
        got = decode_gate_up(x, w13, r.counts, r.token_ids, r.weights, w13_scale=s13,
                             quantization=quant, out=a, impl=impl)
        assert got is a
        assert_close(a[:n], gate_up64(x, r, w13_64, True, False), "bfloat16", name=f"{quant} a")
        assert torch.isnan(a[n:].float()).all(), "rows past num_valid were written"
        decode_down(a, w2, r.counts, r.token_ids, r.positions, out, r.weights, w2_scale=s2,
                    quantization=quant, accumulate=accumulate, impl=impl)
    y = torch.einsum("pi,pdi->pd", a[:n].double().cpu(), w2_64[experts])
    y = y * r.weights[:n].double().cpu()[:, None]
    tokens = r.token_ids[:n].long().cpu()
    ref = base.double().cpu()
    if not accumulate:
        ref[tokens] = 0.0
    assert_close(out, ref.index_add_(0, tokens, y), "bfloat16", name=f"{quant} out")


WO_CASES = [(c, q) for q in WEIGHT_ONLY for c in ("T=1 k=1 E=16", "odd T=9 k=3 E=7", "k=8 E=256",
                                                   "all tokens on one expert", "capacity drops")]


@pytest.mark.parametrize("impl", ["triton", "torch"])
@pytest.mark.parametrize("case,quant", WO_CASES, ids=[f"{c}-{q}" for c, q in WO_CASES])
def test_weight_only_formats_match_float64(case, quant, impl):
    run_wo(case, quant, wo_tiles(2), impl)


SHARED_FORMATS = ("fp8_rowwise", "fp8_block") + WEIGHT_ONLY
SHARED_QUANT_TILES = {"16 rows": wo_tiles(1), "4 rows split 2": wo_tiles(2, block_m=4),
                      "one pair bk64": wo_tiles(1, 64, block_m=1)}
SHARED_QUANT_CASES = [(c, q) for q in SHARED_FORMATS
                      for c in ("T=1 k=1 E=16", "odd T=9 k=3 E=7", "capacity drops", "T=0")
                      if q != "fp8_block" or c != "capacity drops"]  # its rows: fp8 rowwise's


def quantized_outputs(A: int, I: int, quant: str):
    """Poisoned (q, scale) of a w8a8 decode_gate_up: e4m3 NaN, scales [A] or fp8_block's
    [A, ceil(I / 128)] NaN."""
    q = poisoned(A, I, dtype=torch.uint8, device=DEV).view(FP8_DTYPE)
    q.view(torch.uint8).fill_(0x7F)  # e4m3 NaN
    shape = (A,) if quant == "fp8_rowwise" else (A, -(-I // 128))
    return q, poisoned(*shape, dtype=torch.float32, device=DEV)


def dequantized(q, scale):
    """float64 values of w8a8 rows (q, scale [A] or [A, groups of 128])."""
    if scale.dim() == 1:
        return q.double() * scale.double()[:, None]
    return dequantize_fp8_groups(q, scale).double()


def shared_outputs(T: int, A: int, quant: str):
    """Poisoned outputs of a merged decode_gate_up: a [T + A, I], or w8a8 (q, scale, sa)."""
    if quant not in W8A8:
        return poisoned(T + A, WO_I, dtype=torch.bfloat16, device=DEV)
    return (*quantized_outputs(A, WO_I, quant),
            poisoned(T, WO_I, dtype=torch.bfloat16, device=DEV))


def shared_and_routed(a, T: int, n: int, quant: str):
    """(the shared expert's rows, the valid pairs' rows) of a merged gate_up's outputs, float64."""
    if quant in W8A8:
        q, scale, sa = a
        return sa.double().cpu(), dequantized(q, scale).cpu()[:n]
    return a[:T].double().cpu(), a[T:T + n].double().cpu()


@pytest.mark.parametrize("impl", ["triton", "torch"])
@pytest.mark.parametrize("tiles_name", SHARED_QUANT_TILES)
@pytest.mark.parametrize("case,quant", SHARED_QUANT_CASES,
                         ids=[f"{c}-{q}" for c, q in SHARED_QUANT_CASES])
def test_shared_expert_beside_quantized_experts(case, quant, tiles_name, impl):
    """A shared expert in x's dtype in the launches of routed experts stored as fp8 rowwise
    (w8a8: its rows of a stay unquantized, in sa), fp8_w8a16 or mxfp4: the shared rows (no
    scales, no input weights) and the pairs' rows of a, then out = base + shared + routed
    (accumulate) or shared + routed, each against float64; poisoned rows stay NaN; with the
    layer's early handshake the same bits. With split-K tiles the shared expert is gated
    (Qwen3-Next: its rows times sigmoid(x . gate))."""
    cfg = SHARED_QUANT_TILES[tiles_name]
    r, T, E = routing(case)
    (w13, w2, s13, s2), (w13_64, w2_64) = wo_weights(E, quant)
    g = gen(9)
    sw13 = (torch.randn(2 * WO_I, WO_D, generator=g) / WO_D**0.5).to(DEV, torch.bfloat16)
    sw2 = (torch.randn(WO_D, WO_I, generator=g) / WO_I**0.5).to(DEV, torch.bfloat16)
    x = torch.randn(T, WO_D, generator=gen(1)).to(DEV, torch.bfloat16)
    gated = dict(shared_gate=(torch.randn(1, WO_D, generator=g) / WO_D**0.5).to(
        DEV, torch.bfloat16), gate_input=x) if "split" in tiles_name else {}
    sig = gate64(x, gated["shared_gate"]) if gated else 1.0
    n, experts = pairs(r)
    fp8 = quant in W8A8
    a = shared_outputs(T, r.num_pairs, quant)
    with configs.override(cfg):
        got = decode_gate_up(x, w13, r.counts, r.token_ids, r.weights, w13_scale=s13,
                             quantization=quant, out=a, shared_w13=sw13, impl=impl)
    assert got is a
    shared, routed = shared_and_routed(a, T, n, quant)
    gate, up = (x.double().cpu() @ sw13.double().cpu().t()).chunk(2, dim=1)
    assert_close(shared, gate / (1 + torch.exp(-gate)) * up, "bfloat16", name="shared rows")
    assert_close(routed, gate_up64(x, r, w13_64, True, quant if fp8 else False),
                 quant if fp8 else "bfloat16", name=f"{quant} pairs' rows")
    past = (a[0].view(torch.uint8)[n:] == 0x7F).all() if fp8 else torch.isnan(
        a[T + n:].float()).all()
    assert past, "rows past num_valid were written"
    y = torch.einsum("pi,pdi->pd", routed, w2_64[experts])
    tokens = r.token_ids[:n].long().cpu()
    base = torch.randn(T, WO_D, generator=gen(4)).to(DEV, torch.bfloat16)
    for accumulate in (True, False):
        out = base.clone()
        with configs.override(cfg):
            decode_down(a, w2, r.counts, r.token_ids, r.positions, out, w2_scale=s2,
                        quantization=quant, accumulate=accumulate, shared_w2=sw2, impl=impl,
                        **gated)
        ref = (shared @ sw2.double().cpu().t()) * sig + (base.double().cpu() if accumulate
                                                         else 0.0)
        assert_close(out, ref.index_add_(0, tokens, y), "bfloat16", name=f"{quant} out")
    if impl == "triton":  # the layer's merged call: the same bits with the early handshake
        early_out = poisoned(T, WO_D, dtype=torch.bfloat16, device=DEV)
        b = shared_outputs(T, r.num_pairs, quant)
        with configs.override(cfg):
            kernel.gate_up(x, w13, s13, r.counts, r.token_ids, r.weights, b, 0, quant,
                           shared=sw13, early=True)
            q, scale, sa = b if fp8 else (b, None, None)
            kernel.down(q, scale, w2, s2, r.counts, r.token_ids, r.positions, None, early_out,
                        False, 0, quant, shared=sw2, early=True, shared_a=sa, **gated)
        assert torch.equal(early_out, out)
        assert int(kernel.arrival_words(x, 2, kernel.FLAG_WORKSPACE).abs().sum()) == 0


@pytest.mark.parametrize("call, error, match", [
    (lambda x, w, s, r, sw, a: decode_gate_up(x, w, r.counts, r.token_ids, w13_scale=s,
                                              out=a[:2], shared_w13=sw),
     TypeError, "out must be a \\(q, scale, sa\\) tuple"),
    (lambda x, w, s, r, sw, a: decode_gate_up(x, w, r.counts, r.token_ids, w13_scale=s,
                                              out=(*a[:2], a[2][:, :8]), shared_w13=sw),
     ValueError, "out\\[2\\] must"),
    (lambda x, w, s, r, sw, a: decode_down(a[:2], w, r.counts, r.token_ids, r.positions,
                                           x, w2_scale=s, shared_w2=sw),
     TypeError, "goes with w8a8 weights .* and shared_w2 only"),
    (lambda x, w, s, r, sw, a: decode_down(a, w, r.counts, r.token_ids, r.positions,
                                           x, w2_scale=s),
     TypeError, "goes with w8a8 weights .* and shared_w2 only"),
])
def test_shared_expert_beside_fp8_bad_input_raises(call, error, match):
    r, T, E = routing("odd T=9 k=3 E=7")
    (w13, w2, s13, s2), _ = wo_weights(E, "fp8_rowwise")
    x = torch.randn(T, WO_D).to(DEV, torch.bfloat16)
    a = shared_outputs(T, r.num_pairs, "fp8_rowwise")
    gate_up = "out" in match
    sw = torch.zeros((2 * WO_I, WO_D) if gate_up else (WO_D, WO_I), dtype=torch.bfloat16,
                     device=DEV)
    with pytest.raises(error, match=match):
        call(x, w13 if gate_up else w2, s13 if gate_up else s2, r, sw, a)


@pytest.mark.parametrize("quant", WEIGHT_ONLY)
@pytest.mark.parametrize("cfg", [wo_tiles(1, 64), wo_tiles(3), wo_tiles(5, 64),
                                 wo_tiles(2, 32, block_m=1), wo_tiles(1, 64, block_m=1)],
                         ids=["bk64 split1 (partial K step)", "split3", "split5 (> K steps)",
                              "gemv split2", "gemv bk64"])
def test_weight_only_tiles(quant, cfg):
    run_wo("odd T=9 k=3 E=7", quant, cfg)
    run_wo("ids routed nowhere", quant, cfg, accumulate=False)


@pytest.mark.parametrize("call, error, match", [
    (lambda x, w, s, r: decode_gate_up(x, w, r.counts, r.token_ids, w13_scale=s,
                                       quantization="int8"), ValueError, "quantization must"),
    (lambda x, w, s, r: decode_gate_up(x, w, r.counts, r.token_ids, w13_scale=s,
                                       quantization="fp8_block"), TypeError, "w13 must be"),
    (lambda x, w, s, r: decode_gate_up(x, w, r.counts, r.token_ids,
                                       w13_scale=s[..., :1].contiguous(), quantization="mxfp4"),
     ValueError, "w13_scale must"),
    (lambda x, w, s, r: decode_gate_up(x, w, r.counts, r.token_ids, w13_scale=s,
                                       quantization="fp8_w8a16"), TypeError, "w13 must be"),
    (lambda x, w, s, r: decode_gate_up(x[:, :64].contiguous(), w, r.counts, r.token_ids,
                                       w13_scale=s, quantization="mxfp4"), ValueError,
     r"w13 must be \[E, N, 32\]"),
])
def test_weight_only_bad_input_raises(call, error, match):
    r, T, E = routing("odd T=9 k=3 E=7")
    (w13, _, s13, _), _ = wo_weights(E, "mxfp4")
    x = torch.randn(T, WO_D).to(DEV, torch.bfloat16)
    with pytest.raises(error, match=match):
        call(x, w13, s13, r)


@pytest.mark.parametrize("quant", WEIGHT_ONLY)
def test_weight_only_default_tiles(quant):
    """The default tiles (fp8_w8a16: one-pair tiles, configs._w8a16; mxfp4: MXFP4_GEMV, K steps
    wider than these shapes' K)."""
    for case in ("T=1 k=1 E=16", "k=8 E=256", "all tokens on one expert"):
        run_wo(case, quant, None)


def test_mxfp4_needs_whole_scale_groups_per_k_step():
    with pytest.raises(ValueError, match="32-column scale groups"):
        run_wo("T=1 k=1 E=16", "mxfp4", wo_tiles(1, 16))


# --------------------------------------------------------------------------------- fp8_block
# w8a8 in 128-column groups: K steps of one scale block; widths with two groups each, the last
# partial (gate_up K = 160: 128 + 32; down K = 144: 128 + 16), and w13's up half starting
# its own scale blocks.
BLOCK_DIMS = (160, 144)
BLOCK_TILES = {"16 rows split 2": wo_tiles(2), "4 rows split 3": wo_tiles(3, block_m=4),
               "one pair": wo_tiles(1, block_m=1), "one pair split 2": wo_tiles(2, block_m=1),
               "one pair, 2 blocks a step": wo_tiles(1, 256, block_m=1)}
BLOCK_CASES = ("T=0", "T=1 k=1 E=16", "odd T=9 k=3 E=7", "k=8 E=256", "all tokens on one expert",
               "capacity drops", "ids routed nowhere")


def run_block(case: str, cfg: configs.DecodeConfig | None, impl: str = "triton",
              accumulate: bool = True, seed: int = 0) -> None:
    """gate_up (x gathered times the input weights, quantized per 128 columns) against float64
    of those rows through the exact weights, a's (q, scale) read back; then down from that a,
    against float64; rows past num_valid stay NaN."""
    r, T, E = routing(case, seed + 3)
    d, i = BLOCK_DIMS
    (w13, w2, s13, s2), (w13_64, w2_64) = wo_weights(E, "fp8_block", seed, BLOCK_DIMS)
    n, experts = pairs(r)
    x = torch.randn(T, d, generator=gen(seed + 1)).to(DEV, torch.bfloat16)
    a = quantized_outputs(r.num_pairs, i, "fp8_block")
    base = torch.randn(T, d, generator=gen(seed + 4)).to(DEV, torch.bfloat16)
    out = base.clone()
    with configs.override(cfg) if cfg else contextlib.nullcontext():
        got = decode_gate_up(x, w13, r.counts, r.token_ids, r.weights, w13_scale=s13,
                             quantization="fp8_block", out=a, impl=impl)
        assert got is a
        a64 = dequantized(*a).cpu()
        assert_close(a64[:n], gate_up64(x, r, w13_64, True, "fp8_block"), "fp8_block",
                     name="fp8_block a")
        assert (a[0].view(torch.uint8)[n:] == 0x7F).all(), "rows past num_valid were written"
        assert torch.isnan(a[1][n:]).all(), "scales past num_valid were written"
        decode_down(a, w2, r.counts, r.token_ids, r.positions, out, r.weights, w2_scale=s2,
                    quantization="fp8_block", accumulate=accumulate, impl=impl)
    y = torch.einsum("pi,pdi->pd", a64[:n], w2_64[experts]) * r.weights[:n].double().cpu()[:, None]
    tokens = r.token_ids[:n].long().cpu()
    ref = base.double().cpu()
    if not accumulate:
        ref[tokens] = 0.0
    assert_close(out, ref.index_add_(0, tokens, y), "bfloat16", name="fp8_block out")


@pytest.mark.parametrize("impl", ["triton", "torch"])
@pytest.mark.parametrize("case", BLOCK_CASES)
def test_fp8_block_matches_float64(case, impl):
    run_block(case, BLOCK_TILES["16 rows split 2"], impl)


@pytest.mark.parametrize("tiles_name", BLOCK_TILES)
def test_fp8_block_tiles(tiles_name):
    """Every tile kind (MMA rows, one-pair GEMV with one or two blocks a step, split-K)."""
    run_block("odd T=9 k=3 E=7", BLOCK_TILES[tiles_name])


def test_fp8_block_down_writes_out():
    """accumulate=False: out = the sum where a token has a routed pair, kept elsewhere."""
    run_block("ids routed nowhere", BLOCK_TILES["4 rows split 3"], accumulate=False)


def test_fp8_block_default_tiles():
    for case in ("T=1 k=1 E=16", "k=8 E=256"):
        run_block(case, None)


def test_fp8_block_bad_input_raises():
    r, T, E = routing("odd T=9 k=3 E=7")
    d, i = BLOCK_DIMS
    (w13, w2, s13, s2), _ = wo_weights(E, "fp8_block", 0, BLOCK_DIMS)
    x = torch.randn(T, d).to(DEV, torch.bfloat16)
    with pytest.raises(ValueError, match="w13_scale must"):  # the unsplit block count
        decode_gate_up(x, w13, r.counts, r.token_ids, w13_scale=s13[:, 1:].contiguous(),
                       quantization="fp8_block")
    with pytest.raises(ValueError, match="out\\[1\\] must"):  # a row scale, not group scales
        decode_gate_up(x, w13, r.counts, r.token_ids, w13_scale=s13, quantization="fp8_block",
                       out=quantized_outputs(r.num_pairs, i, "fp8_rowwise"))
    with pytest.raises(TypeError, match="needs bfloat16 or float16 activations"):
        decode_gate_up(x.float(), w13, r.counts, r.token_ids, w13_scale=s13,
                       quantization="fp8_block")
    q, scale = quantized_outputs(r.num_pairs, i, "fp8_block")
    with pytest.raises(ValueError, match="a scale must"):
        decode_down((q, scale[:, 0].contiguous()), w2, r.counts, r.token_ids, r.positions, x,
                    w2_scale=s2, quantization="fp8_block")


# ------------------------------------------------------- gpt-oss: expert biases, clamped GLU
# A limit inside the products' range (|h| ~ 1): the clamp changes some gates and ups.
OAI = dict(activation="swiglu_oai", alpha=1.702, limit=0.75)


def run_biased(case: str, quant: str, cfg: configs.DecodeConfig, impl: str = "triton",
               seed: int = 0) -> None:
    """gate_up with w13_bias and swiglu_oai, then down with w2_bias, each against float64 of its
    own inputs (the weights' exact values; a as the kernel stored it), in every weight format."""
    r, T, E = routing(case, seed + 3)
    (w13, w2, s13, s2), exact = wo_weights(E, quant, seed)
    g = gen(seed + 5)
    b13, b2 = (torch.randn(E, N, generator=g).to(DEV, torch.bfloat16) for N in (2 * WO_I, WO_D))
    n, experts = pairs(r)
    fp8 = quant == "fp8_rowwise"
    x = torch.randn(T, WO_D, generator=gen(seed + 1)).to(DEV, torch.bfloat16)
    A = r.num_pairs
    a = ((poisoned(A, WO_I, dtype=torch.uint8, device=DEV).view(FP8_DTYPE),
          poisoned(A, dtype=torch.float32, device=DEV)) if fp8
         else poisoned(A, WO_I, dtype=torch.bfloat16, device=DEV))
    if fp8:
        a[0].view(torch.uint8).fill_(0x7F)  # e4m3 NaN
    base = torch.randn(T, WO_D, generator=gen(seed + 4)).to(DEV, torch.bfloat16)
    out = base.clone()
    with configs.override(cfg):
        decode_gate_up(x, w13, r.counts, r.token_ids, r.weights, w13_scale=s13, w13_bias=b13,
                       quantization=quant, out=a, impl=impl, **OAI)
        decode_down(a, w2, r.counts, r.token_ids, r.positions, out, r.weights, w2_scale=s2,
                    w2_bias=b2, quantization=quant, impl=impl)
    xs = gather_scale(x, r.token_ids, r.weights, quantize=fp8, impl="torch")
    x64 = (xs[0].double() * xs[1].double()[:, None] if fp8 else xs.double()).cpu()[:n]
    h = torch.einsum("pd,pnd->pn", x64, exact[0][experts]) + b13.double().cpu()[experts]
    gate, up = h.chunk(2, dim=1)
    assert (gate > OAI["limit"]).any() and (up.abs() > OAI["limit"]).any(), "no value clamped"
    got = a[0].double() * a[1].double()[:, None] if fp8 else a.double()
    tol = "fp8_rowwise" if fp8 else "bfloat16"
    assert_close(got[:n], glu(gate, up, *OAI.values()), tol, name=f"{quant} a")
    assert torch.isnan(got[n:]).all(), "rows past num_valid were written"
    y = torch.einsum("pi,pdi->pd", got[:n].cpu(), exact[1][experts]) + b2.double().cpu()[experts]
    y = y * r.weights[:n].double().cpu()[:, None]
    ref = base.double().cpu().index_add_(0, r.token_ids[:n].long().cpu(), y)
    assert_close(out, ref, tol, name=f"{quant} out")


BIASED = [(c, q) for q in ("none", "fp8_rowwise", "fp8_w8a16", "mxfp4")
          for c in ("T=1 k=1 E=16", "odd T=9 k=3 E=7", "k=8 E=256", "capacity drops")]


@pytest.mark.parametrize("case,quant", BIASED, ids=[f"{c}-{q}" for c, q in BIASED])
def test_biases_and_clamped_glu_match_float64(case, quant):
    run_biased(case, quant, wo_tiles(2))


@pytest.mark.parametrize("quant", ["none", "fp8_rowwise", "fp8_w8a16", "mxfp4"])
def test_biases_and_clamped_glu_other_tiles(quant):
    """One-pair tiles (the GEMV and mxfp4 paths), no split; and the torch reference."""
    run_biased("odd T=9 k=3 E=7", quant, wo_tiles(2, 32, block_m=1))
    run_biased("T=1 k=1 E=16", quant, wo_tiles(1, 64))
    run_biased("odd T=9 k=3 E=7", quant, wo_tiles(2), impl="torch")
