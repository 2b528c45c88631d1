"""CombineShuffling / SplitShuffling: the torch reference against a Python loop over segments, and
the Triton kernel (interpreter on the CPU, the GPU when there is one) against the reference,
exactly. Outputs start poisoned and padding rows of the inputs are NaN, so a row written or read
outside every segment fails."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from shufflemoe.ops import combine_shuffling, split_shuffling
from shufflemoe.testing import poisoned

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")


def make(EP, El, D, *, padded, max_count=4, dtype=torch.float32, seed=0, count_dtype=torch.int32,
         device=DEV):
    """(x [N, D] rank-major with NaN padding rows, counts [EP, El] (segment (0, El-1) empty),
    starts [EP], M = sum(counts))."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, max_count + 1, (EP, El), generator=g)
    counts[0, -1] = 0
    per_rank = counts.sum(1)
    if padded:
        P = int(per_rank.max()) + 2
        starts = torch.arange(EP) * P
        N = EP * P
    else:
        starts = per_rank.cumsum(0) - per_rank
        N = int(per_rank.sum())
    x = torch.full((N, D), float("nan"))
    for r in range(EP):
        n = int(per_rank[r])
        x[int(starts[r]):int(starts[r]) + n] = torch.randn(n, D, generator=g)
    return (x.to(device=device, dtype=dtype), counts.to(device=device, dtype=count_dtype),
            starts.to(device=device, dtype=count_dtype), int(counts.sum()))


def loop_segments(counts, starts):
    """[(rank-major first row, expert-major first row, length)] for every segment."""
    c, s = counts.tolist(), starts.tolist()
    EP, El = len(c), len(c[0]) if c else 0
    segs, em = [], 0
    for e in range(El):
        for r in range(EP):
            segs.append((s[r] + sum(c[r][:e]), em, c[r][e]))
            em += c[r][e]
    return segs


@given(EP=st.integers(1, 5), El=st.integers(1, 5), D=st.integers(1, 9), padded=st.booleans(),
       seed=st.integers(0, 2**16))
def test_reference_matches_loop(EP, El, D, padded, seed):
    x, counts, starts, M = make(EP, El, D, padded=padded, seed=seed, device="cpu")
    out, totals = combine_shuffling(x, counts, starts, out=poisoned(M + 2, D, dtype=x.dtype),
                                    impl="torch")
    back = split_shuffling(out, counts, starts, out=poisoned(x.shape[0], D, dtype=x.dtype),
                           impl="torch")
    assert totals.tolist() == counts.sum(0).tolist() and totals.dtype == torch.int32
    for rm, em, n in loop_segments(counts, starts):
        assert torch.equal(out[em:em + n], x[rm:rm + n])
        assert torch.equal(back[rm:rm + n], x[rm:rm + n])
    assert out[M:].isnan().all()
    assert torch.equal(back.isnan(), x.isnan())  # padding rows stay unwritten


@pytest.mark.parametrize("EP,El,padded,count_dtype", [
    (4, 5, False, torch.int32), (3, 7, True, torch.int64), (1, 1, True, torch.int32),
    (8, 16, False, torch.int64)], ids=["dense", "padded-int64", "one-empty-segment", "ep8-el16"])
def test_kernel_matches_reference(EP, El, padded, count_dtype):
    D = 40
    x, counts, starts, M = make(EP, El, D, padded=padded, count_dtype=count_dtype, seed=EP * El)
    out, totals = combine_shuffling(x, counts, starts, out=poisoned(M + 5, D, dtype=x.dtype, device=DEV),
                                    impl="triton")
    ref, ref_totals = combine_shuffling(x, counts, starts, out_rows=M + 5, impl="torch")
    assert torch.equal(totals, ref_totals)
    assert torch.equal(out[:M], ref[:M]) and out[M:].isnan().all()
    back = split_shuffling(out, counts, starts, out=poisoned(x.shape[0], D, dtype=x.dtype, device=DEV),
                           impl="triton")
    ref_back = split_shuffling(ref, counts, starts, out=poisoned(x.shape[0], D, dtype=x.dtype, device=DEV),
                               impl="torch")
    assert torch.equal(back.nan_to_num(7.0), ref_back.nan_to_num(7.0))
    assert torch.equal(back.isnan(), x.isnan())


def test_kernel_strided_counts_bf16_and_empty():
    x, counts, starts, M = make(3, 4, 24, padded=True, dtype=torch.bfloat16, seed=9)
    strided = counts.t().contiguous().t()  # same values, column-major
    out, _ = combine_shuffling(x, strided, starts, out_rows=M, impl="triton")
    assert torch.equal(out, combine_shuffling(x, counts, starts, out_rows=M, impl="torch")[0])
    zero = torch.zeros_like(counts)
    out, totals = combine_shuffling(x, zero, starts, out=poisoned(3, 24, dtype=x.dtype, device=DEV),
                                    impl="triton")
    assert out.isnan().all() and totals.tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize("kwargs,match", [
    (dict(counts=torch.zeros(2, dtype=torch.int32)), "counts"),
    (dict(starts=torch.zeros(3, dtype=torch.int32)), "starts"),
    (dict(counts=torch.zeros(2, 3)), "counts"),
    (dict(out=torch.empty(4, 5)), "out"),
    (dict(out=None), "out_rows"),
])
def test_bad_input_raises(kwargs, match):
    args = dict(counts=torch.zeros(2, 3, dtype=torch.int32), starts=torch.zeros(2, dtype=torch.int32),
                out=torch.empty(4, 8))
    args.update(kwargs)
    for fn in (combine_shuffling, split_shuffling):
        with pytest.raises((TypeError, ValueError), match=match):
            fn(torch.randn(6, 8), **args)


@needs_cuda
def test_gpu_d5120_padded():
    EP, El, D = 8, 16, 5120
    x, counts, starts, M = make(EP, El, D, padded=True, max_count=64, dtype=torch.bfloat16)
    out, totals = combine_shuffling(x, counts, starts, out_rows=x.shape[0], impl="triton")
    ref, ref_totals = combine_shuffling(x, counts, starts, out_rows=x.shape[0], impl="torch")
    assert torch.equal(totals, ref_totals) and torch.equal(out[:M], ref[:M])
    back = split_shuffling(out, counts, starts, out=x.clone(), impl="triton")
    assert torch.equal(back.nan_to_num(7.0), x.nan_to_num(7.0))
