"""SwiGLU's non-linearity in Triton: a = silu(h[:, :I]) * h[:, I:] for rows below num_valid,
optionally fused with fp8 rowwise quantization (the input of the second grouped GEMM).

Computed in float32 as x / (1 + exp(-x)) * up, like torch's CPU and CUDA kernels; the exp differs
from torch's by an ulp or two, so the result matches the reference within the dtype tolerance
(not bit for bit). The quantized path rounds exactly as quantize_fp8_rowwise would round this
kernel's float32 product. Rows at or past num_valid are neither read nor written.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from .._impl import interpreting, kernel_op
from ..quantize.kernel import cast_to, fp8_target, row_scales, store_fp8
from ..quantize.reference import FP8_DTYPE


@triton.jit
def _silu_mul_chunk(src, offs, I, mask):
    """float32 silu(gate) * up for columns offs of the row starting at src ([gate | up])."""
    g = tl.load(src + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(src + I + offs, mask=mask, other=0.0).to(tl.float32)
    return tl.math.div_rn(g, 1.0 + tl.exp(-g)) * u


@triton.jit
def _row_valid(nv_ptr, row, HAS_NV: tl.constexpr):
    if HAS_NV:
        valid = row < tl.load(nv_ptr)
    else:
        valid = row >= 0
    return valid


@triton.jit
def _silu_mul_kernel(
    h_ptr,  # [A, 2I] gate columns then up columns
    nv_ptr,  # [1] number of valid rows (unused when not HAS_NV)
    out_ptr,  # [A, I] output, h's dtype
    I,  # intermediate size
    HAS_NV: tl.constexpr,
    INTERPRET: tl.constexpr,  # round with integer arithmetic (interpreter casts are wrong)
    BLOCK: tl.constexpr,  # columns per program (grid axis 1 covers I)
):
    row = tl.program_id(0)
    valid = _row_valid(nv_ptr, row, HAS_NV)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = (offs < I) & valid
    a = _silu_mul_chunk(h_ptr + row.to(tl.int64) * (2 * I), offs, I, mask)
    tl.store(out_ptr + row.to(tl.int64) * I + offs, cast_to(a, out_ptr.dtype.element_ty, INTERPRET),
             mask=mask)


@triton.jit
def _silu_mul_fp8_kernel(
    h_ptr,  # [A, 2I] gate columns then up columns
    nv_ptr,  # [1] number of valid rows (unused when not HAS_NV)
    q_ptr,  # [A, I] e4m3 output (uint8 view when INTERPRET)
    scale_ptr,  # [A] float32 row scales
    I,  # intermediate size
    HAS_NV: tl.constexpr,
    INTERPRET: tl.constexpr,  # round with integer arithmetic (interpreter casts are wrong)
    BLOCK: tl.constexpr,  # the whole row when ONE_PASS, else a chunk
    ONE_PASS: tl.constexpr,  # the row fits in registers: read it once
):
    row = tl.program_id(0)
    valid = _row_valid(nv_ptr, row, HAS_NV)
    src = h_ptr + row.to(tl.int64) * (2 * I)
    dst = q_ptr + row.to(tl.int64) * I
    offs = tl.arange(0, BLOCK)
    if ONE_PASS:
        mask = (offs < I) & valid
        a = _silu_mul_chunk(src, offs, I, mask)
        inv, scale = row_scales(tl.max(tl.abs(a), 0))
        store_fp8(dst + offs, a, inv, mask, INTERPRET)
    else:  # the second pass recomputes the same float32 values from h
        amax = tl.zeros([BLOCK], tl.float32)
        c = 0
        while c < I:  # (a range() over a runtime bound fails in the interpreter)
            mask = (c + offs < I) & valid
            amax = tl.maximum(amax, tl.abs(_silu_mul_chunk(src, c + offs, I, mask)))
            c += BLOCK
        inv, scale = row_scales(tl.max(amax, 0))
        c = 0
        while c < I:
            mask = (c + offs < I) & valid
            store_fp8(dst + c + offs, _silu_mul_chunk(src, c + offs, I, mask), inv, mask, INTERPRET)
            c += BLOCK
    tl.store(scale_ptr + row, scale, mask=valid)


def _block(I: int) -> int:
    """Columns per program: the largest power of two <= 2048 dividing I (5120 -> 1024), >= 256."""
    block = 2048
    while block > 256 and I % block:
        block //= 2
    return min(block, triton.next_power_of_2(I))


@kernel_op("silu_mul", mutates_args=("out",))
def _silu_mul_op(h: Tensor, num_valid: Optional[Tensor], out: Tensor) -> None:
    A, I = out.shape
    if A == 0 or I == 0:
        return
    block = _block(I)
    _silu_mul_kernel[(A, triton.cdiv(I, block))](
        h, num_valid, out, I, HAS_NV=num_valid is not None, INTERPRET=interpreting(), BLOCK=block,
        num_warps=4 if block <= 1024 else 8)


@kernel_op("silu_mul_fp8", mutates_args=("q", "scale"))
def _silu_mul_fp8_op(h: Tensor, num_valid: Optional[Tensor], q: Tensor, scale: Tensor) -> None:
    A, I = q.shape
    if A == 0 or I == 0:
        return
    target, interpret = fp8_target(q)
    # Rows up to 1024 wide fit one pass. Wider ones go in two passes of 1024 columns, the second
    # re-reading the row from L2: on an H100 at I = 5120 that ran at 58% / 76% of the copy
    # bandwidth for 2048 / 16384 rows, against 38% / 43% for one pass over the row padded to 8192
    # lanes (47% / 52% with 16 warps) (benchmarks/notes/layer.md).
    block, one_pass = (triton.next_power_of_2(max(I, 16)), True) if I <= 1024 else (1024, False)
    _silu_mul_fp8_kernel[(A,)](
        h, num_valid, target, scale, I, HAS_NV=num_valid is not None, INTERPRET=interpret,
        BLOCK=block, ONE_PASS=one_pass, num_warps=4)


def silu_mul(
    h: Tensor,
    num_valid: Tensor | None,
    quantize: bool,
    out: Tensor | tuple[Tensor, Tensor] | None,
) -> Tensor | tuple[Tensor, Tensor]:
    """h [A, 2I] -> a [A, I] in h's dtype, or (q [A, I] e4m3, scale [A] float32). Arguments were
    checked by the public function."""
    A, I = h.shape[0], h.shape[1] // 2
    if quantize:
        if out is None:
            out = (torch.empty(A, I, dtype=FP8_DTYPE, device=h.device),
                   torch.empty(A, dtype=torch.float32, device=h.device))
        _silu_mul_fp8_op(h, num_valid, out[0], out[1])
        return out
    if out is None:
        out = torch.empty(A, I, dtype=h.dtype, device=h.device)
    _silu_mul_op(h, num_valid, out)
    return out
