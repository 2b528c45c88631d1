"""FP8 rowwise quantization: the torch reference against its float64 definition, and the Triton
rounding helpers the fused kernels use (integer e4m3 / bf16 rounding, row scales) against torch's
own casts, bit for bit, on every e4m3 rounding boundary."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from shufflemoe.ops import FP8_DTYPE, FP8_MAX, dequantize_fp8_rowwise, quantize_fp8_rowwise
from shufflemoe.testing import assert_close

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"


@given(M=st.integers(1, 6), K=st.integers(1, 50), dtype=st.sampled_from([torch.float32, torch.bfloat16]),
       log_scale=st.floats(-20, 20), seed=st.integers(0, 2**16))
def test_reference_matches_definition(M, K, dtype, log_scale, seed):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(M, K, generator=g) * 2.0**log_scale).to(dtype)
    q, s = quantize_fp8_rowwise(x)
    x64 = x.double()
    amax = x64.abs().amax(1).clamp_min(1e-12)
    assert q.dtype == FP8_DTYPE and s.dtype == torch.float32
    assert torch.allclose(s.double(), amax / FP8_MAX, rtol=2**-23, atol=0)
    assert (q.float().abs().amax(1) == FP8_MAX).all()  # the row maximum maps to +-448
    # every value is the nearest e4m3 of x / scale, up to the float32 roundings of 448 / amax
    assert_close(dequantize_fp8_rowwise(q, s), x64, "fp8_rowwise")
    step = torch.where(q.float().abs() < 2**-6, 2.0**-9, q.float().abs() * 2**-3)
    assert ((q.double() - x64 / s.double()[:, None]).abs() <= step * 0.5 * (1 + 1e-5)).all()


def test_reference_zero_rows_and_shapes():
    x = torch.randn(2, 3, 5)
    x[1, 2] = 0.0
    q, s = quantize_fp8_rowwise(x)
    assert q.shape == (2, 3, 5) and s.shape == (2, 3)
    assert (q[1, 2].float() == 0).all() and s[1, 2] == torch.tensor(1e-12) / FP8_MAX


@pytest.mark.parametrize("x,match", [
    (torch.zeros(3, dtype=torch.int32), "float"),
    (torch.zeros(3, 0), "non-empty"),
    (torch.zeros(3, 4).to(FP8_DTYPE), "float"),
    ([1.0, 2.0], "Tensor"),
])
def test_bad_input_raises(x, match):
    with pytest.raises((TypeError, ValueError), match=match):
        quantize_fp8_rowwise(x)


# ---- the Triton helpers ----------------------------------------------------------------------------

triton = pytest.importorskip("triton")
tl = triton.language
from shufflemoe.ops.quantize.kernel import e4m3_bits, row_scales, to_bf16_rne  # noqa: E402


@triton.jit
def _helpers_kernel(x_ptr, e4m3_ptr, bf16_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    v = tl.load(x_ptr + offs, mask=m, other=0.0)
    y = tl.clamp(v, -448.0, 448.0, propagate_nan=tl.PropagateNan.ALL)
    tl.store(e4m3_ptr + offs, e4m3_bits(y).to(tl.uint8), mask=m)
    tl.store(bf16_ptr + offs, to_bf16_rne(v), mask=m)


@triton.jit
def _scales_kernel(amax_ptr, inv_ptr, scale_ptr, N, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    m = offs < N
    inv, scale = row_scales(tl.load(amax_ptr + offs, mask=m, other=1.0))
    tl.store(inv_ptr + offs, inv, mask=m)
    tl.store(scale_ptr + offs, scale, mask=m)


def boundary_values() -> torch.Tensor:
    """Every finite e4m3 value, every midpoint between neighbours and the floats on either side
    of it, random values over many binades, and float32 values halfway between bfloat16s."""
    v = torch.arange(256, dtype=torch.uint8).view(FP8_DTYPE).float()
    v = v[torch.isfinite(v)].unique()
    mid = (v[1:] + v[:-1]) / 2
    up, down = torch.full_like(mid, 1e30), torch.full_like(mid, -1e30)
    g = torch.Generator().manual_seed(0)
    rnd = torch.randn(4000, generator=g) * torch.exp2(torch.randint(-30, 12, (4000,), generator=g).float())
    bf = torch.randn(1000, generator=g).to(torch.bfloat16).float()
    bf_mid = bf + bf.abs() * 2**-9  # exactly halfway to the next bfloat16 (ties to even)
    return torch.cat([v, mid, mid.nextafter(up), mid.nextafter(down), rnd, bf_mid,
                      torch.tensor([0.0, -0.0, 448.0, -448.0, 1e-30, float("nan")])])


def test_rounding_helpers_match_torch():
    x = boundary_values().to(DEV)
    n = x.numel()
    e4m3 = torch.empty(n, dtype=torch.uint8, device=DEV)
    bf16 = torch.empty(n, dtype=torch.bfloat16, device=DEV)
    _helpers_kernel[(triton.cdiv(n, 1024),)](x, e4m3, bf16, n, BLOCK=1024)
    want = x.clamp(-448, 448).to(FP8_DTYPE).view(torch.uint8)
    finite = ~x.isnan()
    assert torch.equal(e4m3[finite], want[finite])
    assert (e4m3[~finite] & 0x7F == 0x7F).all()  # NaN stays NaN
    assert torch.equal(bf16[finite], x[finite].to(torch.bfloat16))
    assert bf16[~finite].isnan().all()


def test_row_scales_match_torch():
    """448 / amax is torch's reciprocal(amax) * 448; the scale is amax * fp32(1 / 448) (what torch's
    division by a scalar gives on CUDA, written as a multiplication so the CPU agrees)."""
    g = torch.Generator().manual_seed(1)
    amax = (torch.rand(1000, generator=g) * torch.exp2(torch.randint(-40, 40, (1000,), generator=g).float()))
    amax = torch.cat([amax, torch.tensor([0.0, 1e-13])]).to(DEV)
    inv, scale = torch.empty_like(amax), torch.empty_like(amax)
    _scales_kernel[(1,)](amax, inv, scale, amax.numel(), BLOCK=1024)
    a = amax.clamp_min(1e-12)
    assert torch.equal(inv, FP8_MAX / a)
    assert torch.equal(scale.cpu(), (a * (1.0 / FP8_MAX)).cpu())
