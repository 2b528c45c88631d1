"""The weight formats beyond fp8 rowwise (ops/quantize): mxfp4 and fp8 128 x 128 blocks against
their float64 definitions, the fp8 group quantization kernel bit for bit against its reference,
and the formats table's shapes and bytes."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from shufflemoe.ops.quantize import (FP8_DTYPE, FP8_MAX, dequantize_fp8_blockwise,
                                     dequantize_fp8_groups, dequantize_mxfp4,
                                     quantize_fp8_blockwise, quantize_fp8_groups, quantize_mxfp4)
from shufflemoe.ops.quantize import reference as ref
from shufflemoe.ops.quantize.formats import FORMATS, weight_format
from shufflemoe.testing import poisoned

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
E2M1 = torch.tensor(ref.E2M1_VALUES, dtype=torch.float64)


def gen(seed):
    return torch.Generator().manual_seed(seed)


# ---- mxfp4 ------------------------------------------------------------------------------------


@given(N=st.integers(1, 5), groups=st.integers(1, 3), log_scale=st.floats(-30, 30),
       seed=st.integers(0, 2**16))
def test_mxfp4_matches_its_definition(N, groups, log_scale, seed):
    """Scale: the smallest power of two >= amax / 6; each value the nearest e2m1 of v / scale
    (ties to the even code), packed low nibble first."""
    w = (torch.randn(2, N, 32 * groups, generator=gen(seed)) * 2.0**log_scale).to(torch.bfloat16)
    blocks, scales = quantize_mxfp4(w)
    assert blocks.shape == (2, N, 16 * groups) and blocks.dtype == torch.uint8
    assert scales.shape == (2, N, groups) and scales.dtype == torch.uint8
    v = w.double().unflatten(-1, (groups, 32))
    amax = v.abs().amax(-1)
    exp = scales.double() - 127
    assert (2.0**exp >= amax / 6 * (1 - 2**-23)).all()  # fits: amax / 2^e <= 6
    assert ((2.0**(exp - 1) < amax / 6) | (amax == 0)).all()  # and is the smallest such
    scaled = v / 2.0**exp[..., None]
    got = dequantize_mxfp4(blocks, scales).double().unflatten(-1, (groups, 32)) / 2.0**exp[..., None]
    dist = (scaled.abs()[..., None] - E2M1).abs()
    assert (((got.abs() - scaled.abs()).abs() - dist.min(-1).values).abs() <= 1e-12).all()
    assert ((got == 0) | (torch.sign(got) == torch.sign(scaled))).all()


def test_mxfp4_rounds_ties_to_even_and_saturates():
    # One group, scale 1 (amax 6): every tie between two e2m1 values, and the extremes.
    v = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, -0.25, -5.0, 0.0, 0.3] + [0] * 20)
    blocks, scales = quantize_mxfp4(v.view(1, 32))
    assert scales.item() == 127 + 0  # 6 / 6 = 1 = 2^0
    # element 2j in the low nibble of byte j: codes 0 (0.25 -> 0) | 2 (0.75 -> 1.0) << 4, ...
    assert blocks[0, :4].tolist() == [0x20, 0x42, 0x64, 0x76]
    got = dequantize_mxfp4(blocks, scales)[0, :12]
    assert got.tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, -0.0, -4.0, 0.0, 0.5]
    zero_b, zero_s = quantize_mxfp4(torch.zeros(1, 32))
    assert (zero_b == 0).all() and zero_s.item() == 0 and (dequantize_mxfp4(zero_b, zero_s) == 0).all()


def test_mxfp4_needs_k_multiple_of_32():
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_mxfp4(torch.randn(2, 48))


# ---- fp8 blocks and groups -------------------------------------------------------------------


@pytest.mark.parametrize("N,K,split", [(40, 70, None), (300, 260, None), (300, 260, 150),
                                       (256, 128, 128), (1, 1, None)])
def test_fp8_blockwise_is_rowwise_per_block(N, K, split):
    """Each 128 x 128 block (partial at the edges; restarted at split) is quantized with the
    rowwise formula over its values."""
    w = torch.randn(3, N, K, generator=gen(N + K)) * torch.rand(3, N, 1, generator=gen(1)) * 10
    q, s = quantize_fp8_blockwise(w, split)
    rows = ref.block_rows(N, split)
    assert s.shape == (3, int(rows.max()) + 1, -(-K // 128)) and q.dtype == FP8_DTYPE
    for e in range(3):
        for nb in range(s.shape[1]):
            for kb in range(s.shape[2]):
                tile = w[e, rows == nb, kb * 128:(kb + 1) * 128]
                rq, rs = ref.quantize_fp8_rowwise(tile.reshape(1, -1))
                assert s[e, nb, kb] == rs[0]
                assert torch.equal(q[e, rows == nb, kb * 128:(kb + 1) * 128].reshape(1, -1)
                                   .view(torch.uint8), rq.view(torch.uint8))
    back = dequantize_fp8_blockwise(q, s, split).double()
    assert (back - w.double()).abs().max() <= s.double().max() * 16  # half an e4m3 step at 448


def test_block_rows_restart_at_split():
    assert ref.block_rows(300, None).tolist()[::50] == [0, 0, 0, 1, 1, 1]
    assert ref.block_rows(300, None)[256] == 2
    r = ref.block_rows(300, 150)
    assert r[149] == 1 and r[150] == 2 and r[299] == 3


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("K,n_valid", [(200, None), (128, 5), (7, 3), (385, 0)])
def test_fp8_groups_kernel_is_its_reference(impl, K, n_valid):
    """Bit for bit the rowwise formula per group of 128 columns; rows past num_valid untouched."""
    M = 9
    x = (torch.randn(M, K, generator=gen(K)) * torch.rand(M, 1, generator=gen(2)) * 100)
    x[1] = 0.0  # an all-zero row
    x = x.to(torch.bfloat16)
    n = M if n_valid is None else n_valid
    nv = None if n_valid is None else torch.tensor([n_valid], device=DEV)
    x[n:] = float("nan")
    G = -(-K // 128)
    q = torch.full((M, K), 0xFF, dtype=torch.uint8, device=DEV).view(FP8_DTYPE)
    s = poisoned(M, G, dtype=torch.float32, device=DEV)
    quantize_fp8_groups(x.to(DEV), num_valid=nv, out=(q, s), impl=impl)
    rq, rs = ref.quantize_fp8_groups(x[:n])
    assert torch.equal(q[:n].view(torch.uint8).cpu(), rq.view(torch.uint8))
    assert torch.equal(s[:n].cpu(), rs)
    assert (q[n:].view(torch.uint8) == 0xFF).all() and s[n:].isnan().all()
    if n:
        err = (dequantize_fp8_groups(rq, rs).double() - x[:n].double()).abs()
        assert (err <= rs.double().repeat_interleave(128, 1)[:, :K] * 16).all()


def test_fp8_groups_bad_input():
    with pytest.raises(ValueError, match="out\\[1\\] must have shape"):
        quantize_fp8_groups(torch.randn(4, 200), out=(torch.empty(4, 200, dtype=FP8_DTYPE),
                                                       torch.empty(4, 1)))
    with pytest.raises(TypeError, match="x must have dtype"):
        quantize_fp8_groups(torch.randn(4, 8).to(FP8_DTYPE))


# ---- the table -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(FORMATS))
def test_format_table_round_trips(name):
    """quantize gives the stored shapes and dtypes the table names; dequantize is close; bytes
    counts exactly what is stored."""
    fmt = weight_format(name)
    if not fmt.quantized:
        assert fmt.bytes(10, 64, 2) == 10 * 64 * 2 and fmt.scale_shape(10, 64) is None
        return
    N, K, split = 200, 160, 100
    w = torch.randn(2, N, K, generator=gen(3)).to(torch.bfloat16)
    q, s = fmt.quantize(w, split)
    assert q.dtype == fmt.weight_dtype and q.shape == (2, *fmt.weight_shape(N, K))
    assert s.dtype == fmt.scale_dtype and s.shape == (2, *fmt.scale_shape(N, K, split))
    assert fmt.bytes(N, K, 2, split) * 2 == q.nbytes + s.nbytes
    err = (fmt.dequantize(q, s, split) - w.float()).norm() / w.float().norm()
    assert err < (0.15 if name == "mxfp4" else 0.05), err


def test_bytes_per_weight():
    """What the planner charges per weight (D = I = 2880, gpt-oss): bf16 2, fp8 ~1, mxfp4 ~0.53."""
    per = {n: f.bytes(2880, 2880, 2) / 2880**2 for n, f in FORMATS.items()}
    assert per["none"] == 2 and 1 < per["fp8_rowwise"] < 1.002
    assert 1 < per["fp8_block"] < 1.001 and 0.53 <= per["mxfp4"] < 0.532
    with pytest.raises(ValueError, match="choose one of"):
        weight_format("int4")


def test_fp8_max_is_e4m3():
    assert torch.tensor(FP8_MAX).to(FP8_DTYPE).float() == FP8_MAX
