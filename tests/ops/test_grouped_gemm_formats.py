"""The grouped GEMM's weight formats (fp8_w8a16, fp8_block, mxfp4) and bias epilogue: the torch
reference and the Triton kernel (interpreter on the CPU) against float64 of the dequantized
operands, on odd shapes with empty groups, weight_ids, row weights, scatter-add and NaN tail rows,
through every load path; on a GPU, model-sized shapes with the kernel's own tile choice."""

from __future__ import annotations

import contextlib

import pytest
import torch

from shufflemoe.ops import grouped_gemm
from shufflemoe.ops.grouped_gemm import configs
from shufflemoe.ops.quantize import reference as qref
from shufflemoe.ops.quantize.formats import weight_format
from shufflemoe.ops.silu_mul import reference as silu_mul_ref
from shufflemoe.testing import assert_close, poisoned, tolerance_for

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
SMALL = configs.TileConfig(16, 32, 32, num_warps=4, num_stages=2)
FORMATS = ["fp8_w8a16", "fp8_block", "mxfp4"]
# Odd N everywhere; K with a partial 128-block (fp8_block) or whole 32-groups (mxfp4); fp8_block
# restarts its scale blocks at the second half of N (split), as w13 does.
SHAPES = {"fp8_w8a16": (37, 45, None), "fp8_block": (70, 160, 35), "mxfp4": (37, 96, None)}


def gen(seed):
    return torch.Generator().manual_seed(seed)


def make(fmt_name, m_sizes, N, K, split=None, *, W=None, tail=3, bias=True, seed=0, device=DEV,
         x_scale=1.0):
    """(x, w, kwargs of grouped_gemm, x64, w64 [W, N, K] float64, bias64) for one format; x's
    rows past sum(m_sizes) are NaN. Weights get per-row magnitudes spread over 2^+-4 so that
    their scales differ."""
    fmt = weight_format(fmt_name)
    g = gen(seed)
    W = W or len(m_sizes)
    M = sum(m_sizes) + tail
    x = (torch.randn(M, K, generator=g) * x_scale).to(torch.bfloat16)
    w = torch.randn(W, N, K, generator=g) / K**0.5 * 2.0 ** torch.randint(-4, 5, (W, N, 1),
                                                                         generator=g)
    wq, ws = fmt.quantize(w.to(torch.bfloat16), split)
    w64 = fmt.dequantize(wq, ws, split).double()
    kw = dict(w_scale=ws.to(device), quantization=fmt_name, scale_split=split)
    if fmt.activation == "groups":
        xq, xs = qref.quantize_fp8_groups(x)
        x64 = qref.dequantize_fp8_groups(xq, xs).double()
        x, kw["x_scale"] = xq, xs.to(device)
    else:
        x64 = x.double()
    if tail:
        x = x.clone()
        if x.dtype == torch.bfloat16:
            x[M - tail:] = float("nan")
        else:
            x.view(torch.uint8)[M - tail:] = 0x7F  # e4m3 NaN
    b = None
    if bias:
        b = torch.randn(W, N, generator=g).to(torch.bfloat16)
        kw["bias"] = b.to(device)
    return x.to(device), wq.to(device), kw, x64, w64, b


def loop64(x64, w64, m_sizes, weight_ids=None, bias=None, rw=None):
    ys, start = [], 0
    for g, n in enumerate(m_sizes):
        e = g if weight_ids is None else weight_ids[g]
        y = x64[start:start + n] @ w64[e].T
        ys.append(y if bias is None else y + bias[e].double())
        start += n
    y = torch.cat(ys) if ys else torch.zeros(0, w64.shape[1], dtype=torch.float64)
    return y if rw is None else y * rw.double()[: y.shape[0], None]


def run(impl, fmt_name, m_sizes, *, weight_ids=None, W=None, row_weights=False, tail=3, seed=0,
        bias=True):
    N, K, split = SHAPES[fmt_name]
    x, w, kw, x64, w64, b = make(fmt_name, m_sizes, N, K, split, W=W, tail=tail, bias=bias,
                                 seed=seed)
    rw = None
    if row_weights:
        rw = torch.rand(x.shape[0], generator=gen(seed + 1)) + 0.5
        kw["row_weights"] = rw.to(DEV)
    if weight_ids is not None:
        kw["weight_ids"] = torch.tensor(weight_ids, dtype=torch.int32, device=DEV)
    ms = torch.tensor(m_sizes, dtype=torch.int32, device=DEV)
    out = poisoned(x.shape[0], N, dtype=torch.bfloat16, device=DEV)
    y = grouped_gemm(x, w, ms, out=out, impl=impl, **kw)
    n = sum(m_sizes)
    assert_close(y[:n], loop64(x64, w64, m_sizes, weight_ids, b, rw), "bfloat16")
    assert torch.isnan(y[n:].float()).all(), "rows past sum(m_sizes) were written"


CASES = {
    "groups with an empty one": dict(m_sizes=[5, 0, 21, 3]),
    "weight_ids and row weights": dict(m_sizes=[4, 9, 2, 6], W=3, weight_ids=[2, 0, 2, 1],
                                       row_weights=True),
    "no bias, no tail": dict(m_sizes=[8, 8], bias=False, tail=0),
}


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case", list(CASES))
def test_matches_float64(impl, fmt, case):
    with configs.override(SMALL):
        run(impl, fmt, **CASES[case])


VARIANTS = {
    "pointers": SMALL.with_(tma="none"),
    "tma host": SMALL,
    "tma device": SMALL.with_(tma="device"),
    "swap_ab": SMALL.with_(swap_ab=True),
    "swap_ab, mxfp4 run order": SMALL.with_(swap_ab=True, run_order=True),  # others: K's order
    "mxfp4 run order, 64-column steps": configs.TileConfig(16, 32, 64, num_stages=2,
                                                           run_order=True),
    "swap_ab, run order, a step in two parts": configs.TileConfig(
        16, 32, 64, num_stages=2, swap_ab=True, run_order=True, k_parts=2),
    "block_k 64, 32-row tiles": configs.TileConfig(32, 16, 64, num_stages=2),
    "swap_ab, 32-row tiles": configs.TileConfig(32, 32, 64, num_stages=2, swap_ab=True),
    "block_k 256 (capped)": configs.TileConfig(16, 32, 256, num_stages=2),
}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_kernel_variants(fmt, variant):
    """Every load path and orientation; K steps larger than a scale block are cut to one block
    (fp8_block) and smaller than an e8m0 group raised to one group (mxfp4)."""
    with configs.override(VARIANTS[variant]):
        run("triton", fmt, [11, 0, 3, 19], W=3, weight_ids=[1, 2, 0, 1], row_weights=True, seed=5)


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_scatter_add_with_bias(impl, fmt):
    """The second expert GEMM's form: bias, then row weight, then add into out[scatter_ids]."""
    m_sizes, T = [6, 0, 9, 5], 7
    N, K, split = SHAPES[fmt]
    x, w, kw, x64, w64, b = make(fmt, m_sizes, N, K, split, tail=4, seed=3)
    ids = torch.randint(0, T, (x.shape[0],), generator=gen(4))
    ids[:3] = 2  # the same target from several rows and groups
    rw = torch.rand(x.shape[0], generator=gen(5)) + 0.5
    base = torch.randn(T, N, generator=gen(6)).to(torch.bfloat16)
    out = base.clone().to(DEV)
    with configs.override(SMALL):
        grouped_gemm(x, w, torch.tensor(m_sizes, dtype=torch.int32, device=DEV),
                     row_weights=rw.to(DEV), scatter_ids=ids.to(DEV), out=out, impl=impl, **kw)
    n = sum(m_sizes)
    ref = base.double().index_add_(0, ids[:n], loop64(x64, w64, m_sizes, bias=b, rw=rw))
    assert_close(out, ref, "bfloat16")


def test_bias_on_unquantized_weights():
    """bias is an epilogue of every format, "none" included (fp32 here: exact sums)."""
    g = gen(9)
    x = torch.randn(13, 40, generator=g)
    w = torch.randn(2, 24, 40, generator=g)
    b = torch.randn(2, 24, generator=g)
    ms = torch.tensor([6, 7], dtype=torch.int32)
    want = torch.cat([x[:6].double() @ w[0].double().T + b[0].double(),
                      x[6:].double() @ w[1].double().T + b[1].double()])
    for impl in ("torch", "triton"):
        with configs.override(SMALL):
            assert_close(grouped_gemm(x.to(DEV), w.to(DEV), ms.to(DEV), bias=b.to(DEV), impl=impl),
                         want, "float32")


def _operands(fmt_name):
    N, K, split = SHAPES[fmt_name]
    x, w, kw, *_ = make(fmt_name, [3, 4], N, K, split, tail=0, device="cpu")
    return x, w, torch.tensor([3, 4], dtype=torch.int32), kw


@pytest.mark.parametrize("fmt,change,match", [
    ("mxfp4", lambda x, w, kw: (x, w[..., :-1].contiguous(), kw), r"w must be \[W, N, 48\]"),
    ("mxfp4", lambda x, w, kw: (x[:, :80].contiguous(), w[..., :40].contiguous(), kw),
     "multiple of 32"),
    ("mxfp4", lambda x, w, kw: (x, w.view(torch.int8), kw), "w must have dtype torch.uint8"),
    ("mxfp4", lambda x, w, kw: (x, w, {**kw, "w_scale": kw["w_scale"].float()}),
     "w_scale must have dtype"),
    ("fp8_w8a16", lambda x, w, kw: (x, w, {**kw, "x_scale": torch.ones(7)}), "x_scale is not used"),
    ("fp8_block", lambda x, w, kw: (x, w, {**kw, "scale_split": None}), "w_scale must have shape"),
    ("fp8_block", lambda x, w, kw: (x, w, {**kw, "x_scale": kw["x_scale"][:, :1].contiguous()}),
     "x_scale must have shape"),
    ("fp8_block", lambda x, w, kw: (x.float(), w, kw), "needs x in float8"),
    ("fp8_w8a16", lambda x, w, kw: (x, w, {**kw, "scale_split": 3}), "scale_split"),
    ("fp8_w8a16", lambda x, w, kw: (x, w, {**kw, "bias": kw["bias"][:, :-1]}), "bias must have"),
])
def test_bad_inputs_raise(fmt, change, match):
    x, w, ms, kw = _operands(fmt)
    x, w, kw = change(x, w, kw)
    with pytest.raises((TypeError, ValueError), match=match):
        grouped_gemm(x, w, ms, **kw)


# ---------------------------------------------------------------- GPU: model-sized shapes

GPU_SHAPES = {  # (format, N, K, split, groups): the expert GEMMs of real checkpoints
    "gpt-oss-120b w13, decode": ("mxfp4", 5760, 2880, None, [1, 0, 2, 1] * 8),
    "gpt-oss-120b w2, prefill": ("mxfp4", 2880, 2880, None, [300, 0, 177, 64] * 4),
    "mixtral tp2 mxfp4 w13, T = 64 (deep K: 256-value steps)": (
        "mxfp4", 7168, 4096, None, [16, 9, 0, 21, 14, 12, 18, 10]),
    "deepseek-v3 w13, decode": ("fp8_block", 4096, 7168, 2048, [1, 0, 0, 3] * 8),
    "deepseek-v3 w2, prefill": ("fp8_block", 7168, 2048, None, [256, 31, 0, 400]),
    "qwen3-30b-a3b-fp8 w13, prefill": ("fp8_block", 1536, 2048, 768, [500, 0, 129, 77] * 2),
    "scout tp8 w8a16 w13, decode": ("fp8_w8a16", 2048, 5120, None, [3, 1, 0, 4]),
    "mixtral tp2 w8a16 w13, T = 64 (32-row tiles, 256-byte K steps)": (
        "fp8_w8a16", 7168, 4096, None, [16, 9, 0, 21, 14, 12, 18, 10]),
    "scout tp8 w8a16 w2, prefill": ("fp8_w8a16", 5120, 1024, None, [1000, 0, 24, 999]),
}


@needs_cuda
@pytest.mark.parametrize("case", list(GPU_SHAPES))
def test_gpu_model_shapes(case):
    """The heuristic's tile choice on model-sized shapes against float64 of the operands."""
    fmt, N, K, split, m_sizes = GPU_SHAPES[case]
    x, w, kw, x64, w64, b = make(fmt, m_sizes, N, K, split, tail=5, seed=1)
    ms = torch.tensor(m_sizes, dtype=torch.int32, device=DEV)
    y = grouped_gemm(x, w, ms, out=poisoned(x.shape[0], N, dtype=torch.bfloat16, device=DEV), **kw)
    n = sum(m_sizes)
    bias = None if b is None else b.to(DEV)  # the float64 products run on the GPU
    assert_close(y[:n], loop64(x64.to(DEV), w64.to(DEV), m_sizes, bias=bias), "bfloat16")
    assert torch.isnan(y[n:].float()).all()


@needs_cuda
@pytest.mark.parametrize("fmt", FORMATS)
def test_gpu_cuda_graph_replay(fmt):
    """Captured once, replayed with other group sizes (all rows in one group, none)."""
    N, K, split = 512, 1024, 256 if fmt == "fp8_block" else None
    G, M = 8, 300
    x, w, kw, x64, w64, b = make(fmt, [M], N, K, split, W=G, tail=0, seed=2)
    ms = torch.zeros(G, dtype=torch.int32, device=DEV)
    out = torch.empty(M, N, dtype=torch.bfloat16, device=DEV)
    grouped_gemm(x, w, ms, out=out, **kw)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        grouped_gemm(x, w, ms, out=out, **kw)
    for sizes in ([50, 0, 70, 1, 0, 100, 9, 3], [0] * 7 + [M], [0] * G):
        ms.copy_(torch.tensor(sizes, dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        n = sum(sizes)
        assert_close(out[:n], loop64(x64, w64, sizes, bias=b), "bfloat16")


# ---------------------------------------------------------------- SwiGLU in the epilogue

GLU_FORMATS = ["none", "fp8_w8a16", "mxfp4"]  # those whose GEMM2 takes a in the model dtype
ACTS = {"silu": ("silu", 1.0, None), "swiglu_oai (limit)": ("swiglu_oai", 1.702, 7.0),
        "silu (limit)": ("silu", 1.0, 1.5)}


def run_glu(impl, fmt_name, m_sizes, act, *, I=20, K=64, tail=3, gather=False, seed=0,
            bias=True):
    """act(gate, up) of each row's products with w's first I rows and its last I (bias and
    scales first) against float64; with gather, the rows come from a shuffled x by x_ids (rows
    no id reaches and ids past the groups: NaN and out of range)."""
    if fmt_name == "none":
        g = gen(seed)
        x = torch.randn(sum(m_sizes) + tail, K, generator=g).to(torch.bfloat16)
        w = (torch.randn(len(m_sizes), 2 * I, K, generator=g) / K**0.5).to(torch.bfloat16)
        b = torch.randn(len(m_sizes), 2 * I, generator=g).to(torch.bfloat16) if bias else None
        x[x.shape[0] - tail:] = float("nan")
        kw = {} if b is None else dict(bias=b.to(DEV))
        x, w, x64, w64 = x.to(DEV), w.to(DEV), x.double(), w.double()
    else:
        x, w, kw, x64, w64, b = make(fmt_name, m_sizes, 2 * I, K, tail=tail, bias=bias,
                                     seed=seed)
    n = sum(m_sizes)
    gate, up = loop64(x64, w64, m_sizes, bias=b).chunk(2, dim=1)
    ref = silu_mul_ref.glu(gate, up, *act)
    if gather:  # the same rows, scattered over a larger x
        perm = torch.randperm(n + 5, generator=gen(seed + 1))[:n]
        src = torch.full((n + 5, K), float("nan"), dtype=x.dtype, device=DEV)
        src[perm.to(DEV)] = x[:n]
        ids = torch.cat([perm, torch.full((tail,), 10**6)]).to(torch.int32).to(DEV)
        x, kw = src, dict(kw, x_ids=ids)
    ms = torch.tensor(m_sizes, dtype=torch.int32, device=DEV)
    out = poisoned(n + tail, I, dtype=torch.bfloat16, device=DEV)
    y = grouped_gemm(x, w, ms, out=out, glu=act, impl=impl, **kw)
    assert_close(y[:n], ref, "bfloat16")
    assert torch.isnan(y[n:].float()).all(), "rows past sum(m_sizes) were written"


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("fmt", GLU_FORMATS)
@pytest.mark.parametrize("act", list(ACTS))
def test_glu_matches_float64(impl, fmt, act):
    with configs.override(SMALL):
        run_glu(impl, fmt, [5, 0, 21, 3], ACTS[act], seed=3)


@pytest.mark.parametrize("fmt", GLU_FORMATS)
@pytest.mark.parametrize("variant", ["pointers", "tma host", "tma device", "swap_ab"])
def test_glu_kernel_variants(fmt, variant):
    """Two weight tiles a step (gate, up) through every load path, with gathered rows; I = 20
    leaves the last tile's halves partial."""
    with configs.override(VARIANTS[variant]):
        run_glu("triton", fmt, [11, 0, 3, 19], ACTS["swiglu_oai (limit)"], gather=True, seed=6)


@pytest.mark.parametrize("fmt", FORMATS)
def test_format_prefill_tiles(fmt):
    """configs.FORMAT_PREFILL_TILES (swapped 128 x 256 tiles for the weight-only formats, 64 x 128
    for fp8_block): groups larger and smaller than a tile, an empty one, scatter-add with row
    weights; with a GLU where the format takes one."""
    with configs.override(configs.FORMAT_PREFILL_TILES[fmt]):
        run("triton", fmt, [150, 0, 37, 260], W=3, weight_ids=[1, 2, 0, 1], row_weights=True,
            seed=9)
        if fmt in GLU_FORMATS:
            run_glu("triton", fmt, [150, 0, 37, 200], ACTS["silu"], I=140, K=128, seed=10)


def test_glu_edge_cases():
    """No rows, one row, no bias, and a tile as wide as I (one tile of halves)."""
    with configs.override(SMALL):
        run_glu("triton", "none", [0, 0], ACTS["silu"], tail=2)
        run_glu("triton", "none", [0, 1], ACTS["silu"], bias=False, gather=True)
        run_glu("triton", "none", [4, 9], ACTS["silu"], I=16)


@pytest.mark.parametrize("change,match", [
    (dict(glu="gelu"), "glu must be one of"),
    (dict(glu="silu", row_weights=torch.ones(6)), "glu needs 16-bit"),
    (dict(glu="silu", scatter_ids=torch.zeros(6, dtype=torch.int32),
          out=torch.empty(6, 8, dtype=torch.bfloat16)), "glu needs 16-bit"),
])
def test_glu_bad_inputs_raise(change, match):
    x = torch.randn(6, 32, dtype=torch.bfloat16)
    w = torch.randn(2, 16, 32, dtype=torch.bfloat16)
    with pytest.raises((TypeError, ValueError), match=match):
        grouped_gemm(x, w, torch.tensor([2, 3], dtype=torch.int32), **change)
    with pytest.raises(ValueError, match="glu needs an even N"):
        grouped_gemm(x, w[:, :15].contiguous(), torch.tensor([2, 3], dtype=torch.int32),
                     glu="silu")


@needs_cuda
@pytest.mark.parametrize("fmt", GLU_FORMATS)
@pytest.mark.parametrize("variant", [
    None,  # the heuristic's own choice
    configs.TileConfig(128, 256, 64, 8, 3, flatten=True),
    configs.TileConfig(128, 256, 64, 8, 3, tma="device"),
    configs.TileConfig(16, 128, 128, 4, 4, swap_ab=True, ctas_per_sm=2),
    configs.TileConfig(16, 128, 128, 4, 4, swap_ab=True, ctas_per_sm=2, run_order=True),
    configs.TileConfig(16, 128, 256, 4, 3, swap_ab=True, ctas_per_sm=3, run_order=True,
                       k_parts=2),
    configs.TileConfig(64, 128, 64, 4, 4, ctas_per_sm=2),
], ids=str)
def test_gpu_glu(fmt, variant):
    """Model-like widths (I = 768 and a partial tile at 700), gathered rows, gpt-oss's GLU."""
    ctx = configs.override(variant) if variant is not None else contextlib.nullcontext()
    with ctx:
        run_glu("triton", fmt, [300, 0, 17, 129, 1, 64], ACTS["silu"], I=768, K=1024,
                gather=True, seed=7)
        run_glu("triton", fmt, [40, 3, 0, 200], ACTS["swiglu_oai (limit)"], I=700, K=512,
                seed=8)


@needs_cuda
@pytest.mark.parametrize("fmt", ["fp8_w8a16", "mxfp4"])
@pytest.mark.parametrize("rows", [8, 16, 32, 64, 128])
def test_gpu_register_operand_tiles_repeat(fmt, rows):
    """The weight-only formats' swapped tiles feed the converted weight tile to the wgmma from
    registers, and Triton 3.6 lets the next K step rewrite registers that in-flight wgmmas read
    (kernel.SWAP_MAX_ROWS: the 256-row form gave garbage on this shape, Qwen3-30B-A3B's down
    GEMM). The tiles select() ships for about 8 to 128 rows a group, 12 runs each, every one
    against float64: a wrong run is this hazard."""
    N, K, G = 2048, 768, 128
    g = torch.Generator("cuda").manual_seed(rows)
    sizes = torch.bincount(torch.randint(0, G, (G * rows,), generator=g, device="cuda"),
                           minlength=G)
    x = torch.randn(G * rows, K, generator=g, device="cuda").to(torch.bfloat16)
    w = (torch.randn(G, N, K, generator=g, device="cuda") / K**0.5).to(torch.bfloat16)
    form = weight_format(fmt)
    wq, ws = form.quantize(w, None)
    w64 = form.dequantize(wq, ws, None).double()
    ends = sizes.cumsum(0).tolist()
    ref = torch.cat([x[e0:e1].double() @ w64[i].T
                     for i, (e0, e1) in enumerate(zip([0] + ends[:-1], ends))])
    tol = tolerance_for(fmt)
    bound = tol.atol * ref.square().mean().sqrt() + tol.rtol * ref.abs()  # compare()'s, on the GPU
    out = poisoned(G * rows, N, dtype=torch.bfloat16, device="cuda")
    for run in range(12):
        out.fill_(float("nan"))
        y = grouped_gemm(x, wq, sizes.to(torch.int32), w_scale=ws, quantization=fmt, out=out)
        assert ((y.double() - ref).abs() <= bound).all(), f"run {run}: wrong or unwritten values"
    assert_close(y, ref, fmt)
