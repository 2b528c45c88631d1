"""ScatterAdd: the torch reference against a float64 loop, and the Triton kernel (interpreter on
the CPU, the GPU when there is one) against both, with the running-error bound (|out| + the
sum of |terms| per element). Rows of y for pairs past num_valid are NaN and their ``rows``
entries point out of range, so reading one fails."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from shufflemoe.ops import scatter_add
from shufflemoe.testing import assert_close

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def make(T, D, A, dtype, *, weighted=True, n_valid=None, padded=False, seed=0, device=DEV):
    """(out [T, D], y [R, D], token_ids [A], weights, num_valid, rows): k pairs per token in
    random order; with ``padded`` pair i's row of y is rows[i] in a larger y."""
    g = torch.Generator().manual_seed(seed)
    out = torch.randn(T, D, generator=g).to(dtype)
    ids = torch.randint(0, T, (A,), generator=g, dtype=torch.int32)
    w = torch.rand(A, generator=g) + 0.25 if weighted else None
    R = 2 * A + 3 if padded else A
    y = torch.randn(R, D, generator=g).to(dtype)
    rows = torch.randperm(R, generator=g)[:A] if padded else None
    nv = None
    if n_valid is not None:
        nv = torch.tensor([n_valid], dtype=torch.int32)
        src = rows[n_valid:] if padded else torch.arange(n_valid, A)
        y[src] = float("nan")
        if padded:
            rows[n_valid:] = R + 1000  # out of range: must not be read
    to = lambda t: None if t is None else t.to(device)  # noqa: E731
    return to(out), to(y), to(ids), to(w), to(nv), to(rows)


def loop_scatter(out, y, ids, w, nv, rows):
    """(float64 result, magnitude |out| + sum |term|) one pair at a time."""
    acc, mag = out.double().cpu().clone(), out.double().cpu().abs()
    n = len(ids) if nv is None else int(nv)
    for i in range(n):
        src = i if rows is None else int(rows[i])
        term = y[src].double().cpu() * (1.0 if w is None else float(w[i]))
        acc[int(ids[i])] += term
        mag[int(ids[i])] += term.abs()
    return acc, mag


@given(T=st.integers(1, 8), D=st.integers(1, 24), A=st.integers(0, 20), dtype=st.sampled_from(DTYPES),
       weighted=st.booleans(), padded=st.booleans(), seed=st.integers(0, 2**16),
       cut=st.integers(0, 20))
def test_reference_matches_loop(T, D, A, dtype, weighted, padded, seed, cut):
    n_valid = min(cut, A)
    out, y, ids, w, nv, rows = make(T, D, A, dtype, weighted=weighted, n_valid=n_valid,
                                    padded=padded, seed=seed, device="cpu")
    want, mag = loop_scatter(out, y, ids, w, nv, rows)
    got = scatter_add(out.clone(), y, ids, w, num_valid=nv, rows=rows, impl="torch")
    assert_close(got, want, dtype, magnitude=mag)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("weighted,n_valid,padded", [(True, 50, False), (True, None, True),
                                                     (False, 31, True)],
                         ids=["weighted-partial", "weighted-padded", "plain-padded-partial"])
def test_kernel_matches_reference(dtype, weighted, n_valid, padded):
    T, D, A = 13, 300, 57  # repeated tokens: several atomics add into one row
    out, y, ids, w, nv, rows = make(T, D, A, dtype, weighted=weighted, n_valid=n_valid,
                                    padded=padded, seed=A)
    want, mag = loop_scatter(out, y, ids, w, nv, rows)
    got = scatter_add(out.clone(), y, ids, w, num_valid=nv, rows=rows, impl="triton")
    assert_close(got, want, dtype, magnitude=mag)
    ref = scatter_add(out.clone(), y, ids, w, num_valid=nv, rows=rows, impl="torch")
    assert_close(got, ref.double(), dtype, magnitude=mag)


def test_kernel_float32_one_pair_per_token_is_exact():
    T, D = 40, 96
    out, y, _, w, _, _ = make(T, D, T, torch.float32)
    ids = torch.randperm(T, device=DEV).int()
    got = scatter_add(out.clone(), y, ids, w, impl="triton")
    assert torch.equal(got, scatter_add(out.clone(), y, ids, w, impl="torch"))


def test_kernel_extra_rows_of_y_and_empty():
    """rows=None with more rows in y than pairs: the extra rows are not read."""
    out, y, ids, w, _, _ = make(6, 40, 10, torch.float32)
    y = torch.cat([y, torch.full((5, 40), float("nan"), device=DEV)])
    want, mag = loop_scatter(out, y, ids, w, None, None)
    assert_close(scatter_add(out.clone(), y, ids, w, impl="triton"), want, "float32", magnitude=mag)
    before = out.clone()
    assert torch.equal(scatter_add(out, y[:0], ids[:0], impl="triton"), before)
    zero = torch.zeros(1, dtype=torch.int32, device=DEV)
    assert torch.equal(scatter_add(out, y, ids, w, num_valid=zero, impl="triton"), before)


@pytest.mark.parametrize("kwargs,match", [
    (dict(y=torch.randn(4, 7)), "columns"),
    (dict(y=torch.randn(3, 8)), "rows"),
    (dict(weights=torch.ones(4).half()), "weights"),
    (dict(rows=torch.zeros(3, dtype=torch.int32)), "rows"),
    (dict(num_valid=torch.tensor(2)), "num_valid"),
    (dict(out=torch.randn(5, 8).t()), "out"),
])
def test_bad_input_raises(kwargs, match):
    args = dict(out=torch.randn(5, 8), y=torch.randn(4, 8), token_ids=torch.zeros(4, dtype=torch.int32))
    args.update(kwargs)
    with pytest.raises((TypeError, ValueError), match=match):
        scatter_add(**args)


@needs_cuda
def test_gpu_d5120():
    T, k, D = 2048, 4, 5120
    out, y, ids, w, nv, rows = make(T, D, T * k, torch.bfloat16, n_valid=T * k - 77, padded=True)
    got = scatter_add(out.clone(), y, ids, w, num_valid=nv, rows=rows, impl="triton")
    n = T * k - 77
    # The exact sum in float64: the kernel and the bf16 torch reference each round up to k + 1
    # times in their own order, so comparing the two would need twice the bound.
    terms = y[rows[:n].long()].double() * w[:n, None].double()
    ref = out.double().index_add_(0, ids[:n].long(), terms)
    mag = out.double().abs().index_add_(0, ids[:n].long(), terms.abs())
    assert_close(got, ref, torch.bfloat16, magnitude=mag)
