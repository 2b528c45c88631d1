"""ScatterAdd: the torch reference against a float64 loop, and the Triton kernel (interpreter on
the CPU, the GPU when there is one) against both, with the running-error bound (|out| + the
sum of |terms| per element). Rows of y for pairs past num_valid are NaN and their ``rows``
entries point out of range, so reading one fails. The token-major form (``positions``) runs on
pairs in a routed order and must equal its reference bit for bit."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from shufflemoe.ops import scatter_add
from shufflemoe.ops._impl import ops_for
from shufflemoe.testing import assert_close, poisoned

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


def make_routed(T, k, D, dtype, *, weighted=True, n_valid=None, seed=0, device=DEV):
    """(out [T, D], y [A, D], token_ids [A], weights, num_valid, positions [A]) as a Routing
    orders pairs: row i holds pair perm[i] = (token t, choice j) = divmod(perm[i], k), so every
    token has k rows and positions (the inverse of perm) finds them."""
    g = torch.Generator().manual_seed(seed)
    A = T * k
    out = torch.randn(T, D, generator=g).to(dtype)
    y = torch.randn(A, D, generator=g).to(dtype)
    w = torch.rand(A, generator=g) + 0.25 if weighted else None
    perm = torch.randperm(A, generator=g)
    nv = None
    if n_valid is not None:
        nv = torch.tensor([n_valid], dtype=torch.int32)
        y[n_valid:] = float("nan")
    to = lambda t: None if t is None else t.to(device)  # noqa: E731
    return to(out), to(y), to((perm // k).int()), to(w), to(nv), to(perm.argsort().int())


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


@given(T=st.integers(0, 8), k=st.integers(1, 8), D=st.integers(1, 24),
       dtype=st.sampled_from(DTYPES), weighted=st.booleans(), seed=st.integers(0, 2**16),
       cut=st.one_of(st.none(), st.integers(0, 64)))
def test_positions_reference_matches_loop(T, k, D, dtype, weighted, seed, cut):
    """And on the CPU equals the pair-major reference bit for bit: its index_add_ adds a token's
    pairs in ascending position order after out, as the token-major sum does."""
    n_valid = None if cut is None else min(cut, T * k)
    out, y, ids, w, nv, pos = make_routed(T, k, D, dtype, weighted=weighted, n_valid=n_valid,
                                          seed=seed, device="cpu")
    want, mag = loop_scatter(out, y, ids, w, nv, None)
    got = scatter_add(out.clone(), y, ids, w, num_valid=nv, positions=pos, impl="torch")
    assert_close(got, want, dtype, magnitude=mag)
    assert torch.equal(got, scatter_add(out.clone(), y, ids, w, num_valid=nv, impl="torch"))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("T,k,weighted,n_valid", [(13, 1, True, None), (13, 2, True, 17),
                                                  (13, 3, False, 30), (13, 8, True, 61),
                                                  (1, 8, True, 5), (1, 3, False, None)],
                         ids=["k1", "k2-partial", "k3-plain-partial", "k8-partial", "T1-k8-partial",
                              "T1-k3-plain"])
def test_positions_kernel_matches_reference(dtype, T, k, weighted, n_valid):
    """D = 301: two column blocks, the second partial; NaN rows past num_valid."""
    out, y, ids, w, nv, pos = make_routed(T, k, 301, dtype, weighted=weighted, n_valid=n_valid,
                                          seed=T * k)
    want, mag = loop_scatter(out, y, ids, w, nv, None)
    got = scatter_add(out.clone(), y, ids, w, num_valid=nv, positions=pos, impl="triton")
    assert_close(got, want, dtype, magnitude=mag)
    ref = scatter_add(out.clone(), y, ids, w, num_valid=nv, positions=pos, impl="torch")
    assert torch.equal(got, ref)


def test_positions_kernel_int64_empty_and_no_valid_pairs():
    """int64 positions; T = 0; num_valid = 0 with every row of y NaN leaves out as it was."""
    out, y, ids, w, _, pos = make_routed(6, 4, 40, torch.float32)
    want, mag = loop_scatter(out, y, ids, w, None, None)
    got = scatter_add(out.clone(), y, ids, w, positions=pos.long(), impl="triton")
    assert_close(got, want, "float32", magnitude=mag)
    empty = out[:0]
    assert scatter_add(empty, y[:0], ids[:0], positions=pos[:0], impl="triton").shape == (0, 40)
    zero = torch.zeros(1, dtype=torch.int32, device=DEV)
    y.fill_(float("nan"))
    before = out.clone()
    assert torch.equal(scatter_add(out, y, ids, w, num_valid=zero, positions=pos, impl="triton"),
                       before)


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("T,k,n_valid", [(13, 8, 61), (7, 3, None), (1, 1, None)])
def test_token_sum_overwrite_ignores_out(impl, T, k, n_valid):
    """accumulate=False (the layer's combine when nothing else writes out): out = the sum, out's
    old values (NaN here) unread; bit for bit the sum added onto zeros."""
    _, y, ids, w, nv, pos = make_routed(T, k, 301, torch.bfloat16, n_valid=n_valid, seed=T + k)
    ops = ops_for(impl)
    got = ops.token_sum(poisoned(T, 301, dtype=torch.bfloat16, device=DEV), y, pos, w, nv, None,
                        False)
    zeros = torch.zeros(T, 301, dtype=torch.bfloat16, device=DEV)
    want, mag = loop_scatter(zeros, y, ids, w, nv, None)
    assert_close(got, want, "bfloat16", magnitude=mag)
    assert torch.equal(got, ops.token_sum(zeros, y, pos, w, nv, None))


@pytest.mark.parametrize("T,k,n_valid", [(5, 3, 11), (3, 40, 100), (2, 8, None)],
                         ids=["k3-partial", "k40-loop-partial", "k8"])
def test_positions_with_rows_kernel_matches_reference(T, k, n_valid):
    """positions and rows together (how padded, blockwise and EP layouts combine): pair p's row
    sits at rows[p] of a larger y; rows past num_valid point out of range and their y rows are
    NaN. k = 40 runs the kernel's loop (k > 16, the dense decode strategies) instead of the
    unrolled adds; both sum in ascending position, as the reference does, bit for bit."""
    g = torch.Generator().manual_seed(T * k)
    out, y, ids, w, nv, pos = make_routed(T, k, 77, torch.bfloat16, n_valid=n_valid, seed=T + k)
    A, R = T * k, 3 * T * k + 5
    rows = torch.randperm(R, generator=g)[:A].to(DEV)
    big = torch.randn(R, 77, generator=g).to(torch.bfloat16).to(DEV)
    big[rows] = y
    if n_valid is not None:
        big[rows[n_valid:]] = float("nan")
        rows[n_valid:] = R + 1000  # out of range: must not be read
    want, mag = loop_scatter(out, y, ids, w, nv, None)
    got = scatter_add(out.clone(), big, ids, w, num_valid=nv, rows=rows, positions=pos,
                      impl="triton")
    assert_close(got, want, torch.bfloat16, magnitude=mag)
    ref = scatter_add(out.clone(), big, ids, w, num_valid=nv, rows=rows, positions=pos,
                      impl="torch")
    assert torch.equal(got, ref)


@pytest.mark.parametrize("kwargs,match", [
    (dict(y=torch.randn(4, 7)), "columns"),
    (dict(y=torch.randn(3, 8)), "rows"),
    (dict(weights=torch.ones(4).half()), "weights"),
    (dict(rows=torch.zeros(3, dtype=torch.int32)), "rows"),
    (dict(num_valid=torch.tensor(2)), "num_valid"),
    (dict(out=torch.randn(5, 8).t()), "out"),
    (dict(positions=torch.arange(4, dtype=torch.int32)), "positions"),  # A = 4 is not T * k, T = 5
    (dict(positions=torch.arange(3, dtype=torch.int32)), "positions"),
    (dict(positions=torch.arange(4.0)), "positions"),
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


@needs_cuda
def test_gpu_d5120_positions():
    """Token-major on the GPU: no FMA contraction, so the reference's bits."""
    out, y, ids, w, nv, pos = make_routed(2048, 4, 5120, torch.bfloat16, n_valid=2048 * 4 - 77)
    got = scatter_add(out.clone(), y, ids, w, num_valid=nv, positions=pos, impl="triton")
    ref = scatter_add(out.clone(), y, ids, w, num_valid=nv, positions=pos, impl="torch")
    assert torch.equal(got, ref)
