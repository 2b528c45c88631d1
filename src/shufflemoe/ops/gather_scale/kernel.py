"""GatherMul in Triton: xs[i] = x[token_ids[i]] * weights[i] for i < num_valid, optionally fused
with fp8 rowwise quantization (MetaShuffling's GatherMul: gather + gather scores + mul, and with
quantization max + divide + mul + clamp + cast, in one pass over the rows).

Bit-exact with reference.py: the product is taken in float32 and rounded once; the quantized
output follows quantize/kernel.py. Rows at or past num_valid are neither read nor written, and
nothing is copied to the host, so the op is safe inside a CUDA graph.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from .._common import cdiv, next_power_of_2
from .._impl import interpreting, kernel_op
from .._launch import launch
from ..quantize.kernel import (cast_to, fp8_target, quant_block, row_scales, store_fp8,
                               store_fp8_group)
from ..quantize.reference import FP8_BLOCK, FP8_DTYPE, QUANTIZE_MODES


@triton.jit
def _row_source(ids_ptr, w_ptr, nv_ptr, rows, A, HAS_W: tl.constexpr, HAS_NV: tl.constexpr):
    """(valid, source token, weight) of output rows ``rows`` (a scalar or a vector)."""
    valid = rows < A
    if HAS_NV:
        valid = valid & (rows < tl.load(nv_ptr))
    tok = tl.load(ids_ptr + rows, mask=valid, other=0).to(tl.int64)
    w = 1.0
    if HAS_W:
        w = tl.load(w_ptr + rows, mask=valid, other=0.0)
    return valid, tok, w


@triton.jit
def _gather_scale_kernel(
    x_ptr,  # [T, D] source rows
    ids_ptr,  # [A] int32/int64 source token of each output row
    w_ptr,  # [A] float32 weights (unused when not HAS_W)
    nv_ptr,  # [1] number of valid rows (unused when not HAS_NV)
    out_ptr,  # [A, D] output, x's dtype
    A, D,  # rows, row length
    HAS_W: tl.constexpr,
    HAS_NV: tl.constexpr,
    INTERPRET: tl.constexpr,  # round with integer arithmetic (interpreter casts are wrong)
    ROWS: tl.constexpr,  # rows per program: their ids load at once, their copies overlap
    BLOCK_D: tl.constexpr,  # columns per program (grid axis 1 covers D)
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    valid, tok, w = _row_source(ids_ptr, w_ptr, nv_ptr, rows, A, HAS_W, HAS_NV)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = valid[:, None] & (cols < D)[None, :]
    v = tl.load(x_ptr + tok[:, None] * D + cols[None, :], mask=mask)
    if HAS_W:
        # one rounding, as the reference
        v = cast_to(v.to(tl.float32) * w[:, None], out_ptr.dtype.element_ty, INTERPRET)
    tl.store(out_ptr + rows.to(tl.int64)[:, None] * D + cols[None, :], v, mask=mask)


@triton.jit
def _weighted(v, w, HAS_W: tl.constexpr):
    """[ROWS, BLOCK] values in float32, times their rows' weights w [ROWS] when HAS_W."""
    v = v.to(tl.float32)
    if HAS_W:
        v = v * w[:, None]
    return v


@triton.jit
def _gather_scale_fp8_kernel(
    x_ptr,  # [T, D] source rows
    ids_ptr,  # [A] int32/int64 source token of each output row
    w_ptr,  # [A] float32 weights (unused when not HAS_W)
    nv_ptr,  # [1] number of valid rows (unused when not HAS_NV)
    q_ptr,  # [A, D] e4m3 output (uint8 view when INTERPRET)
    scale_ptr,  # [A] float32 row scales
    A, D,  # rows, row length
    HAS_W: tl.constexpr,
    HAS_NV: tl.constexpr,
    INTERPRET: tl.constexpr,  # round with integer arithmetic (interpreter casts are wrong)
    ROWS: tl.constexpr,  # rows per program
    BLOCK_D: tl.constexpr,  # the whole row when ONE_PASS, else a chunk
    ONE_PASS: tl.constexpr,  # the rows fit in registers: read them once
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    valid, tok, w = _row_source(ids_ptr, w_ptr, nv_ptr, rows, A, HAS_W, HAS_NV)
    src = x_ptr + tok[:, None] * D
    dst = q_ptr + rows.to(tl.int64)[:, None] * D
    offs = tl.arange(0, BLOCK_D)[None, :]
    if ONE_PASS:
        mask = valid[:, None] & (offs < D)
        v = _weighted(tl.load(src + offs, mask=mask, other=0.0), w, HAS_W)
        inv, scale = row_scales(tl.max(tl.abs(v), 1))
        store_fp8(dst + offs, v, inv[:, None], mask, INTERPRET)
    else:
        # while loops: a range() over a runtime bound fails in the interpreter
        amax = tl.zeros([ROWS, BLOCK_D], tl.float32)
        c = 0
        while c < D:
            mask = valid[:, None] & (c + offs < D)
            v = _weighted(tl.load(src + c + offs, mask=mask, other=0.0), w, HAS_W)
            amax = tl.maximum(amax, tl.abs(v))
            c += BLOCK_D
        inv, scale = row_scales(tl.max(amax, 1))
        c = 0
        while c < D:
            mask = valid[:, None] & (c + offs < D)
            v = _weighted(tl.load(src + c + offs, mask=mask, other=0.0), w, HAS_W)
            store_fp8(dst + c + offs, v, inv[:, None], mask, INTERPRET)
            c += BLOCK_D
    tl.store(scale_ptr + rows, scale, mask=valid)


@triton.jit
def _gather_tokens_kernel(
    x_ptr,  # [T, D] source rows
    pos_ptr,  # [T * K] int32/int64: the output row of token t's j-th pair (Routing.positions)
    w_ptr,  # [A] float32 weights, by output row (unused when not HAS_W)
    nv_ptr,  # [1] number of valid rows (unused when not HAS_NV: A)
    out_ptr,  # [A, D] output: x's dtype, or e4m3 (uint8 view when INTERPRET) with QUANT
    scale_ptr,  # [A] float32 row scales (QUANT)
    T, A, D,  # tokens, output rows, row length
    K: tl.constexpr,  # pairs a token
    HAS_W: tl.constexpr,
    HAS_NV: tl.constexpr,
    QUANT: tl.constexpr,  # fp8 rowwise: BLOCK_D covers the row (one program across D)
    INTERPRET: tl.constexpr,  # round with integer arithmetic (interpreter casts are wrong)
    TOKENS: tl.constexpr,  # tokens per program
    BLOCK_D: tl.constexpr,  # columns per program (grid axis 1 covers D)
):
    """Token-major: each token's row is read once and written to its K pairs' output rows (the
    row-major kernels read it K times, from DRAM once x outgrows the L2). The same values as
    they store: the product in float32, rounded once."""
    toks = tl.program_id(0) * TOKENS + tl.arange(0, TOKENS)
    tvalid = toks < T
    if HAS_NV:
        n = tl.load(nv_ptr)
    else:
        n = A
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)[None, :]
    cmask = cols < D
    v = tl.load(x_ptr + toks.to(tl.int64)[:, None] * D + cols, mask=tvalid[:, None] & cmask,
                other=0.0)
    for j in tl.static_range(K):
        p = tl.load(pos_ptr + toks * K + j, mask=tvalid, other=-1)
        ok = tvalid & (p >= 0) & (p < n)
        dst = out_ptr + p.to(tl.int64)[:, None] * D + cols
        mask = ok[:, None] & cmask
        w = 1.0
        if HAS_W:
            w = tl.load(w_ptr + p, mask=ok, other=0.0)
        if QUANT:
            vj = _weighted(v, w, HAS_W)
            inv, scale = row_scales(tl.max(tl.abs(vj), 1))
            store_fp8(dst, vj, inv[:, None], mask, INTERPRET)
            tl.store(scale_ptr + p, scale, mask=ok)
        elif HAS_W:
            tl.store(dst, cast_to(_weighted(v, w, HAS_W), out_ptr.dtype.element_ty, INTERPRET),
                     mask=mask)
        else:
            tl.store(dst, v, mask=mask)


@triton.jit
def _gather_scale_groups_kernel(
    x_ptr,  # [T, D] source rows
    ids_ptr,  # [A] int32/int64 source token of each output row
    w_ptr,  # [A] float32 weights (unused when not HAS_W)
    nv_ptr,  # [1] number of valid rows (unused when not HAS_NV)
    q_ptr,  # [A, D] e4m3 output (uint8 view when INTERPRET)
    scale_ptr,  # [A, G] float32 group scales
    A, D, G,
    HAS_W: tl.constexpr,
    HAS_NV: tl.constexpr,
    INTERPRET: tl.constexpr,
    GROUP: tl.constexpr,  # columns per scale (one program per row and group)
):
    """fp8_block's activations: the gathered row, times its weight rounded to x's dtype (the
    value gather_scale would store), quantized per group of GROUP columns as
    quantize_fp8_groups quantizes that stored row: the same bits as the two passes."""
    row = tl.program_id(0)
    grp = tl.program_id(1)
    valid, tok, w = _row_source(ids_ptr, w_ptr, nv_ptr, row, A, HAS_W, HAS_NV)
    cols = grp * GROUP + tl.arange(0, GROUP)
    mask = (cols < D) & valid
    v = tl.load(x_ptr + tok * D + cols, mask=mask, other=0.0)
    if HAS_W:
        v = cast_to(v.to(tl.float32) * w, x_ptr.dtype.element_ty, INTERPRET)
    scale = store_fp8_group(q_ptr + row.to(tl.int64) * D + cols, v.to(tl.float32), mask,
                            INTERPRET)
    tl.store(scale_ptr + row.to(tl.int64) * G + grp, scale, mask=valid)


def copy_tile(A: int, D: int) -> tuple[int, int, int]:
    """(ROWS, BLOCK_D, num_warps) of the bf16 gather: BLOCK_D the largest power of two <= 2048
    that divides D (no masked tail; 5120 -> 1024), at least 256."""
    block = 2048
    while block > 256 and D % block:
        block //= 2
    block = min(block, next_power_of_2(D))
    return 1, block, 4 if block <= 1024 else 8


def fp8_tile(A: int, D: int) -> tuple[int, int, bool, int]:
    """(ROWS, BLOCK_D, ONE_PASS, num_warps) of the rowwise fp8 gather."""
    block, one_pass = quant_block(D)
    return 1, block, one_pass, 8 if block >= 4096 else 4


MAX_TOKEN_K = 16  # token-major up to this many pairs a token (its loop over them is unrolled)


def tokens_tile(T: int, k: int, D: int, quant: bool) -> tuple[int, int, int] | None:
    """(TOKENS, BLOCK_D, num_warps) of the token-major gather, or None: row-major (k = 1, where
    each row is read once either way; k above MAX_TOKEN_K; an fp8 row too long for registers)."""
    if k == 1 or k > MAX_TOKEN_K:
        return None
    if quant:
        block, one_pass = quant_block(D)
        return (1, block, 8 if block >= 4096 else 4) if one_pass else None
    _, block, warps = copy_tile(T * k, D)
    return 1, block, warps


def _launch_tokens(x: Tensor, positions: Tensor, weights: Optional[Tensor],
                   num_valid: Optional[Tensor], out: Tensor, scale: Optional[Tensor],
                   interpret: bool) -> bool:
    """Launch the token-major gather when positions covers T tokens' pairs (A = T * k) and
    tokens_tile allows it; whether it did."""
    T, (A, D) = x.shape[0], out.shape
    whole = T and positions.shape[0] == A and A % T == 0
    tile = tokens_tile(T, A // T, D, scale is not None) if whole else None
    if tile is None:
        return False
    tokens, block, warps = tile
    launch(_gather_tokens_kernel, (cdiv(T, tokens), cdiv(D, block)),
        x, positions, weights, num_valid, out, scale, T, A, D, K=A // T,
        HAS_W=weights is not None, HAS_NV=num_valid is not None, QUANT=scale is not None,
        INTERPRET=interpret, TOKENS=tokens, BLOCK_D=block, num_warps=warps)
    return True


@kernel_op("gather_scale", mutates_args=("out",))
def _gather_scale_op(x: Tensor, token_ids: Tensor, weights: Optional[Tensor],
                     num_valid: Optional[Tensor], positions: Optional[Tensor],
                     out: Tensor) -> None:
    A, D = out.shape
    if A == 0 or D == 0:
        return
    if positions is not None and _launch_tokens(x, positions, weights, num_valid, out, None,
                                                interpreting()):
        return
    rows, block, warps = copy_tile(A, D)
    launch(_gather_scale_kernel, (cdiv(A, rows), cdiv(D, block)),
        x, token_ids, weights, num_valid, out, A, D,
        HAS_W=weights is not None, HAS_NV=num_valid is not None, INTERPRET=interpreting(),
        ROWS=rows, BLOCK_D=block, num_warps=warps)


@kernel_op("gather_scale_fp8", mutates_args=("q", "scale"))
def _gather_scale_fp8_op(x: Tensor, token_ids: Tensor, weights: Optional[Tensor],
                         num_valid: Optional[Tensor], positions: Optional[Tensor], q: Tensor,
                         scale: Tensor) -> None:
    A, D = q.shape
    if A == 0 or D == 0:
        return
    target, interpret = fp8_target(q)
    if positions is not None and _launch_tokens(x, positions, weights, num_valid, target, scale,
                                                interpret):
        return
    rows, block, one_pass, warps = fp8_tile(A, D)
    launch(_gather_scale_fp8_kernel, (cdiv(A, rows),),
        x, token_ids, weights, num_valid, target, scale, A, D,
        HAS_W=weights is not None, HAS_NV=num_valid is not None, INTERPRET=interpret,
        ROWS=rows, BLOCK_D=block, ONE_PASS=one_pass, num_warps=warps)


@kernel_op("gather_scale_groups", mutates_args=("q", "scale"))
def _gather_scale_groups_op(x: Tensor, token_ids: Tensor, weights: Optional[Tensor],
                            num_valid: Optional[Tensor], q: Tensor, scale: Tensor) -> None:
    A, D = q.shape
    if A == 0 or D == 0:
        return
    target, interpret = fp8_target(q)
    launch(_gather_scale_groups_kernel, (A, scale.shape[1]),
        x, token_ids, weights, num_valid, target, scale, A, D, scale.shape[1],
        HAS_W=weights is not None, HAS_NV=num_valid is not None, INTERPRET=interpret,
        GROUP=FP8_BLOCK, num_warps=1)


def gather_scale(
    x: Tensor,
    token_ids: Tensor,
    weights: Tensor | None,
    num_valid: Tensor | None,
    quantize: bool | str,
    out: Tensor | tuple[Tensor, Tensor] | None,
    positions: Tensor | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """x [T, D], token_ids [A], weights [A] | None -> [A, D] in x's dtype, or (q [A, D] e4m3,
    scale [A] float32) with quantize "rowwise" (or True), (q, scale [A, ceil(D / 128)]) with
    "groups". positions [A = T * k] (token_ids' inverse) lets the kernel go token-major
    (tokens_tile). Arguments were checked by the public function."""
    A, D, mode = token_ids.shape[0], x.shape[1], QUANTIZE_MODES[quantize]
    if mode == "groups":
        if out is None:
            out = (torch.empty(A, D, dtype=FP8_DTYPE, device=x.device),
                   torch.empty(A, cdiv(D, FP8_BLOCK), dtype=torch.float32, device=x.device))
        _gather_scale_groups_op(x, token_ids, weights, num_valid, out[0], out[1])
        return out
    if mode == "rowwise":
        if out is None:
            out = (torch.empty(A, D, dtype=FP8_DTYPE, device=x.device),
                   torch.empty(A, dtype=torch.float32, device=x.device))
        _gather_scale_fp8_op(x, token_ids, weights, num_valid, positions, out[0], out[1])
        return out
    if out is None:
        out = torch.empty(A, D, dtype=x.dtype, device=x.device)
    _gather_scale_op(x, token_ids, weights, num_valid, positions, out)
    return out
