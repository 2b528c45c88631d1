"""GatherMul: the torch reference against a float64 loop, and the Triton kernel (interpreter on the
CPU, the GPU when there is one) against the reference bit for bit, plain and fp8-quantized.
Outputs start poisoned and the ids of rows past num_valid point far out of range, so a row
written or read past num_valid fails."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from shufflemoe.ops import FP8_DTYPE, dequantize_fp8_rowwise, gather_scale
from shufflemoe.ops.gather_scale import kernel
from shufflemoe.ops.quantize.reference import dequantize_fp8_groups, quantize_fp8_groups
from shufflemoe.testing import assert_close, poisoned

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
FP8_POISON = 0xFF  # an e4m3 NaN


def make(T, D, A, dtype, *, weighted=True, n_valid=None, id_dtype=torch.int32, seed=0, device=DEV):
    """x [T, D], ids [A] (rows past n_valid point out of range), weights [A] or None, num_valid."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, D, generator=g).to(dtype)
    ids = torch.randint(0, max(T, 1), (A,), generator=g)
    nv = None
    if n_valid is not None:
        ids[n_valid:] = 10**6  # never read
        nv = torch.tensor([n_valid], dtype=torch.int32, device=device)
    w = torch.rand(A, generator=g) * 2 - 0.5 if weighted else None
    return (x.to(device), ids.to(device=device, dtype=id_dtype),
            None if w is None else w.to(device), nv)


def loop_gather(x, ids, w):
    """float64 rows x[ids[i]] * w[i], one at a time."""
    rows = [x[int(t)].double() * (1.0 if w is None else float(w[i])) for i, t in enumerate(ids)]
    return torch.stack(rows) if rows else torch.empty(0, x.shape[1], dtype=torch.float64)


# ---- the reference against the loop -------------------------------------------------------------

@given(T=st.integers(1, 9), D=st.integers(1, 40), A=st.integers(0, 12),
       dtype=st.sampled_from(DTYPES), weighted=st.booleans(), seed=st.integers(0, 2**16))
def test_reference_matches_loop(T, D, A, dtype, weighted, seed):
    x, ids, w, _ = make(T, D, A, dtype, weighted=weighted, seed=seed, device="cpu")
    out = gather_scale(x, ids, w, impl="torch")
    want = loop_gather(x, ids, w)
    if weighted:  # the float32 product rounded once more to x's dtype
        assert_close(out, want, dtype)
    else:
        assert torch.equal(out, x[ids.long()])
    q, s = gather_scale(x, ids, w, quantize=True, impl="torch")
    assert_close(dequantize_fp8_rowwise(q, s), want, "fp8_rowwise")
    if A:
        amax = want.abs().amax(1).clamp_min(1e-12)
        assert torch.allclose(s.double(), amax / 448, rtol=1e-6, atol=0)


# ---- the kernel against the reference ------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("weighted,n_valid,id_dtype", [(True, 29, torch.int32), (True, None, torch.int64),
                                                       (False, 13, torch.int64)],
                         ids=["weighted-partial", "weighted-all-int64", "plain-partial"])
def test_kernel_bit_exact(dtype, weighted, n_valid, id_dtype):
    T, D, A = 11, 300, 37  # D not a power of two: a masked last column block
    x, ids, w, nv = make(T, D, A, dtype, weighted=weighted, n_valid=n_valid, id_dtype=id_dtype)
    out = gather_scale(x, ids, w, num_valid=nv, out=poisoned(A, D, dtype=dtype, device=DEV),
                       impl="triton")
    n = A if n_valid is None else n_valid
    ref = gather_scale(x, ids[:n], None if w is None else w[:n], impl="torch")
    assert torch.equal(out[:n], ref)
    assert out[n:].isnan().all()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("D", [300, 16400], ids=["one_pass", "two_pass"])
def test_kernel_quantized_bit_exact(dtype, D):
    T, A, n = 7, 9 if D > 1000 else 37, 6 if D > 1000 else 29
    x, ids, w, nv = make(T, D, A, dtype, n_valid=n, seed=D)
    x[ids[0]] = 0.0  # an all-zero row: scale from the 1e-12 floor, q all zero
    q = torch.full((A, D), FP8_POISON, dtype=torch.uint8, device=DEV).view(FP8_DTYPE)
    q, s = gather_scale(x, ids, w, num_valid=nv, quantize=True,
                        out=(q, poisoned(A, dtype=torch.float32, device=DEV)), impl="triton")
    rq, rs = gather_scale(x, ids[:n], w[:n], quantize=True, impl="torch")
    assert torch.equal(q[:n].view(torch.uint8), rq.view(torch.uint8))
    assert torch.equal(s[:n], rs)
    assert (q[n:].view(torch.uint8) == FP8_POISON).all() and s[n:].isnan().all()


def routed(T, k, D, dtype, n_valid, seed):
    """x [T, D] and a Routing's pair order: row i holds pair perm[i] (token perm[i] // k),
    positions its inverse; rows past n_valid are not routed."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, D, generator=g).to(dtype)
    perm = torch.randperm(T * k, generator=g)
    w = torch.rand(T * k, generator=g) * 2 - 0.5
    nv = None if n_valid is None else torch.tensor([n_valid], dtype=torch.int32, device=DEV)
    return (x.to(DEV), (perm // k).int().to(DEV), perm.argsort().to(DEV), w.to(DEV), nv)


@pytest.mark.parametrize("quantize", [False, True, "groups"], ids=["plain", "fp8", "groups"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("k,n_valid,weighted", [(2, None, True), (3, 16, True), (8, 41, False),
                                                (8, None, True), (1, 5, True), (17, 100, True)],
                         ids=["k2", "k3-partial", "k8-partial-plain", "k8", "k1-row-major",
                              "k17-row-major"])
def test_kernel_positions_bit_exact(quantize, dtype, k, n_valid, weighted):
    """With positions, the kernel's rows equal the reference's bit for bit (rows past num_valid
    untouched). Unquantized or fp8 rowwise at 1 < k <= MAX_TOKEN_K it goes token-major and must
    not read token_ids: they are all 0 in that call, so a row-major read would put token 0's row
    everywhere. fp8 rowwise token-major takes one amax a token for its k rows: weights of both
    signs and a zero weight check that it is each row's own."""
    T, D = 7, 300  # a masked last column block
    x, ids, pos, w, nv = routed(T, k, D, dtype, n_valid, seed=k)
    A, n = T * k, T * k if n_valid is None else n_valid
    w = w if weighted else None
    if w is not None:
        w[1] = 0.0  # its row: the scale from the 1e-12 floor, q all zero
    token_major = (1 < k <= kernel.MAX_TOKEN_K if quantize is False else
                   quantize is True and kernel.fp8_token_major(k, x.nbytes, x.device))
    given_ids = torch.zeros_like(ids) if token_major else ids
    if quantize:
        G = -(-D // 128)
        out = (torch.full((A, D), FP8_POISON, dtype=torch.uint8, device=DEV).view(FP8_DTYPE),
               poisoned(*((A, G) if quantize == "groups" else (A,)), dtype=torch.float32,
                        device=DEV))
    else:
        out = poisoned(A, D, dtype=dtype, device=DEV)
    got = gather_scale(x, given_ids, w, num_valid=nv, quantize=quantize, out=out, positions=pos,
                       impl="triton")
    ref = gather_scale(x, ids[:n], None if w is None else w[:n], quantize=quantize, impl="torch")
    if quantize:
        assert torch.equal(got[0][:n].view(torch.uint8), ref[0].view(torch.uint8))
        assert torch.equal(got[1][:n], ref[1])
        assert (got[0][n:].view(torch.uint8) == FP8_POISON).all() and got[1][n:].isnan().all()
    else:
        assert torch.equal(got[:n], ref)
        assert got[n:].isnan().all()


def test_fp8_token_major_rule():
    """fp8 rowwise goes token-major at 8 <= k <= 16, or where x's bytes times k exceed twice the
    L2 (50 MB off CUDA)."""
    cpu, D = torch.device("cpu"), 5120
    x_bytes = lambda T: T * D * 2  # noqa: E731  bf16 rows
    assert not kernel.fp8_token_major(2, x_bytes(2048), cpu)
    assert not kernel.fp8_token_major(4, x_bytes(2048), cpu)
    assert not kernel.fp8_token_major(2, x_bytes(4096), cpu)
    assert kernel.fp8_token_major(4, x_bytes(4096), cpu)
    assert kernel.fp8_token_major(2, x_bytes(8192), cpu)
    assert kernel.fp8_token_major(8, x_bytes(2048), cpu)
    assert not kernel.fp8_token_major(1, x_bytes(16384), cpu)
    assert not kernel.fp8_token_major(17, x_bytes(16384), cpu)


def test_positions_checked():
    x, ids, pos, w, _ = routed(4, 2, 8, torch.float32, None, seed=0)
    with pytest.raises(ValueError, match="positions"):
        gather_scale(x, ids, w, positions=pos[:7])
    with pytest.raises(TypeError, match="positions"):
        gather_scale(x, ids, w, positions=pos.float())
    with pytest.raises(ValueError, match="T \\* k entries"):
        gather_scale(x, ids[:6], w[:6], positions=pos[:6])  # 6 pairs of 4 tokens


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("D", [300, 256, 7], ids=["partial group", "whole groups", "D=7"])
def test_kernel_groups_bit_exact(dtype, D):
    """fp8_block's activations: the same bits as gather_scale's rows quantized by
    quantize_fp8_groups (the two passes this one replaces), and float64 of the rows within the
    format's tolerance; rows past num_valid untouched."""
    T, A, n = 7, 37, 29
    x, ids, w, nv = make(T, D, A, dtype, n_valid=n, seed=D)
    x[ids[0]] = 0.0  # an all-zero row: scales from the 1e-12 floor, q all zero
    G = -(-D // 128)
    q = torch.full((A, D), FP8_POISON, dtype=torch.uint8, device=DEV).view(FP8_DTYPE)
    q, s = gather_scale(x, ids, w, num_valid=nv, quantize="groups",
                        out=(q, poisoned(A, G, dtype=torch.float32, device=DEV)), impl="triton")
    rows = gather_scale(x, ids[:n], w[:n], impl="torch")
    rq, rs = quantize_fp8_groups(rows)
    assert torch.equal(q[:n].view(torch.uint8), rq.view(torch.uint8))
    assert torch.equal(s[:n], rs)
    assert (q[n:].view(torch.uint8) == FP8_POISON).all() and s[n:].isnan().all()
    tq, ts = gather_scale(x, ids[:n], w[:n], quantize="groups", impl="torch")
    assert torch.equal(tq.view(torch.uint8), rq.view(torch.uint8)) and torch.equal(ts, rs)
    assert_close(dequantize_fp8_groups(q[:n], s[:n]), loop_gather(x.cpu(), ids[:n].cpu(),
                                                                  w[:n].cpu()), "fp8_block")


def test_kernel_allocates_and_handles_empty():
    x, ids, w, _ = make(5, 24, 6, torch.bfloat16)
    out = gather_scale(x, ids, w, impl="triton")
    assert out.shape == (6, 24) and torch.equal(out, gather_scale(x, ids, w, impl="torch"))
    q, s = gather_scale(x, ids[:0], w[:0], quantize=True, impl="triton")
    assert q.shape == (0, 24) and q.dtype == FP8_DTYPE and s.shape == (0,)
    zero = torch.zeros(1, dtype=torch.int32, device=DEV)
    out = gather_scale(x, ids, w, num_valid=zero, out=poisoned(6, 24, dtype=torch.bfloat16, device=DEV),
                       impl="triton")
    assert out.isnan().all()


# ---- bad input -----------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,match", [
    (dict(weights=torch.ones(4, dtype=torch.float64)), "weights"),
    (dict(weights=torch.ones(3)), "weights"),
    (dict(num_valid=torch.tensor([1, 2])), "num_valid"),
    (dict(out=torch.empty(4, 7)), "out"),
    (dict(out=torch.empty(4, 8, dtype=torch.bfloat16)), "out"),
    (dict(quantize=True, out=torch.empty(4, 8)), "out"),
    (dict(quantize="groups", out=(torch.empty(4, 8, dtype=FP8_DTYPE), torch.empty(4))),
     "out\\[1\\] must have shape"),
    (dict(quantize="blocks"), "quantize must be one of"),
])
def test_bad_input_raises(kwargs, match):
    x = torch.randn(3, 8)
    with pytest.raises((TypeError, ValueError), match=match):
        gather_scale(x, torch.zeros(4, dtype=torch.int32), **kwargs)
    with pytest.raises(TypeError, match="token_ids"):
        gather_scale(x, torch.zeros(4))


# ---- GPU: the model's width ------------------------------------------------------------------------

@needs_cuda
@pytest.mark.parametrize("quantize", [False, True, "groups"])
def test_gpu_d5120(quantize):
    T, k, D = 2048, 4, 5120
    x, ids, w, nv = make(T, D, T * k, torch.bfloat16, n_valid=T * k - 100)
    got = gather_scale(x, ids, w, num_valid=nv, quantize=quantize, impl="triton")
    n = T * k - 100
    ref = gather_scale(x, ids[:n], w[:n], quantize=quantize, impl="torch")
    if quantize:
        assert torch.equal(got[0][:n].view(torch.uint8), ref[0].view(torch.uint8))
        assert torch.equal(got[1][:n], ref[1])
    else:
        assert torch.equal(got[:n], ref)
