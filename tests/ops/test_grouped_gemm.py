"""Grouped GEMM: the torch reference against an independent float64 loop, and the Triton kernel
(interpreter on the CPU, the GPU when there is one) against float64 of the same, already rounded
or quantized, inputs. Outputs start as NaN (or random values when accumulated into), x's tail
rows as NaN, so an unwritten row, a written tail row, or a read tail row fails."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from shufflemoe.ops import FP8_DTYPE, gather_scale, grouped_gemm, quantize_fp8_rowwise
from shufflemoe.ops.grouped_gemm import configs
from shufflemoe.testing import assert_close, poisoned

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
# Small tiles on the CPU so the interpreter walks several tiles, groups and programs quickly.
SMALL = configs.TileConfig(16, 32, 32, num_warps=4, num_stages=2)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def make_case(m_sizes, N, K, *, dtype=torch.bfloat16, tail=0, W=None, weight_ids=None,
              row_weights=False, seed=0, device=DEV):
    """Inputs of one grouped GEMM (rows of x past sum(m_sizes) are NaN) and their float64 values."""
    g = gen(seed)
    G = len(m_sizes)
    M = sum(m_sizes) + tail
    W = W or G
    x = torch.randn(M, K, generator=g)
    w = torch.randn(W, N, K, generator=g) / K**0.5
    args: dict = {}
    if dtype == FP8_DTYPE:
        xq, xs = quantize_fp8_rowwise(x)
        wq, ws = quantize_fp8_rowwise(w)
        x64 = xq.double() * xs.double()[:, None]
        w64 = wq.double() * ws.double()[..., None]
        args.update(x_scale=xs.to(device), w_scale=ws.to(device))
        x, w = xq, wq
    else:
        x, w = x.to(dtype), w.to(dtype)
        x64, w64 = x.double(), w.double()
    if tail:  # padded rows: NaN, so any use of them shows
        x = x.clone()
        if dtype == FP8_DTYPE:
            x.view(torch.uint8)[M - tail:] = 0x7F  # e4m3 NaN
        else:
            x[M - tail:] = float("nan")
    if weight_ids is not None:
        args["weight_ids"] = torch.tensor(weight_ids, dtype=torch.int32, device=device)
    rw = None
    if row_weights:
        rw = torch.rand(M, generator=g) + 0.5
        args["row_weights"] = rw.to(device)
    ms = torch.tensor(m_sizes, dtype=torch.int32, device=device)
    return x.to(device), w.to(device), ms, args, x64.to(device), w64.to(device), rw


def loop64(x64, w64, m_sizes, weight_ids=None, rw=None):
    """float64 [sum(m_sizes), N] on the CPU: one slice per group (a host loop over groups,
    independent of both impls; the products run where x64 lives)."""
    ys, start = [], 0
    for g, n in enumerate(m_sizes):
        e = g if weight_ids is None else weight_ids[g]
        ys.append(x64[start:start + n] @ w64[e].T)
        start += n
    y = (torch.cat(ys) if ys else torch.zeros(0, w64.shape[1], dtype=torch.float64)).cpu()
    if rw is not None:
        y = y * rw.double().cpu()[: y.shape[0], None]
    return y


def tol(out_dtype):
    return str(out_dtype).replace("torch.", "")


def run_case(impl, m_sizes, N, K, *, dtype=torch.bfloat16, out_dtype=None, tail=3, W=None,
             weight_ids=None, row_weights=False, seed=0, tolerance=None):
    x, w, ms, args, x64, w64, rw = make_case(m_sizes, N, K, dtype=dtype, tail=tail, W=W,
                                             weight_ids=weight_ids, row_weights=row_weights,
                                             seed=seed)
    out_dtype = out_dtype or (torch.bfloat16 if dtype == FP8_DTYPE else dtype)
    out = poisoned(x.shape[0], N, dtype=out_dtype, device=DEV)
    y = grouped_gemm(x, w, ms, out=out, out_dtype=out_dtype, impl=impl, **args)
    assert y.data_ptr() == out.data_ptr()
    n = sum(m_sizes)
    assert_close(y[:n], loop64(x64, w64, m_sizes, weight_ids, rw), tolerance or tol(out_dtype))
    assert torch.isnan(y[n:].float()).all(), "rows past sum(m_sizes) were written"


# ---------------------------------------------------------------- shared cases, both impls

CASES = {
    "three groups, one empty": dict(m_sizes=[5, 0, 21], N=40, K=48),
    "odd N and K": dict(m_sizes=[7, 3, 12], N=37, K=45),
    "G=1": dict(m_sizes=[33], N=24, K=64),
    "all rows in the last group": dict(m_sizes=[0, 0, 0, 19], N=32, K=32),
    "weight_ids (repeated, out of order)": dict(m_sizes=[4, 9, 2, 6], N=32, K=48, W=3,
                                                weight_ids=[2, 0, 2, 1]),
    "row_weights": dict(m_sizes=[6, 11], N=48, K=32, row_weights=True),
    "no tail": dict(m_sizes=[8, 8], N=16, K=16, tail=0),
}


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, FP8_DTYPE], ids=["bf16", "fp8"])
@pytest.mark.parametrize("case", list(CASES))
def test_matches_float64(impl, dtype, case):
    with configs.override(SMALL):
        run_case(impl, dtype=dtype, **CASES[case])


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("dtype,out_dtype", [(torch.float16, torch.float16),
                                             (torch.float32, torch.float32),
                                             (torch.bfloat16, torch.float32)],
                         ids=["fp16", "fp32", "bf16->fp32"])
def test_other_dtypes(impl, dtype, out_dtype):
    # The reference's bf16 torch._grouped_mm rounds to bf16 before widening; the kernel does not.
    tolerance = tol(dtype) if impl == "torch" else tol(out_dtype)
    with configs.override(SMALL):
        run_case(impl, [9, 0, 14], 40, 48, dtype=dtype, out_dtype=out_dtype, row_weights=True,
                 tolerance=tolerance)


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_128_groups(impl):
    g = gen(5)
    m_sizes = torch.randint(0, 3, (128,), generator=g)
    m_sizes[torch.randperm(128, generator=g)[:60]] = 0  # many empty experts
    with configs.override(SMALL):
        run_case(impl, m_sizes.tolist(), 16, 32, tail=2)


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_zero_rows(impl):
    x = torch.randn(0, 32).to(DEV, torch.bfloat16)
    w = torch.randn(3, 16, 32).to(DEV, torch.bfloat16)
    y = grouped_gemm(x, w, torch.zeros(3, dtype=torch.int32, device=DEV), impl=impl)
    assert y.shape == (0, 16) and y.dtype == torch.bfloat16


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_all_rows_padding(impl):
    """sum(m_sizes) == 0 < M: nothing is written."""
    with configs.override(SMALL):
        run_case(impl, [0, 0], 16, 32, tail=9)


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, FP8_DTYPE],
                         ids=["bf16", "fp32", "fp8"])
def test_scatter_add(impl, dtype):
    """Rows scatter-add into out [T, N] with repeated targets; out starts random, not zero."""
    m_sizes, N, K, T = [6, 0, 9, 5], 40, 32, 7
    x, w, ms, args, x64, w64, _ = make_case(m_sizes, N, K, dtype=dtype, tail=4, seed=3)
    n = sum(m_sizes)
    ids = torch.randint(0, T, (x.shape[0],), generator=gen(4))
    ids[:3] = 2  # the same target from several rows and groups
    ids[-2] = 0
    rw = torch.rand(x.shape[0], generator=gen(5)) + 0.5
    out_dtype = torch.float32 if dtype == torch.float32 else torch.bfloat16
    base = torch.randn(T, N, generator=gen(6)).to(out_dtype)
    out = base.clone().to(DEV)
    with configs.override(SMALL):
        y = grouped_gemm(x, w, ms, row_weights=rw.to(DEV), scatter_ids=ids.to(DEV), out=out,
                         out_dtype=out_dtype, impl=impl, **args)
    assert y.data_ptr() == out.data_ptr()
    rows = loop64(x64, w64, m_sizes, rw=rw)
    ref = base.double().index_add_(0, ids[:n], rows)
    assert_close(y, ref, tol(out_dtype))


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, FP8_DTYPE], ids=["bf16", "fp8"])
@pytest.mark.parametrize("scatter", ["add_unique", "store"])
def test_scatter_unique(impl, dtype, scatter):
    """Distinct targets, no atomics: "add_unique" gives the same sums; "store" overwrites the
    rows reached (poisoned with NaN: never read) and leaves the others as they were."""
    m_sizes, N, K = [6, 0, 9, 5], 40, 32
    x, w, ms, args, x64, w64, _ = make_case(m_sizes, N, K, dtype=dtype, tail=4, seed=13)
    n, T = sum(m_sizes), 31
    ids = torch.cat([torch.randperm(T, generator=gen(14))[:n], torch.full((4,), 10**6)])
    rw = torch.rand(x.shape[0], generator=gen(15)) + 0.5
    base = torch.randn(T, N, generator=gen(16)).to(torch.bfloat16)
    rows = loop64(x64, w64, m_sizes, rw=rw)
    if scatter == "store":
        base[ids[:n]] = float("nan")
        ref = base.double().index_copy_(0, ids[:n], rows)
    else:
        ref = base.double().index_add_(0, ids[:n], rows)
    out = base.clone().to(DEV)
    with configs.override(SMALL):
        grouped_gemm(x, w, ms, row_weights=rw.to(DEV), scatter_ids=ids.to(DEV), out=out,
                     scatter=scatter, impl=impl, **args)
    assert_close(out, ref, "bfloat16")
    with pytest.raises(ValueError, match=f"scatter={scatter!r} needs scatter_ids"):
        grouped_gemm(x, w, ms, scatter=scatter, impl=impl, **args)
    with pytest.raises(ValueError, match="scatter must be one of"):
        grouped_gemm(x, w, ms, scatter_ids=ids.to(DEV), out=out, scatter="unique", impl=impl,
                     **args)


def test_scatter_ignores_tail_ids():
    """Tail rows' scatter_ids are never read: out-of-range ids there are harmless (the kernel)."""
    x, w, ms, _, x64, w64, _ = make_case([3, 4], 16, 32, tail=5, seed=8)
    ids = torch.tensor([0, 1, 2, 0, 1, 2, 0] + [10**6] * 5)
    out = torch.randn(3, 16, generator=gen(9)).to(torch.bfloat16)
    ref = out.double().index_add_(0, ids[:7], loop64(x64, w64, [3, 4]))
    out = out.to(DEV)
    with configs.override(SMALL):
        grouped_gemm(x, w, ms, scatter_ids=ids.to(DEV), out=out, impl="triton")
    assert_close(out, ref, "bfloat16")


# ---------------------------------------------------------------- gathered rows


def run_gather(impl, m_sizes, N, K, *, T, dtype=torch.bfloat16, tail=4, seed=0):
    """Rows of x [T, K] gathered by x_ids (repeats, a row never gathered set to NaN, ids past the
    groups out of range): against float64 of the gathered rows, and the same bits as
    gather_scale followed by the GEMM."""
    g = gen(seed)
    n = sum(m_sizes)
    used = torch.randint(0, T - 1, (n,), generator=g)  # row T - 1 is never gathered
    x = torch.randn(T, K, generator=g).to(dtype)
    x[T - 1] = float("nan")
    w = (torch.randn(len(m_sizes), N, K, generator=g) / K**0.5).to(dtype)
    ids = torch.cat([used, torch.full((tail,), 10**6)]).to(torch.int32)
    rows = gather_scale(x, used, impl="torch")
    ms = torch.tensor(m_sizes, dtype=torch.int32, device=DEV)
    out = poisoned(n + tail, N, dtype=dtype, device=DEV)
    y = grouped_gemm(x.to(DEV), w.to(DEV), ms, x_ids=ids.to(DEV), out=out, impl=impl)
    assert_close(y[:n], loop64(rows.double(), w.double(), m_sizes), tol(dtype))
    assert torch.isnan(y[n:].float()).all(), "rows past sum(m_sizes) were written"
    xs = torch.cat([rows, torch.full((tail, K), float("nan"), dtype=dtype)])
    assert torch.equal(y[:n], grouped_gemm(xs.to(DEV), w.to(DEV), ms, impl=impl)[:n])


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_gather(impl, dtype):
    with configs.override(SMALL):
        run_gather(impl, [5, 0, 21, 9], 40, 48, T=17, dtype=dtype, seed=3)


@pytest.mark.parametrize("variant", ["pointers", "tma device", "tma host", "swap_ab tma",
                                     "tail rows tma host"])
def test_gather_kernel_variants(variant):
    """Gathered rows load through pointers whatever the weights take (TMA or not, swapped)."""
    with configs.override(VARIANTS[variant]):
        run_gather("triton", [19, 0, 3, 40], 48, 64, T=30, seed=12)


def test_gather_edge_cases():
    """No rows, one row, every row from one token, and T = 1."""
    with configs.override(SMALL):
        run_gather("triton", [0, 0], 16, 32, T=2, tail=3)
        run_gather("triton", [0, 1], 16, 32, T=2, tail=0)
        run_gather("triton", [7, 6], 24, 32, T=2)


# ---------------------------------------------------------------- kernel variants

VARIANTS = {
    "pointers": SMALL.with_(tma="none"),
    "tma device": SMALL.with_(tma="device"),
    "tma host": SMALL.with_(tma="host"),
    "swap_ab pointers": SMALL.with_(swap_ab=True, tma="none"),
    "swap_ab tma": SMALL.with_(swap_ab=True),
    "block 32x16x16": configs.TileConfig(32, 16, 16, num_stages=2),
    "tail rows tma host": SMALL.with_(tail_m=16),
    "tail rows tma device": SMALL.with_(tail_m=16, tma="device"),
    "tail rows pointers": SMALL.with_(tail_m=16, tma="none"),
    "block 32x16x16, 16 tail rows": configs.TileConfig(32, 16, 16, num_stages=2, tail_m=16),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, FP8_DTYPE], ids=["bf16", "fp8"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_kernel_variants(variant, dtype):
    """Every load path and tile orientation on one shape with an empty group, a partial tile,
    weight_ids, row_weights and NaN tail rows."""
    with configs.override(VARIANTS[variant]):
        run_case("triton", [19, 0, 3, 40], 48, 64, dtype=dtype, W=3, weight_ids=[1, 2, 0, 1],
                 row_weights=True, tail=6, seed=11)


@pytest.mark.parametrize("dtype", [torch.bfloat16, FP8_DTYPE], ids=["bf16", "fp8"])
@pytest.mark.parametrize("scatter", [None, "add", "add_unique", "store"])
def test_tail_rows_at_the_edges(dtype, scatter):
    """Groups of block_m + tail_m rows (one tile), one more (a second tile of one row), twice
    and empty: each row computed once (atomic adds would count a row twice), in every epilogue."""
    sizes, N, K = [32, 33, 16, 17, 0, 1, 48, 49], 24, 64
    x, w, ms, args, x64, w64, _ = make_case(sizes, N, K, dtype=dtype, tail=5, seed=21)
    n = sum(sizes)
    rows = loop64(x64, w64, sizes)
    with configs.override(SMALL.with_(tail_m=16)):
        if scatter is None:
            out = poisoned(x.shape[0], N, dtype=torch.bfloat16, device=DEV)
            grouped_gemm(x, w, ms, out=out, out_dtype=torch.bfloat16, impl="triton", **args)
            assert_close(out[:n], rows, "bfloat16")
            assert torch.isnan(out[n:].float()).all(), "rows past sum(m_sizes) were written"
            return
        T = n + 7
        ids = torch.cat([torch.randperm(T, generator=gen(22))[:n], torch.full((5,), 10**6)])
        base = torch.randn(T, N, generator=gen(23)).to(torch.bfloat16)
        if scatter == "store":
            base[ids[:n]] = float("nan")
            ref = base.double().index_copy_(0, ids[:n], rows)
        else:
            ref = base.double().index_add_(0, ids[:n], rows)
        out = base.clone().to(DEV)
        grouped_gemm(x, w, ms, scatter_ids=ids.to(DEV), out=out, scatter=scatter,
                     impl="triton", **args)
    assert_close(out, ref, "bfloat16")


@pytest.mark.parametrize("bad", [dict(tail_m=24), dict(tail_m=8), dict(tail_m=32),
                                 dict(tail_m=16, swap_ab=True)], ids=str)
def test_tail_rows_must_fit_the_tile(bad):
    """tail_m: a power of two from 16 to block_m, on tiles that are not swapped."""
    x, w, ms, *_ = make_case([5, 9], 16, 32, tail=0)
    with configs.override(SMALL.with_(**bad)), pytest.raises(ValueError, match="tail_m="):
        grouped_gemm(x, w, ms, impl="triton")


@pytest.mark.parametrize("tile", [configs.TileConfig(256, 128, 64, 8, 3, swap_ab=True),
                                  configs.TileConfig(256, 32, 32, 4, 2, swap_ab=True)], ids=str)
def test_swapped_tiles_take_at_most_128_rows(tile):
    """Swapped 256-row tiles gave wrong sums on the GPU (kernel.SWAP_MAX_ROWS): refused, by name;
    the same rows unswapped run."""
    x, w, ms, _, x64, w64, _ = make_case([5, 9], 16, 32, tail=0)
    with configs.override(tile), pytest.raises(ValueError, match="block_m=256 with swap_ab"):
        grouped_gemm(x, w, ms, impl="triton")
    with configs.override(tile.with_(swap_ab=False, num_warps=4, num_stages=2)):
        y = grouped_gemm(x, w, ms, impl="triton")
    assert_close(y, loop64(x64, w64, [5, 9]), "bfloat16")


def test_odd_k_falls_back_to_pointers():
    x = torch.empty(4, 45, dtype=torch.bfloat16)
    w = torch.empty(2, 8, 45, dtype=torch.bfloat16)
    assert kernel_module().tma_mode(SMALL, x, w) == "none"
    assert kernel_module().tma_mode(SMALL, x[:, :40].contiguous(), w[..., :40].contiguous()) \
        == SMALL.tma


def kernel_module():
    from shufflemoe.ops.grouped_gemm import kernel

    return kernel


@settings(max_examples=8 if not CUDA else 30, deadline=None)
@given(data=st.data())
def test_random_shapes(data):
    """Hypothesis-drawn groups, widths and epilogues (bf16 and fp8) against float64."""
    G = data.draw(st.integers(1, 12 if not CUDA else 40), label="G")
    m_sizes = data.draw(st.lists(st.integers(0, 40 if not CUDA else 200), min_size=G, max_size=G))
    fp8 = data.draw(st.booleans(), label="fp8")
    # K * itemsize a multiple of 16 takes the TMA path, anything else the pointer path.
    K = data.draw(st.sampled_from([16, 48, 40, 29] if not CUDA else [64, 256, 1000, 777, 2048]))
    N = data.draw(st.sampled_from([8, 33, 64] if not CUDA else [128, 200, 1280, 2048, 511]))
    W = data.draw(st.integers(1, G + 2))
    wids = data.draw(st.lists(st.integers(0, W - 1), min_size=G, max_size=G))
    kw = dict(dtype=FP8_DTYPE if fp8 else torch.bfloat16, tail=data.draw(st.integers(0, 7)),
              W=W, weight_ids=wids, row_weights=data.draw(st.booleans()),
              seed=data.draw(st.integers(0, 2**16)))
    if CUDA:  # the heuristic's own choice
        run_case("triton", m_sizes, N, K, **kw)
    else:
        with configs.override(SMALL):
            run_case("triton", m_sizes, N, K, **kw)


# ---------------------------------------------------------------- bad inputs


def _ok():
    x = torch.randn(6, 32, dtype=torch.bfloat16)
    return x, torch.randn(2, 16, 32, dtype=torch.bfloat16), torch.tensor([2, 3], dtype=torch.int32)


@pytest.mark.parametrize("bad,match", [
    (lambda x, w, m: grouped_gemm(x, w[:, :, :31], m), "w must be"),
    (lambda x, w, m: grouped_gemm(x, w, m[:1]), "m_sizes must have one entry"),
    (lambda x, w, m: grouped_gemm(x, w, m.float()), "m_sizes must have dtype"),
    (lambda x, w, m: grouped_gemm(x, w.half(), m), "w must have x's dtype"),
    (lambda x, w, m: grouped_gemm(x.to(FP8_DTYPE), w, m), "w must have dtype .*float8"),
    (lambda x, w, m: grouped_gemm(x.to(FP8_DTYPE), w.to(FP8_DTYPE), m), "x_scale must be"),
    (lambda x, w, m: grouped_gemm(x, w, m, x_scale=torch.ones(6)), "x_scale is not used"),
    (lambda x, w, m: grouped_gemm(x, w, m, scatter_ids=torch.zeros(6, dtype=torch.int64)),
     "out .* is required"),
    (lambda x, w, m: grouped_gemm(x, w, m, out=torch.empty(6, 15, dtype=torch.bfloat16)),
     "out must have shape"),
    (lambda x, w, m: grouped_gemm(x, w, m, row_weights=torch.ones(5)), "row_weights must have"),
    (lambda x, w, m: grouped_gemm(x, w, m, weight_ids=torch.zeros(3, dtype=torch.int32)),
     "weight_ids must have shape"),
    (lambda x, w, m: grouped_gemm(x, w, m, out_dtype=torch.int32), "out_dtype must be"),
    (lambda x, w, m: grouped_gemm(x.t(), w, m), "x must be"),
    (lambda x, w, m: grouped_gemm(x, w, m, x_ids=torch.zeros(5)), "x_ids must have dtype"),
    (lambda x, w, m: grouped_gemm(x.to(FP8_DTYPE), w.to(FP8_DTYPE), m, x_scale=torch.ones(6),
                                  w_scale=torch.ones(2, 16), x_ids=torch.zeros(5, dtype=torch.int32)),
     "x_ids gathers 16-bit or float32 rows only"),
])
def test_bad_inputs_raise(bad, match):
    with pytest.raises((TypeError, ValueError), match=match):
        bad(*_ok())


# ---------------------------------------------------------------- tile heuristic


def test_heuristic_is_deterministic_and_overridable():
    a = configs.select(128, 2048, 5120, 16, torch.bfloat16)
    assert a == configs.select(128, 2048, 5120, 16, torch.bfloat16)
    with pytest.raises(AttributeError):
        a.block_m = 7  # frozen
    decode = configs.select(16, 2048, 5120, 16, torch.bfloat16)
    prefill = configs.select(16384, 2048, 5120, 16, torch.bfloat16)
    assert decode.block_m < prefill.block_m
    seen = []
    with configs.override(lambda key: seen.append(key) or SMALL):
        assert configs.select(100, 64, 32, 3, FP8_DTYPE) == SMALL
    assert seen == [(128, 64, 32, 3, FP8_DTYPE)]
    assert configs.select(100, 64, 32, 3, FP8_DTYPE) != SMALL


def test_heuristic_follows_the_gpus_sms():
    # One token on one of 8 experts, N = 7680: 120 weight tiles of 64 columns, fewer than an
    # H100's 132 SMs (each program goes deep) but more than a 114-SM GPU's (two programs an SM).
    deep = configs.select(1, 7680, 4096, 8, torch.bfloat16)
    assert deep == configs.select(1, 7680, 4096, 8, torch.bfloat16, sms=configs.TUNED_SMS)
    assert deep.block_k == 256 and deep.num_stages == 4 and deep.ctas_per_sm == 1
    fewer = configs.select(1, 7680, 4096, 8, torch.bfloat16, sms=114)
    assert fewer.swap_ab and fewer.block_k == 128 and fewer.ctas_per_sm == 2
    # Maverick-like prefill (128 groups of 128 rows): 1024 tiles of 256 columns pass 4 x 132
    # SMs, not 4 x 264.
    wide = configs.select(16384, 2048, 5120, 128, torch.bfloat16)
    assert (wide.block_m, wide.block_n) == (128, 256)
    assert wide.tail_m == configs.TAIL_ROWS and not wide.flatten  # 128 + 32 rows read once
    assert wide.num_stages == 4
    block = configs.select(16384, 2048, 5120, 128, FP8_DTYPE, "fp8_block")
    assert block == configs.FORMAT_PREFILL_TILES["fp8_block"]  # no tail dot: its own tile
    assert configs.select(16384, 2048, 5120, 128, torch.bfloat16, sms=264).block_n == 128


def test_part_filled_mid_bucket_takes_the_swapped_tile():
    # Mixtral TP2 gate_up (8 experts, k = 2): T = 160 / 192 (40 / 48 rows a group) fall in the
    # 64-row bucket with T = 256 but take the swapped 64-row tile of 32 rows a group; 56 and 64
    # rows keep the 128 x 128 tile, as do fp8 and the weight formats' own rules.
    thin = configs.select(256, 14336, 4096, 8, torch.bfloat16)
    assert thin.swap_ab and thin.block_m == 64
    for M in (320, 384):
        assert configs.select(M, 14336, 4096, 8, torch.bfloat16) == thin
    for M in (448, 512):
        full = configs.select(M, 14336, 4096, 8, torch.bfloat16)
        assert (full.block_m, full.block_n, full.swap_ab) == (128, 128, False)
    assert not configs.select(320, 14336, 4096, 8, FP8_DTYPE).swap_ab
    assert configs.select(320, 14336, 4096, 8, torch.bfloat16, "fp8_w8a16") == configs.select(
        512, 14336, 4096, 8, torch.bfloat16, "fp8_w8a16")
    with configs.override(SMALL):
        assert configs.select(320, 14336, 4096, 8, torch.bfloat16) == SMALL


def test_mxfp4_deep_k_takes_longer_k_steps():
    # Mixtral TP2 gate_up at T = 32 (k = 2 over 8 experts: 8 rows a group): swapped 16 x 128 tiles.
    bf16 = configs.select(64, 7168, 4096, 8, torch.bfloat16)
    assert bf16.swap_ab and bf16.block_n == 128 and bf16.block_k == 128
    assert configs.select(64, 7168, 4096, 8, torch.bfloat16, "mxfp4") == bf16.with_(
        block_k=configs.MXFP4_DEEP_BLOCK_K, run_order=True, k_parts=2, ctas_per_sm=3)
    # More tiles than two programs an SM (8 experts x 1 tile expected x 56 columns here) -> two
    # parts a step, three programs an SM (test_three_programs_an_sm); fewer (Llama 4 Scout TP8's
    # gate_up: 16 x 16 tiles; on a 400-SM GPU, 64-column tiles) -> one part.
    scout = configs.select(64, 2048, 5120, 16, torch.bfloat16)
    assert configs.select(64, 2048, 5120, 16, torch.bfloat16, "mxfp4") == scout.with_(
        block_k=configs.MXFP4_DEEP_BLOCK_K, run_order=True)
    assert configs.select(64, 7168, 4096, 8, torch.bfloat16, "mxfp4", sms=400).k_parts == 1
    shallow = configs.select(64, 7168, 2048, 8, torch.bfloat16, "mxfp4")
    assert shallow == bf16.with_(run_order=True, ctas_per_sm=3)  # shallow K: bf16's K step
    # T = 64 (16 rows a group): configs.MXFP4_MID_TILE (test_mxfp4_takes_32_row_tiles_...)
    # T = 128 (32 rows a group): swapped 64-row tiles keep bf16's K step, 5 stages deep.
    wide = configs.select(256, 7168, 4096, 8, torch.bfloat16)
    assert wide.swap_ab and wide.block_m == 64 and wide.block_n == 128
    assert configs.select(256, 7168, 4096, 8, torch.bfloat16, "mxfp4") == wide.with_(
        num_stages=5)
    assert configs.select(256, 7168, 2048, 8, torch.bfloat16, "mxfp4") == wide
    with configs.override(SMALL):  # an override is taken as it is
        assert configs.select(128, 7168, 4096, 8, torch.bfloat16, "mxfp4") == SMALL


@pytest.mark.parametrize("quant", list(configs.FORMAT_PREFILL_TILES))
def test_format_prefill_tiles_past_64_rows_a_group(quant):
    """fp8_block, fp8_w8a16 and mxfp4 take their own tiles where groups average more than 64
    rows (Mixtral TP2 at T = 2048: 512; Qwen3-30B-A3B: 128); below, and for bf16 and fp8
    rowwise, the heuristic's."""
    dtype = FP8_DTYPE if quant == "fp8_block" else torch.bfloat16
    tile = configs.FORMAT_PREFILL_TILES[quant]
    assert configs.select(4096, 14336, 4096, 8, dtype, quant) == tile
    assert configs.select(16384, 1536, 2048, 128, dtype, quant) == tile
    assert configs.select(65 * 8, 14336, 4096, 8, dtype, quant) == tile  # bucket 1024: 128 rows
    mid = (configs.WEIGHT_ONLY_MID_TILE if quant in configs.WEIGHT_ONLY_MID_FORMATS
           else configs._heuristic(512, 14336, 4096, 8, dtype))
    assert configs.select(512, 14336, 4096, 8, dtype, quant) == mid  # 64 rows a group
    assert configs.select(4096, 14336, 4096, 8, dtype) == configs._heuristic(
        4096, 14336, 4096, 8, dtype)
    assert tile.tail_m == 0 and (tile.swap_ab or tile.block_m * tile.block_n <= 64 * 128)
    assert configs.select(4096, 14336, 4096, 8, dtype, quant) != configs._heuristic(
        4096, 14336, 4096, 8, dtype)


def test_mxfp4_run_order_only_on_swapped_16_row_tiles_outside_batch_invariant_mode():
    def run_order(M, quant="mxfp4"):
        return configs.select(M, 7168, 4096, 8, torch.bfloat16, quant).run_order

    assert run_order(64) and run_order(1)  # swapped 16-row tiles
    assert not run_order(128)  # 16 rows a group: MXFP4_MID_TILE, 32 rows in K's order
    assert not run_order(128, "none") and not run_order(128, "fp8_w8a16")
    mid = configs.select(256, 7168, 4096, 8, torch.bfloat16, "mxfp4")  # 32 rows a group
    assert mid.swap_ab and mid.block_m == 64 and not mid.run_order
    assert not run_order(16384)  # prefill tiles
    with configs.batch_invariant():  # the heuristic's tiles to 64 rows, every one in K's order
        assert configs.select(64, 7168, 4096, 8, torch.bfloat16, "mxfp4").swap_ab
        assert not run_order(64) and not run_order(1)


def test_expected_tiles_counts_groups_that_get_rows_and_their_extra_tiles():
    assert configs.expected_tiles(1, 128, 16) == pytest.approx(1.0, rel=0.01)  # one row: a tile
    assert configs.expected_tiles(64, 128, 16) == pytest.approx(128 * (1 - math.exp(-0.5)))
    # Mixtral T = 64 (128 rows over 8 experts, 16 on average): 43% of groups need a second tile.
    assert 11.0 < configs.expected_tiles(128, 8, 16) < 12.0
    # Prefill-sized groups: full tiles and a last one about half full each.
    assert configs.expected_tiles(4096, 8, 16) == pytest.approx(4096 / 16 + 8 / 2, rel=0.005)


@pytest.mark.parametrize("quant, M, N, K, G, parts", [
    ("mxfp4", 64, 1536, 2048, 128, 1),  # Qwen3-30B-A3B gate_up at T = 8: 50 x 12 tiles
    ("mxfp4", 64, 2880, 2880, 128, 1),  # gpt-oss-120b down at T = 16
    ("mxfp4", 16, 5120, 1024, 16, 1),  # Llama 4 Scout TP8 down at T = 16: 10 x 40
    ("mxfp4", 1024, 2048, 5120, 128, 2),  # Maverick TP8 gate_up at T = 1024: in two parts
    ("mxfp4", 64, 2048, 768, 128, 2),  # Qwen3-30B-A3B down at T = 8: 256-value steps, in parts
    ("fp8_w8a16", 64, 2048, 768, 128, 1),  # Qwen3-30B-A3B down at T = 8
    ("fp8_w8a16", 64, 5120, 1024, 128, 1),  # Maverick TP8 down at T = 64
    ("fp8_block", 64, 1536, 2048, 128, 1),  # Qwen3-30B-A3B gate_up at T = 8
    ("fp8_block", 128, 4096, 7168, 8, 1),  # Mixtral TP2 down at T = 64
])
def test_three_programs_an_sm(quant, M, N, K, G, parts):
    """16 x 128 swapped tiles of weight-only formats and fp8_block, more than two an SM: a third
    program an SM (mxfp4 in parts of 128 values, the others at 128-value steps), in a K range a
    format."""
    dtype = FP8_DTYPE if quant == "fp8_block" else torch.bfloat16
    cfg = configs.select(M, N, K, G, dtype, quant)
    assert (cfg.swap_ab, cfg.block_m, cfg.block_n) == (True, 16, 128)
    assert cfg.ctas_per_sm == 3 and cfg.block_k // cfg.k_parts == 128 and cfg.k_parts == parts
    tiles = configs.expected_tiles(M, G, 16) * -(-N // 128)
    more_sms = configs.select(M, N, K, G, dtype, quant, sms=int(tiles // 2) + 1)
    assert more_sms.ctas_per_sm == 2 and more_sms.k_parts == 1  # two an SM hold every tile
    assert configs.select(M, N, K, G, torch.bfloat16).ctas_per_sm == 2  # bf16: smem-bound


@pytest.mark.parametrize("quant, M, N, K, G", [
    ("mxfp4", 64, 1536, 512, 128),  # under 768
    ("fp8_w8a16", 64, 1536, 512, 128),  # under 768
    ("fp8_w8a16", 64, 2048, 5120, 128),  # Maverick TP8 gate_up: its 256-value step wins
    ("mxfp4", 64, 2048, 5120, 16),  # Scout TP8 gate_up at T = 64: 16 x 16 tiles
    ("fp8_rowwise", 64, 1536, 2048, 128),
    ("fp8_block", 16, 2048, 5120, 16),  # Scout TP8 gate_up at T = 8: 64-column tiles
])
def test_two_programs_an_sm_outside_the_rule(quant, M, N, K, G):
    dtype = FP8_DTYPE if quant in ("fp8_rowwise", "fp8_block") else torch.bfloat16
    assert configs.select(M, N, K, G, dtype, quant).ctas_per_sm == 2


def test_w8a16_takes_fp8_bytes_a_k_step_and_wider_tiles_for_full_groups():
    # Mixtral TP2 gate_up at T = 64: 16 rows a group -> 32-row tiles; Scout TP8 at T = 64: 4.
    for M, N, K, G, block_m in ((128, 7168, 4096, 8, 32), (64, 2048, 5120, 16, 16)):
        bf16 = configs.select(M, N, K, G, torch.bfloat16)
        assert bf16.swap_ab and bf16.block_n == 128 and bf16.block_m == 16
        assert configs.select(M, N, K, G, torch.bfloat16, "fp8_w8a16") == bf16.with_(
            block_k=configs.W8A16_BLOCK_K, block_m=block_m)
    few = configs.select(1, 2048, 5120, 16, torch.bfloat16)  # one group: 64-wide deep tiles
    assert configs.select(1, 2048, 5120, 16, torch.bfloat16, "fp8_w8a16") == few


@pytest.mark.parametrize("quant", configs.WEIGHT_ONLY_MID_FORMATS)
def test_weight_only_formats_keep_swapped_64_row_tiles_to_64_rows_a_group(quant):
    """33 to 64 rows a group (Mixtral TP2 gate_up at T = 256, Qwen3-30B-A3B down at T = 1024):
    the swapped 64-row tile where bf16 takes an unswapped one (mxfp4 without its 5 stages at
    deep K); not for one group (a shared expert) nor past 64 rows."""
    mixtral = configs.select(512, 14336, 4096, 8, torch.bfloat16)
    assert (mixtral.block_m, mixtral.swap_ab) == (128, False)
    tile = configs.WEIGHT_ONLY_MID_TILE
    assert configs.select(512, 14336, 4096, 8, torch.bfloat16, quant) == tile
    assert configs.select(8192, 2048, 768, 128, torch.bfloat16, quant) == tile
    assert not configs.select(8192, 2048, 768, 128, torch.bfloat16).swap_ab
    assert configs.select(64, 2048, 5120, 1, torch.bfloat16, quant) != tile
    assert configs.select(1024, 14336, 4096, 8, torch.bfloat16, quant) == (
        configs.FORMAT_PREFILL_TILES[quant])


@pytest.mark.parametrize("M, N, K, G, mid", [
    (1024, 2048, 5120, 16, False),  # Scout TP8 gate_up at T = 1024: 16 x 16 = 256 weight tiles
    (512, 4096, 7168, 8, False),  # Mixtral TP2 down at T = 256: 8 x 32
    (1024, 5120, 1024, 16, True),  # Scout's down: 640
    (512, 14336, 4096, 8, True),  # Mixtral's gate_up: 896
    (8192, 2048, 5120, 128, True),  # Maverick TP8 gate_up at T = 8192: 2048
])
def test_mxfp4_mid_tile_only_past_two_weight_tiles_an_sm(M, N, K, G, mid):
    """mxfp4 at 33-64 rows a group keeps the heuristic's tile where the groups' weight tiles
    fill no more than two programs an SM; fp8_w8a16 takes the mid tile either way."""
    tile = configs.WEIGHT_ONLY_MID_TILE
    got = configs.select(M, N, K, G, torch.bfloat16, "mxfp4")
    assert (got == tile) == mid
    if not mid:
        assert got == configs.select(M, N, K, G, torch.bfloat16)
    assert configs.select(M, N, K, G, torch.bfloat16, "fp8_w8a16") == tile
    # the count scales with the GPU's SMs: fewer SMs, more tiles an SM
    assert configs.select(M, N, K, G, torch.bfloat16, "mxfp4", sms=100) == tile


def test_w8a16_keeps_the_swapped_64_row_tile_from_17_rows_a_group():
    # Mixtral TP2 gate_up: T = 128 (32 rows a group) the heuristic's tile; T = 64 (16) 32 rows.
    assert configs.select(256, 14336, 4096, 8, torch.bfloat16, "fp8_w8a16") == configs.select(
        256, 14336, 4096, 8, torch.bfloat16) == configs.WEIGHT_ONLY_MID_TILE
    assert configs.select(128, 14336, 4096, 8, torch.bfloat16, "fp8_w8a16").block_m == 32


@pytest.mark.parametrize("M, N, K, G, mid", [
    (128, 14336, 4096, 8, True),  # Mixtral TP2 gate_up at T = 64: 16 rows a group
    (2048, 1536, 2048, 128, True),  # Qwen3-30B-A3B gate_up at T = 256: 16
    (256, 5120, 1024, 16, True),  # Llama 4 Scout TP8 down at T = 256: 16
    (96, 5120, 1024, 16, False),  # 6 rows a group: the bucket of 128 holds 8 a group
    (64, 2048, 5120, 16, False),  # Scout TP8 gate_up at T = 64: 4
    (16, 2048, 5120, 1, False),  # one group (a shared expert): 16 rows in one tile
])
def test_mxfp4_takes_32_row_tiles_for_groups_of_9_to_16_rows(M, N, K, G, mid):
    cfg = configs.select(M, N, K, G, torch.bfloat16, "mxfp4")
    assert (cfg == configs.MXFP4_MID_TILE) == mid
    assert cfg.swap_ab and cfg.block_m == (32 if mid else 16) and cfg.run_order != mid
    with configs.batch_invariant():  # K's order: the same tile, no run order either way
        assert configs.select(M, N, K, G, torch.bfloat16, "mxfp4").run_order is False


@pytest.mark.parametrize("M,bucket", [(0, 1), (1, 1), (2, 2), (128, 128), (129, 256),
                                      (16383, 16384)])
def test_m_bucket(M, bucket):
    assert configs.m_bucket(M) == bucket


@pytest.mark.parametrize("dtype", [torch.bfloat16, FP8_DTYPE])
def test_decode_tiles_go_deep_when_few_groups_are_active(dtype):
    """One token on one of 16 experts: fewer weight tiles than SMs, so each program keeps more of
    its tile in flight (deeper K steps) than when many groups share the SMs."""
    one = configs.select(1, 2048, 5120, 16, dtype)
    eight = configs.select(8, 2048, 5120, 16, dtype)
    full = configs.select(128, 2048, 5120, 16, dtype)

    def in_flight(c):
        return c.block_n * c.block_k * c.num_stages

    assert in_flight(one) > in_flight(eight)
    assert one.swap_ab and eight.swap_ab and full.swap_ab
    assert one.block_n <= eight.block_n < full.block_n


@pytest.mark.parametrize("M", [1, 16, 128, 1024, 16384])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, FP8_DTYPE])
def test_heuristic_tiles_are_valid(M, dtype):
    """Powers of two, dot-sized (>= 16), TMA boxes <= 256, within shared memory estimates."""
    c = configs.select(M, 2048, 5120, 16, dtype)
    for b in (c.block_m, c.block_n, c.block_k):
        assert b >= 16 and b & (b - 1) == 0
    assert max(c.block_m, c.block_n) <= 256 and (c.block_k <= 256 or c.tma == "none")
    item = 4 if dtype == torch.float32 else dtype.itemsize
    stage = (c.block_m + c.block_n) * c.block_k * item
    assert stage * c.num_stages * c.ctas_per_sm <= 227 * 1024


# ---------------------------------------------------------------- GPU only


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, FP8_DTYPE], ids=["bf16", "fp8"])
def test_cuda_graph_replay_with_new_sizes(dtype):
    """Captured once; m_sizes rewritten on the device between replays (empty, all in one group)."""
    G, N, K, M = 8, 256, 512, 400
    x, w, _, args, x64, w64, _ = make_case([M], N, K, dtype=dtype, W=G, seed=2)
    ms = torch.zeros(G, dtype=torch.int32, device=DEV)
    out = torch.empty(M, N, dtype=torch.bfloat16, device=DEV)
    grouped_gemm(x, w, ms, out=out, **args)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        grouped_gemm(x, w, ms, out=out, **args)
    for sizes in ([50, 0, 70, 1, 0, 200, 9, 3], [0] * 7 + [M], [0] * G, [M // G] * G):
        ms.copy_(torch.tensor(sizes, dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        n = sum(sizes)
        assert_close(out[:n], loop64(x64, w64, sizes), "bfloat16")
        assert torch.isnan(out[n:].float()).all()


@needs_cuda
@pytest.mark.parametrize("variant", [
    configs.TileConfig(128, 256, 64, 8, 3, flatten=True),
    configs.TileConfig(128, 256, 64, 8, 3, tma="device"),
    configs.TileConfig(128, 128, 64, 4, 4, ctas_per_sm=2, flatten=True, tma="device"),
    configs.TileConfig(128, 128, 64, 8, 3, tma="none"),
    configs.TileConfig(16, 128, 128, 4, 4, swap_ab=True, ctas_per_sm=2),
    configs.TileConfig(16, 64, 256, 4, 3, swap_ab=True, flatten=True),
    configs.TileConfig(16, 128, 128, 4, 3, tma="none", swap_ab=True),
    configs.TileConfig(16, 32, 128, 4, 5, ctas_per_sm=2),
    configs.TileConfig(32, 128, 64, 4, 4, swap_ab=True, ctas_per_sm=2),
    configs.TileConfig(64, 128, 64, 4, 4, ctas_per_sm=2),
    configs.TileConfig(64, 128, 128, 4, 3, swap_ab=True, ctas_per_sm=2),
    configs.TileConfig(16, 128, 256, 4, 3, swap_ab=True, ctas_per_sm=3, k_parts=2),
    configs.TileConfig(16, 128, 256, 4, 3, tma="none", swap_ab=True, k_parts=2),
    configs.TileConfig(128, 256, 64, 8, 4, tail_m=32),
    configs.TileConfig(128, 256, 64, 8, 3, tail_m=16, tma="device"),
    configs.TileConfig(128, 128, 64, 8, 3, tail_m=64, tma="none"),
    configs.TileConfig(128, 256, 64, 8, 3, flatten=True, tail_m=32),
], ids=str)
@pytest.mark.parametrize("dtype", [torch.bfloat16, FP8_DTYPE], ids=["bf16", "fp8"])
def test_gpu_variants(variant, dtype):
    """TMA (device and host descriptors) and pointer loads, flattened loops, swapped operands."""
    with configs.override(variant.with_(block_k=2 * variant.block_k) if dtype == FP8_DTYPE
                          and variant.block_k < 128 else variant):
        run_case("triton", [300, 0, 17, 129, 1, 64], 640, 1024, dtype=dtype, W=4,
                 weight_ids=[3, 0, 1, 2, 3, 0], row_weights=True, tail=11, seed=4)


@needs_cuda
@pytest.mark.parametrize("variant", [
    configs.TileConfig(128, 256, 64, 8, 3, flatten=True),
    configs.TileConfig(128, 256, 64, 8, 3, tma="device"),
    configs.TileConfig(128, 128, 64, 8, 3, tma="none"),
    configs.TileConfig(16, 128, 128, 4, 4, swap_ab=True, ctas_per_sm=2),
    configs.TileConfig(64, 128, 64, 4, 4, ctas_per_sm=2),
    configs.TileConfig(128, 256, 64, 8, 4, tail_m=32),
], ids=str)
def test_gpu_gather(variant):
    """Gathered rows under the tiles prefill and the middle sizes take."""
    with configs.override(variant):
        run_gather("triton", [300, 0, 17, 129, 1, 64], 640, 1024, T=400, tail=11, seed=5)


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, FP8_DTYPE], ids=["bf16", "fp8"])
def test_gpu_scatter_many_pairs(dtype):
    """Top-8 style: 8 rows per output token, bf16 atomics."""
    T, k, E, N, K = 300, 8, 16, 512, 256
    ids = torch.stack([torch.randperm(E, generator=gen(t))[:k] for t in range(T)]).flatten()
    order = torch.argsort(ids, stable=True)
    m_sizes = torch.bincount(ids, minlength=E).tolist()
    x, w, ms, args, x64, w64, _ = make_case(m_sizes, N, K, dtype=dtype, tail=0, seed=9)
    tokens = (order // k)
    rw = torch.rand(T * k, generator=gen(3))
    base = torch.randn(T, N, generator=gen(2)).to(torch.bfloat16)
    out = base.to(DEV)
    grouped_gemm(x, w, ms, row_weights=rw.to(DEV), scatter_ids=tokens.to(DEV), out=out, **args)
    ref = base.double().index_add_(0, tokens, loop64(x64, w64, m_sizes, rw=rw))
    assert_close(out, ref, "bfloat16")


@pytest.mark.parametrize("parts", [0, 3, 4])
def test_k_parts_must_cut_the_step_into_whole_groups(parts):
    """A step of 64 values in 0, 3 or 4 parts (4: 16 values, less than an mxfp4 scale group)."""
    from shufflemoe.ops.quantize import quantize_mxfp4

    x = torch.randn(4, 128).to(torch.bfloat16).to(DEV)
    w, ws = quantize_mxfp4(torch.randn(2, 32, 128).to(DEV))
    bad = configs.TileConfig(16, 32, 64, num_stages=2, swap_ab=True, k_parts=parts)
    with configs.override(bad), pytest.raises(ValueError, match=f"k_parts={parts}"):
        grouped_gemm(x, w, torch.tensor([1, 3], dtype=torch.int32, device=DEV), w_scale=ws,
                     quantization="mxfp4", impl="triton")
