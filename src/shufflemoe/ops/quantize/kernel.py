"""Triton helpers for the fp8 rowwise quantization fused into gather_scale and silu_mul.

They reproduce quantize_fp8_rowwise (reference.py) bit for bit, evaluated the way torch evaluates
it in float32: amax = max(|row|, 1e-12); ``448 / amax`` is ``reciprocal(amax) * 448`` (torch's
__rtruediv__), correctly rounded; q = e4m3(clamp(row * that, -448, 448)), nearest even; and
``amax / 448`` is a true division on the CPU but ``amax * (1 / 448)`` on CUDA (torch multiplies
by the reciprocal of a scalar divisor there), so the kernel follows the device it runs on.
Triton's ``/`` is an approximate division on CUDA, hence ``div_rn``.

Under the interpreter (TRITON_INTERPRET=1, Triton 3.6.0) two casts are wrong: float32 -> bfloat16
truncates, and float32 -> float8e4nv rounds half up without carrying into the exponent (0.031
became 0.0156 in our check). With ``INTERPRET=True`` the kernels round with integer arithmetic
instead (e4m3 stored through a uint8 view); on CUDA they use the hardware casts (round to nearest
even, cvt.rn.satfinite for e4m3). Both agree with torch bit for bit.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from .._common import next_power_of_2
from .._impl import interpreting, kernel_op
from .._launch import launch
from .._pdl import chain_start, chained


@triton.jit
def e4m3_bits(v):
    """float32 v in [-448, 448] -> e4m3fn bit pattern (int32 in 0..255), round to nearest even."""
    bits = v.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    a = tl.where(v != v, 0.0, tl.abs(v))  # NaN handled at the end
    # Below 2^-6 e4m3 is subnormal, a multiple of 2^-9: adding 1.5 * 2^23 rounds a * 2^9 to an
    # integer (nearest even) in float32 arithmetic.
    sub = ((a * 512.0 + 12582912.0) - 12582912.0).to(tl.int32)
    # Normal: keep 3 mantissa bits, rounding on bit 20 to nearest even; a carry moves into the
    # exponent as it should. 120 = 127 - 7 rebiases the exponent.
    abits = a.to(tl.int32, bitcast=True)
    nrm = ((abits + 0x7FFFF + ((abits >> 20) & 1)) >> 20) - (120 << 3)
    code = tl.where(a < 0.015625, sub, nrm)
    code = tl.where(v != v, 0x7F, code)
    return sign | code


@triton.jit
def to_bf16_rne(v):
    """float32 -> bfloat16, round to nearest even, NaN kept NaN (the interpreter's cast truncates)."""
    bits = v.to(tl.int32, bitcast=True)
    r = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    r = tl.where(v != v, 0x7FC0, r)
    return r.to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def cast_to(v, DTYPE: tl.constexpr, INTERPRET: tl.constexpr):
    """float32 v rounded to DTYPE (nearest even) on CUDA and in the interpreter alike."""
    out = v.to(DTYPE)
    if INTERPRET:
        if DTYPE == tl.bfloat16:
            out = to_bf16_rne(v)
    return out


@triton.jit
def row_scales(amax):
    """Row absolute maximum -> (multiplier 448 / amax, stored scale amax * fp32(1 / 448)) as the
    reference computes them (torch's 448 / amax is reciprocal(amax) * 448)."""
    amax = tl.maximum(amax, 1e-12)
    inv = tl.math.div_rn(1.0, amax) * 448.0
    return inv, amax * 0.002232142857142857


@triton.jit
def store_fp8(ptr, v, inv, mask, INTERPRET: tl.constexpr):
    """Store e4m3(clamp(v * inv, -448, 448)) at ptr (a uint8 pointer when INTERPRET). NaN stays
    NaN as in torch.clamp (tl.clamp's default turns it into a bound on the GPU)."""
    y = tl.clamp(v * inv, -448.0, 448.0, propagate_nan=tl.PropagateNan.ALL)
    if INTERPRET:
        tl.store(ptr, e4m3_bits(y).to(tl.uint8), mask=mask)
    else:
        tl.store(ptr, y.to(tl.float8e4nv), mask=mask)


@triton.jit
def e2m1_scaled(n):
    """e2m1 codes n (int32, low 4 bits) -> their values times 2^-14 (float32, exact) in five
    integer operations: the code's two exponent bits and its mantissa bit become an fp16's lowest
    exponent bits and top mantissa bit (exponent 0 lands on fp16's subnormals, 0 and 2^-15, as
    e2m1's 0 and 0.5 do), its sign bit the fp16's. The caller folds 2^14 into the group scale."""
    bits = ((n & 7) << 9) | ((n & 8) << 12)
    return bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def e8m0_values(s):
    """e8m0 scales s (uint8 or int32) -> float32 2^(s - 127), built from its exponent bits
    (s = 0: 2^-127, a subnormal)."""
    si = s.to(tl.int32)
    return tl.where(si == 0, 5.877471754111438e-39, (si << 23).to(tl.float32, bitcast=True))


def _e2m1_f16_ptx(em: int, sign: int) -> tl.constexpr:
    """PTX decoding one nibble of each of four bytes ($2) into four fp16 values times 2^-14 ($0,
    $1). prmt spreads bytes 0, 1 (2, 3) into the two 16-bit halves; each code's sign lands on bit
    15 of its half and its exponent and mantissa bits, shifted by ``em``, on fp16's lowest
    exponent bits and top mantissa bit (exponent 0 lands on subnormals, as e2m1's 0 and 0.5 do).
    One line, no escapes: Inductor copies the constant into a string literal of its generated
    code."""
    ptx = "{ .reg .b32 t, a, b; "
    for out, select in (("$0", "0x4140"), ("$1", "0x4342")):
        ptx += (f"prmt.b32 t, $2, 0, {select}; shl.b32 a, t, {em}; and.b32 a, a, 0x0E000E00; "
                f"shl.b32 b, t, {sign}; and.b32 b, b, 0x80008000; or.b32 {out}, a, b; ")
    return tl.constexpr(ptx + "}")


E2M1_LOW_F16_PTX: tl.constexpr = _e2m1_f16_ptx(9, 12)  # fp16 x 2^-14
E2M1_HIGH_F16_PTX: tl.constexpr = _e2m1_f16_ptx(5, 8)


@triton.jit
def e2m1_f16(packed, HIGH: tl.constexpr, FP32: tl.constexpr):
    """Values times 2^-14 of each byte's low (HIGH: high) nibble, packed uint8: in PTX, two values
    a 32-bit operation, to fp16; FP32 (the interpreter, which has no inline assembly):
    e2m1_scaled, to float32. Both exact."""
    if FP32:
        n = packed.to(tl.int32)
        if HIGH:
            v = e2m1_scaled(n >> 4)
        else:
            v = e2m1_scaled(n & 0xF)
    elif HIGH:
        v = tl.inline_asm_elementwise(E2M1_HIGH_F16_PTX, "=r,=r,r", [packed], dtype=tl.float16,
                                      is_pure=True, pack=4)
    else:
        v = tl.inline_asm_elementwise(E2M1_LOW_F16_PTX, "=r,=r,r", [packed], dtype=tl.float16,
                                      is_pure=True, pack=4)
    return v


def _e2m1_bf16_ptx() -> tl.constexpr:
    """PTX decoding the 8 e2m1 codes of four bytes ($4) into four bf16x2 words, byte i's (low
    nibble, high nibble) in $i, times byte i's bf16 scale (both halves of $(5 + i); exact: an e2m1
    magnitude times a power of two). The three magnitude bits select a byte of two 8-entry
    tables (bf16's high and low bytes of 0, 0.5, 1, 1.5, 2, 3, 4, 6) with one prmt for four codes
    each, the sign bits select 0x80 or 0 with two more, and one prmt a pair interleaves low and
    high bytes: about 2.5 operations a value, where placing bits took 4. Elementwise in the bytes
    (byte i's word depends on byte i and its scale alone), so any register layout serves. One
    line, no escapes (see _e2m1_f16_ptx)."""
    ptx = ("{ .reg .b32 s, m, m1, g0, g1, h0, h1, l0, l1, a; "
           "and.b32 s, $4, 0x88888888; and.b32 m, $4, 0x77777777; shr.b32 m1, m, 16; "
           "shr.b32 g0, s, 3; shr.b32 g1, s, 19; "
           "prmt.b32 g0, 0x8000, 0, g0; prmt.b32 g1, 0x8000, 0, g1; "
           "prmt.b32 h0, 0x3F3F3F00, 0x40404040, m; prmt.b32 h1, 0x3F3F3F00, 0x40404040, m1; "
           "or.b32 h0, h0, g0; or.b32 h1, h1, g1; "
           "prmt.b32 l0, 0xC0800000, 0xC0804000, m; prmt.b32 l1, 0xC0800000, 0xC0804000, m1; ")
    for i, (lo, hi, select) in enumerate((("l0", "h0", "0x5140"), ("l0", "h0", "0x7362"),
                                          ("l1", "h1", "0x5140"), ("l1", "h1", "0x7362"))):
        ptx += f"prmt.b32 a, {lo}, {hi}, {select}; mul.rn.bf16x2 ${i}, a, ${5 + i}; "
    return tl.constexpr(ptx + "}")


E2M1_BF16_PTX: tl.constexpr = _e2m1_bf16_ptx()


def _e4m3_bf16_ptx() -> tl.constexpr:
    """PTX turning two e4m3 bytes ($1, 16 bits) into two bf16 ($0) with integer operations: prmt
    puts each byte in the high half of a 16-bit lane, its sign stays on bit 15 and its 7 exponent
    and mantissa bits move down 4 onto bf16's lowest exponent bits and top mantissa bits, which
    is the value times 2^-120 (e4m3's subnormals land on bf16's); one mul.bf16x2 by 2^120
    (0x7B80) makes it exact. e4m3's NaN (0x7F) becomes 480, not NaN."""
    return tl.constexpr(
        "{ .reg .b32 w, p, t, bias; mov.b32 bias, 0x7B807B80; cvt.u32.u16 w, $1; "
        "prmt.b32 p, w, 0, 0x1404; and.b32 t, p, 0x7F007F00; shr.b32 t, t, 4; "
        "and.b32 p, p, 0x80008000; or.b32 p, p, t; mul.rn.bf16x2 $0, p, bias; }")


E4M3_BF16_PTX: tl.constexpr = _e4m3_bf16_ptx()


@triton.jit
def e4m3_to(w, DTYPE: tl.constexpr):
    """e4m3 w as DTYPE, exactly. To bf16 on the GPU without the conversion unit: Triton's cast
    goes through fp16 and converts each value with F2F.BF16.F16, which an H100 SM issues at 16 a
    clock, below the bytes HBM brings it; E4M3_BF16_PTX is five integer operations and one
    bf16x2 multiply a pair. Other targets (fp16, float32) cast. The interpreter has no inline
    assembly: its callers convert to float32 there (their UPCAST), never to bf16."""
    if DTYPE == tl.bfloat16:
        out = tl.inline_asm_elementwise(E4M3_BF16_PTX, "=r,h", [w.to(tl.uint8, bitcast=True)],
                                        dtype=tl.bfloat16, is_pure=True, pack=2)
    else:
        out = w.to(DTYPE)
    return out


@triton.jit
def mxfp4_values(packed, s, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FP32: tl.constexpr,
                 RUN_ORDER: tl.constexpr):
    """MXFP4 dequantization: packed [BLOCK_N, BLOCK_K / 2] uint8 (element 2j in the low nibble of
    byte j, 2j + 1 in the high one), s [BLOCK_N, BLOCK_K / 32] uint8 e8m0 -> [BLOCK_N, BLOCK_K]
    exact values: float32 when FP32 (the interpreter: e2m1_scaled), else bfloat16 from PTX that
    decodes and scales the eight codes of four bytes with table lookups (E2M1_BF16_PTX).

    RUN_ORDER: the values come out in mxfp4_run_order's column order, not K's, for tiles that are
    an MMA's left operand in registers (the dot's other operand loaded in that order: the sum is
    the same). There a thread holds bytes c, c + 4, c + 8, c + 12 of each 16-byte run (values 2c,
    2c + 1, 2c + 8, 2c + 9 of each 16), four single-byte shared-memory loads; the 4 x 4 transpose
    of each run below makes them four adjacent bytes, one load. Only registers are renamed."""
    if RUN_ORDER:
        packed = packed.reshape(BLOCK_N, BLOCK_K // 32, 4, 4).permute(0, 1, 3, 2)
        packed = packed.reshape(BLOCK_N, BLOCK_K // 2)
    if FP32:
        n = tl.join(packed & 0xF, packed >> 4).to(tl.int32).reshape(BLOCK_N, BLOCK_K)
        scale = e8m0_values(s) * 16384.0  # 2^14: see e2m1_scaled
        val = e2m1_scaled(n).reshape(BLOCK_N, BLOCK_K // 32, 32) * scale[:, :, None]
    else:
        p = packed.reshape(BLOCK_N, BLOCK_K // 32, 16)
        sb = tl.maximum(s.to(tl.int32) << 7, 0x40)  # bf16 bits of 2^(s - 127) (s = 0: 0x40)
        sc = tl.broadcast_to((sb | (sb << 16))[:, :, None], p.shape)  # in both halves
        pair = tl.inline_asm_elementwise(E2M1_BF16_PTX, "=r,=r,=r,=r,r,r,r,r,r", [p, sc],
                                         dtype=tl.int32, is_pure=True, pack=4)
        lo = pair.to(tl.int16).to(tl.bfloat16, bitcast=True)
        hi = (pair >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
        val = tl.join(lo, hi)
    return val.reshape(BLOCK_N, BLOCK_K)


@triton.jit
def mxfp4_run_order(x):
    """x [BM, BK] (columns k0 .. k0 + BK, whole 32-column groups) with its columns in
    mxfp4_values' RUN_ORDER: position 32g + 8i + 2j + h holds column 32g + 8j + 2i + h, the
    value pair of byte 4j + i of its 16-byte run in the place of byte 4i + j's."""
    BM: tl.constexpr = x.shape[0]
    BK: tl.constexpr = x.shape[1]
    return x.reshape(BM, BK // 32, 4, 4, 2).permute(0, 1, 3, 2, 4).reshape(BM, BK)


def fp8_target(q: Tensor) -> tuple[Tensor, bool]:
    """(tensor to hand the kernel for an e4m3 output, INTERPRET flag): a uint8 view under the
    interpreter, the tensor itself on CUDA."""
    interpret = interpreting()
    return (q.view(torch.uint8) if interpret else q), interpret


def quant_block(n: int, limit: int = 16384) -> tuple[int, bool]:
    """(BLOCK, ONE_PASS) for a row of n values: one pass holds the whole row in registers (the
    amax needs every value) up to ``limit`` values; longer rows are read twice."""
    block = next_power_of_2(max(n, 16))
    return (block, True) if block <= limit else (4096, False)


@triton.jit
def store_fp8_group(ptr, v, mask, INTERPRET: tl.constexpr):
    """Quantize one group of values v (masked lanes 0) with its own scale: store e4m3 at ptr,
    return the float32 scale (the rowwise formula on the group)."""
    inv, scale = row_scales(tl.max(tl.abs(v), 0))
    store_fp8(ptr, v, inv, mask, INTERPRET)
    return scale


@triton.jit
def _quantize_fp8_groups_kernel(
    x_ptr,  # [M, K] float rows
    nv_ptr,  # [1] number of valid rows (unused when not HAS_NV)
    q_ptr,  # [M, K] e4m3 output (uint8 view when INTERPRET)
    scale_ptr,  # [M, G] float32 group scales
    K, G,
    HAS_NV: tl.constexpr,
    INTERPRET: tl.constexpr,
    GROUP: tl.constexpr,  # columns per scale (one program per row and group)
    PDL: tl.constexpr,  # launched with programmatic dependent launch (ops/_pdl.py)
):
    chain_start(PDL)
    row = tl.program_id(0)
    grp = tl.program_id(1)
    if HAS_NV:
        valid = row < tl.load(nv_ptr)
    else:
        valid = row >= 0
    cols = grp * GROUP + tl.arange(0, GROUP)
    mask = (cols < K) & valid
    base = row.to(tl.int64) * K
    v = tl.load(x_ptr + base + cols, mask=mask, other=0.0).to(tl.float32)
    scale = store_fp8_group(q_ptr + base + cols, v, mask, INTERPRET)
    tl.store(scale_ptr + row.to(tl.int64) * G + grp, scale, mask=valid)


@kernel_op("quantize_fp8_groups", mutates_args=("q", "scale"))
def quantize_fp8_groups_into(x: Tensor, num_valid: Optional[Tensor], q: Tensor, scale: Tensor,
                             group: int) -> None:
    """q [M, K] e4m3, scale [M, G] float32 <- x [M, K] (arguments checked by the public op)."""
    M, K = x.shape
    if M == 0 or K == 0:
        return
    target, interpret = fp8_target(q)
    launch(_quantize_fp8_groups_kernel, (M, scale.shape[1]),
        x, num_valid, target, scale, K, scale.shape[1], HAS_NV=num_valid is not None,
        INTERPRET=interpret, GROUP=group, num_warps=1 if group <= 128 else 4,
        **chained(x, (M, scale.shape[1])))
