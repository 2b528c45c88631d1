"""SwiGLU's non-linearity: the torch reference against float64, and the Triton kernel
(interpreter on the CPU, the GPU when there is one) against the reference within the dtype
tolerance; its fp8 output, under every launch variant, is bit for bit the reference quantization
of its own float32 result. Outputs start poisoned and the input rows past num_valid are NaN, so a
row written or read past num_valid fails."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from shufflemoe.ops import FP8_DTYPE, dequantize_fp8_rowwise, quantize_fp8_rowwise, silu_mul
from shufflemoe.ops.quantize.reference import dequantize_fp8_groups, quantize_fp8_groups
from shufflemoe.ops.silu_mul import kernel
from shufflemoe.testing import assert_close, poisoned

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def make(A, I, dtype, n_valid=None, seed=0, device=DEV):
    """h [A, 2I] with rows past n_valid NaN, and num_valid."""
    g = torch.Generator().manual_seed(seed)
    h = (torch.randn(A, 2 * I, generator=g) * 3).to(dtype)
    nv = None
    if n_valid is not None:
        h[n_valid:] = float("nan")
        nv = torch.tensor([n_valid], dtype=torch.int64, device=device)
    return h.to(device), nv


def silu_mul64(h):
    g, u = h.double().chunk(2, dim=1)
    return g / (1 + torch.exp(-g)) * u


@given(A=st.integers(0, 12), I=st.integers(1, 40), dtype=st.sampled_from(DTYPES),
       seed=st.integers(0, 2**16))
def test_reference_matches_float64(A, I, dtype, seed):
    h, _ = make(A, I, dtype, seed=seed, device="cpu")
    want = silu_mul64(h)
    assert_close(silu_mul(h, impl="torch"), want, dtype)
    assert_close(dequantize_fp8_rowwise(*silu_mul(h, quantize=True, impl="torch")), want, "fp8_rowwise")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n_valid", [None, 21], ids=["all", "partial"])
def test_kernel_matches_reference(dtype, n_valid):
    A, I = 29, 150  # I not a power of two
    h, nv = make(A, I, dtype, n_valid)
    n = A if n_valid is None else n_valid
    out = silu_mul(h, num_valid=nv, out=poisoned(A, I, dtype=dtype, device=DEV), impl="triton")
    assert_close(out[:n], silu_mul(h[:n], impl="torch").double(), dtype)
    assert_close(out[:n], silu_mul64(h[:n]), dtype)
    assert out[n:].isnan().all()


@pytest.mark.parametrize("I", [150, 1500], ids=["one_pass", "two_pass"])
def test_kernel_quantized_is_the_quantization_of_its_float32_result(I):
    """q, scale == quantize_fp8_rowwise(the kernel's own float32 silu_mul), bit for bit."""
    A, n = 11, 8
    h, nv = make(A, I, torch.float32, n_valid=n, seed=I)
    h[2, :I] = 0.0  # an all-zero row
    q = torch.full((A, I), 0xFF, dtype=torch.uint8, device=DEV).view(FP8_DTYPE)
    q, s = silu_mul(h, num_valid=nv, quantize=True, out=(q, poisoned(A, dtype=torch.float32, device=DEV)),
                    impl="triton")
    rq, rs = quantize_fp8_rowwise(silu_mul(h[:n], impl="triton"))
    assert torch.equal(q[:n].view(torch.uint8), rq.view(torch.uint8))
    assert torch.equal(s[:n], rs)
    assert (q[n:].view(torch.uint8) == 0xFF).all() and s[n:].isnan().all()
    assert_close(dequantize_fp8_rowwise(q[:n], s[:n]), silu_mul64(h[:n]), "fp8_rowwise")


def test_kernel_quantized_bf16_within_tolerance():
    h, _ = make(9, 70, torch.bfloat16, seed=5)
    q, s = silu_mul(h, quantize=True, impl="triton")
    assert q.dtype == FP8_DTYPE and s.shape == (9,)
    assert_close(dequantize_fp8_rowwise(q, s), silu_mul64(h), "fp8_rowwise")
    empty = silu_mul(h[:0], impl="triton")
    assert empty.shape == (0, 70)


FP8_VARIANTS = list(kernel.fp8_variants(5120))


def quantize_variant(h, nv, variant):
    """(q, scale) of one fp8 launch variant, into a poisoned q (0xFF) and scale (NaN)."""
    A, I = h.shape[0], h.shape[1] // 2
    q = torch.full((A, I), 0xFF, dtype=torch.uint8, device=h.device).view(FP8_DTYPE)
    return kernel.silu_mul(h, nv, "rowwise", (q, poisoned(A, dtype=torch.float32, device=h.device)),
                           fp8_variant=variant)


def check_variant(A, I, n_valid, variant, dtype=torch.bfloat16, seed=0):
    """The variant's (q, scale) == quantize_fp8_rowwise(the kernel's float32 product) bit for bit
    on the valid rows (one of them all zero), rows past num_valid untouched."""
    h, nv = make(A, I, dtype, n_valid, seed=seed)
    n = A if n_valid is None else n_valid
    if n > 1:
        h[1, :I] = 0.0
    q, s = quantize_variant(h, nv, variant)
    rq, rs = quantize_fp8_rowwise(silu_mul(h[:n].float(), impl="triton"))
    assert torch.equal(q[:n].view(torch.uint8), rq.view(torch.uint8))
    assert torch.equal(s[:n], rs)
    assert (q[n:].view(torch.uint8) == 0xFF).all() and s[n:].isnan().all()
    assert_close(dequantize_fp8_rowwise(q[:n], s[:n]), silu_mul64(h[:n]), "fp8_rowwise")


@pytest.mark.parametrize("variant", FP8_VARIANTS)
@pytest.mark.parametrize("A,I,n_valid", [(7, 5, None), (9, 100, 6), (6, 1100, 5), (5, 2500, 4)],
                         ids=lambda v: str(v))
def test_fp8_variant_is_the_quantization_of_its_float32_result(variant, A, I, n_valid):
    check_variant(A, I, n_valid, variant, seed=I)


@pytest.mark.parametrize("variant", FP8_VARIANTS)
def test_fp8_variant_i5120(variant):
    check_variant(3, 5120, 2, variant, dtype=torch.float32)


@pytest.mark.parametrize("variant", FP8_VARIANTS)
def test_fp8_variant_no_rows(variant):
    h, nv = make(4, 64, torch.bfloat16, n_valid=0)
    q, s = quantize_variant(h[:0], None, variant)
    assert q.shape == (0, 64) and s.shape == (0,)
    q, s = quantize_variant(h, nv, variant)  # num_valid = 0: nothing read or written
    assert (q.view(torch.uint8) == 0xFF).all() and s.isnan().all()


@pytest.mark.parametrize("I,pieces", [(5120, (4096, 1024)), (768, (512, 256)), (1536, (1024, 512)),
                                      (1024, (1024, 0)), (1100, (1024, 128)), (5, (16, 0))])
def test_fp8_launch(I, pieces):
    """The one-pass row is two power-of-two pieces covering I, at most 32 values a thread."""
    launch = kernel.fp8_launch(I)
    assert launch.one_pass and (launch.block, launch.block_b) == pieces
    assert launch.block + launch.block_b <= 32 * 32 * launch.num_warps
    assert not kernel.fp8_launch(16384).one_pass


@pytest.mark.parametrize("h,kwargs,match", [
    (torch.randn(4, 7), {}, "even"),
    (torch.randn(4, 8), dict(out=torch.empty(4, 8)), "out"),
    (torch.randn(4, 8), dict(quantize=True, out=torch.empty(4, 4)), "out"),
    (torch.randn(4, 8), dict(num_valid=torch.tensor([1.0])), "num_valid"),
    (torch.randn(4, 8).int(), {}, "h"),
])
def test_bad_input_raises(h, kwargs, match):
    with pytest.raises((TypeError, ValueError), match=match):
        silu_mul(h, **kwargs)


@needs_cuda
@pytest.mark.parametrize("quantize", [False, True])
def test_gpu_i5120(quantize):
    A, I, n = 8192, 5120, 8000
    h, nv = make(A, I, torch.bfloat16, n_valid=n)
    got = silu_mul(h, num_valid=nv, quantize=quantize, impl="triton")
    ref = silu_mul(h[:n], quantize=quantize, impl="torch")
    if quantize:
        assert_close(dequantize_fp8_rowwise(got[0][:n], got[1][:n]),
                     dequantize_fp8_rowwise(*ref).double(), "fp8_rowwise")
    else:
        assert_close(got[:n], ref.double(), torch.bfloat16)


@needs_cuda
@pytest.mark.parametrize("variant", FP8_VARIANTS)
def test_gpu_fp8_variant_i5120(variant):
    check_variant(1024, 5120, 1000, variant)


# ---- activation variants (gpt-oss) and fp8 groups ---------------------------------------------

ACTS = {"swiglu_oai, limit 1.5": dict(activation="swiglu_oai", alpha=1.702, limit=1.5),
        "swiglu_oai, no limit": dict(activation="swiglu_oai", alpha=0.9),
        "silu, limit 2": dict(activation="silu", limit=2.0)}


def glu64(h, activation="silu", alpha=1.0, limit=None):
    """The definitions in float64, written out: gpt-oss's clamped GLU and SwiGLU."""
    g, u = h.double().chunk(2, dim=1)
    if limit is not None:
        g, u = torch.minimum(g, torch.tensor(limit, dtype=g.dtype)), u.clamp(-limit, limit)
    if activation == "swiglu_oai":
        return (u + 1) * g / (1 + torch.exp(-alpha * g))
    return g / (1 + torch.exp(-g)) * u


@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_activation_variants_match_float64(act, dtype, impl):
    """|h| up to ~9, so the limit clamps a good share of gates and ups."""
    A, I, n = 13, 150, 10
    h, nv = make(A, I, dtype, n_valid=n, seed=len(act))
    out = silu_mul(h, num_valid=nv, out=poisoned(A, I, dtype=dtype, device=DEV), impl=impl,
                   **ACTS[act])
    assert_close(out[:n], glu64(h[:n].cpu(), **ACTS[act]), dtype)
    assert out[n:].isnan().all()
    if "limit" in ACTS[act]:  # the clamp matters: without it the result differs
        unclamped = {k: v for k, v in ACTS[act].items() if k != "limit"}
        assert (glu64(h[:n].cpu(), **unclamped) - out[:n].double().cpu()).abs().max() > 1


@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("variant", ["one_pass", "two_pass"])
def test_activation_variants_quantized_rowwise(act, variant):
    """fp8 rowwise of the variant: bit for bit the quantization of the kernel's float32 result."""
    A, I, n = 7, 300, 5
    h, nv = make(A, I, torch.bfloat16, n_valid=n, seed=3)
    q = torch.full((A, I), 0xFF, dtype=torch.uint8, device=DEV).view(FP8_DTYPE)
    s = poisoned(A, dtype=torch.float32, device=DEV)
    a = ACTS[act]
    kernel.silu_mul(h, nv, "rowwise", (q, s), (a["activation"], a.get("alpha", 1.0), a.get("limit")),
                    fp8_variant=variant)
    rq, rs = quantize_fp8_rowwise(silu_mul(h[:n].float(), impl="triton", **a))
    assert torch.equal(q[:n].view(torch.uint8), rq.view(torch.uint8)) and torch.equal(s[:n], rs)
    assert (q[n:].view(torch.uint8) == 0xFF).all() and s[n:].isnan().all()


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("I", [150, 128, 20], ids=lambda i: f"I={i}")
@pytest.mark.parametrize("act", ["silu", "swiglu_oai"])
def test_quantized_groups(impl, I, act):
    """quantize="groups": one scale per 128 columns (partial last group), bit for bit the group
    quantization of the op's own float32 result; rows past num_valid untouched."""
    A, n = 9, 6
    kw = ACTS["swiglu_oai, limit 1.5"] if act == "swiglu_oai" else {}
    h, nv = make(A, I, torch.bfloat16, n_valid=n, seed=I)
    h[1, :I] = 0.0  # a row whose gates are all zero
    G = -(-I // 128)
    q = torch.full((A, I), 0xFF, dtype=torch.uint8, device=DEV).view(FP8_DTYPE)
    s = poisoned(A, G, dtype=torch.float32, device=DEV)
    silu_mul(h, num_valid=nv, quantize="groups", out=(q, s), impl=impl, **kw)
    rq, rs = quantize_fp8_groups(silu_mul(h[:n].float(), impl=impl, **kw))
    assert torch.equal(q[:n].view(torch.uint8), rq.view(torch.uint8)) and torch.equal(s[:n], rs)
    assert (q[n:].view(torch.uint8) == 0xFF).all() and s[n:].isnan().all()
    assert_close(dequantize_fp8_groups(q[:n], s[:n]), glu64(h[:n].cpu(), **kw), "fp8_block")


@pytest.mark.parametrize("kwargs,match", [
    (dict(activation="gelu"), "activation must be one of"),
    (dict(quantize="blocks"), "quantize must be one of"),
    (dict(limit=-1.0), "limit must be"),
    (dict(quantize="groups", out=(torch.empty(4, 4, dtype=FP8_DTYPE), torch.empty(4))),
     r"out\[1\] must have shape"),
])
def test_bad_activation_arguments_raise(kwargs, match):
    with pytest.raises((TypeError, ValueError), match=match):
        silu_mul(torch.randn(4, 8), **kwargs)
