"""The router's logits at decode sizes (ops/router): the one-launch Triton GEMV (interpreter on
the CPU, the GPU when there is one) against float64, rounded once: every logit within one step
of its dtype of the exactly rounded value and nearly all equal to it; the bias added before the
rounding; F.linear past uses_kernel; the output starts poisoned."""

from __future__ import annotations

import pytest
import torch

from shufflemoe.ops import ops_for
from shufflemoe.ops.router import GEMV_MAX_PRODUCTS, GEMV_MAX_TOKENS, uses_kernel
from shufflemoe.ops.router import kernel
from shufflemoe.testing import poisoned

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"


def check(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None,
          dtype: torch.dtype | None = None) -> None:
    """Logits in ``dtype`` (default: x's) within one step of it of the exactly rounded logit,
    plus what an fp32 sum of D products may lose (nothing a bf16 step sees); from bf16 inputs
    (exact fp32 products) nearly every bf16 logit is the exactly rounded one."""
    ref = x.double() @ w.double().t() + (0.0 if bias is None else bias.double())
    want = ref.to(got.dtype)  # rounded once, to nearest even
    assert got.dtype == (dtype or x.dtype) and got.shape == ref.shape
    assert not torch.isnan(got).any(), "a logit was not written"
    step = (want.double().abs() * torch.finfo(got.dtype).eps).clamp_min(2.0 ** -126)
    mag = x.double().abs() @ w.double().abs().t()
    sum_err = 2 * x.shape[1] ** 0.5 * torch.finfo(torch.float32).eps * mag
    off = (got.double() - want.double()).abs()
    assert bool((off <= step * 1.001 + sum_err).all()), float((off / step).max())
    if got.dtype != torch.float32:
        assert float((got == want).double().mean()) >= 0.98


@pytest.mark.parametrize("T,E,D", [(1, 16, 5120), (2, 7, 130), (3, 128, 64), (5, 1, 40),
                                   (8, 256, 72), (1, 8, 4096), (17, 16, 200), (40, 8, 96),
                                   (64, 128, 64)])  # past 8: blocks of TOKEN_BLOCK tokens, a tail
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_kernel_matches_float64(T, E, D, bias, dtype):
    g = torch.Generator().manual_seed(T * 1000 + E + D)
    x = torch.randn(T, D, generator=g).to(DEV, dtype)
    w = (torch.randn(E, D, generator=g) / D**0.5).to(DEV, dtype)
    b = torch.randn(E, generator=g).to(DEV, dtype) if bias else None
    out = poisoned(T, E, dtype=dtype, device=DEV)
    kernel._router_op(x, w, b, out)
    check(out, x, w, b)


@pytest.mark.parametrize("T,E,D,programs", [(40, 12, 200, 4), (17, 7, 96, 1), (64, 128, 64, 128)])
@pytest.mark.parametrize("bias", [False, True])
def test_programs_over_several_experts(monkeypatch, T, E, D, programs, bias):
    """Past kernel.PROGRAMS programs a program takes a block of experts (experts_per_program: a
    power of two, the last block cut at E: 12 experts in blocks of 8, 7 in one of 8): every
    logit written, within float64's bound, and the same bits as one expert a program."""
    g = torch.Generator().manual_seed(T + E + D)
    x = torch.randn(T, D, generator=g).to(DEV, torch.bfloat16)
    w = (torch.randn(E, D, generator=g) / D**0.5).to(DEV, torch.bfloat16)
    b = torch.randn(E, generator=g).to(DEV, torch.bfloat16) if bias else None
    one = poisoned(T, E, dtype=torch.bfloat16, device=DEV)
    kernel._router_op(x, w, b, one)
    monkeypatch.setattr(kernel, "PROGRAMS", programs)
    monkeypatch.setattr(kernel, "EXPERTS_MAX", 8)
    assert kernel.experts_per_program(T, E) == 8
    blocked = poisoned(T, E, dtype=torch.bfloat16, device=DEV)
    kernel._router_op(x, w, b, blocked)
    check(blocked, x, w, b)
    assert torch.equal(blocked, one)


def test_strided_rows_and_no_tokens():
    """Rows of x and of the router weight with a stride (slices of wider rows) read right; a
    weight or bias whose columns are strided goes to F.linear; T = 0 writes nothing."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 96, generator=g).to(DEV, torch.bfloat16)[:, :80]
    w = (torch.randn(16, 112, generator=g) / 9).to(DEV, torch.bfloat16)[:, 8:88]
    out = poisoned(4, 16, dtype=torch.bfloat16, device=DEV)
    kernel._router_op(x, w, None, out)
    check(out, x, w, None)
    check(kernel.router_logits(x, w, None), x, w, None)
    wt = w.t().contiguous().t()  # [E, D] with column stride E
    b = torch.randn(32, generator=g).to(DEV, torch.bfloat16)[::2]
    for ww, bb in ((wt, None), (w, b)):
        assert torch.equal(kernel.router_logits(x, ww, bb), torch.nn.functional.linear(x, ww, bb))
    empty = kernel.router_logits(x[:0], w, None)
    assert empty.shape == (0, 16)


@pytest.mark.parametrize("T,E,D", [(1, 64, 4200), (3, 8, 130), (40, 8, 96), (40, 256, 64)])
@pytest.mark.parametrize("bias", [False, True])
def test_float32_logits_of_bf16_inputs(T, E, D, bias):
    """Float32 logits of bf16 x, weight and bias (MoEConfig.router_logits_dtype: DeepSeek-V3's
    F.linear(x.float(), w.float())): the kernel sums the exact fp32 upcasts of them as stored
    (no cast, of the weight least), within an fp32 sum's error of float64; past the GEMV
    (40 x 256) F.linear of the casts, bit for bit. Both entries."""
    g = torch.Generator().manual_seed(T + E + D)
    x = torch.randn(T, D, generator=g).to(DEV, torch.bfloat16)
    w = (torch.randn(E, D, generator=g) / D**0.5).to(DEV, torch.bfloat16)
    b = torch.randn(E, generator=g).to(DEV, torch.bfloat16) if bias else None
    casts = torch.nn.functional.linear(x.float(), w.float(), None if b is None else b.float())
    for impl in ("triton", "torch"):
        got = ops_for(impl).router_logits(x, w, b, torch.float32)
        check(got, x, w, b, torch.float32)
        if impl == "torch" or not uses_kernel(T, E):
            assert torch.equal(got, casts)
    check(kernel.invariant_router_logits(x, w, b, torch.float32), x, w, b, torch.float32)
    out = poisoned(T, E, dtype=torch.float32, device=DEV)
    kernel._router_op(x, w, b, out)
    check(out, x, w, b, torch.float32)


def test_ops_entry_switches_to_f_linear_past_the_gemv():
    """Ops.router_logits: the kernel up to GEMV_MAX_TOKENS tokens whatever E, and past them while
    E x T <= GEMV_MAX_PRODUCTS; F.linear (bit for bit) beyond."""
    g = torch.Generator().manual_seed(5)
    for E in (32, 4096):
        w = (torch.randn(E, 64, generator=g) / 8).to(DEV, torch.bfloat16)
        last = max(GEMV_MAX_TOKENS, GEMV_MAX_PRODUCTS // E)
        assert uses_kernel(last, E) and not uses_kernel(last + 1, E)
        for T in (last, last + 1):
            x = torch.randn(T, 64, generator=g).to(DEV, torch.bfloat16)
            got = ops_for("triton").router_logits(x, w, None)
            check(got, x, w, None)
            if T > last:
                assert torch.equal(got, torch.nn.functional.linear(x, w))
    assert torch.equal(ops_for("torch").router_logits(x, w, None),
                       torch.nn.functional.linear(x, w))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("D", [8200, 200])  # D steps of 2048; one step (rows converted once)
def test_invariant_logits_keep_their_bits_in_any_batch(dtype, bias, D):
    """invariant_router_logits (batch-invariant mode): one tile at every T, so a row's logits are
    the same bits alone, at another position of a small batch and in a batch past F.linear's
    switch; every logit within check()'s bound of float64. The default launch's tiles follow T
    (T = 1 sums 4096 columns a step, T = 8 2048): the same rows differ there, so the comparison
    can fail."""
    g = torch.Generator().manual_seed(11)
    E, T = 16, 40  # E x T past GEMV_MAX_PRODUCTS's T for the default entry: F.linear
    x = torch.randn(T, D, generator=g).to(DEV, dtype)
    w = (torch.randn(E, D, generator=g) / D**0.5).to(DEV, dtype)
    b = torch.randn(E, generator=g).to(DEV, dtype) if bias else None
    rows = [0, 13, 39]
    alone = torch.cat([kernel.invariant_router_logits(x[i:i + 1], w, b) for i in rows])
    small = kernel.invariant_router_logits(x[[5, *rows[::-1]]], w, b)[1:].flip(0)
    whole = kernel.invariant_router_logits(x, w, b)
    check(whole, x, w, b)
    assert torch.equal(alone, small) and torch.equal(alone, whole[rows])
    if dtype == torch.float32 and not bias and D > 4096:
        default_alone = torch.cat([kernel.router_logits(x[i:i + 1], w, None) for i in rows])
        default_in_8 = torch.cat([kernel.router_logits(x[i:i + 8], w, None)[:1] for i in rows])
        assert not torch.equal(default_alone, default_in_8)
