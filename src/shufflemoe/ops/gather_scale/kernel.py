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

from .._common import cdiv, device_l2_bytes, next_power_of_2
from .._impl import interpreting, kernel_op
from .._launch import launch
from .._pdl import chain_start, chained
from ..quantize.kernel import (cast_to, fp8_target, quant_block, row_scales, store_fp8,
                               store_fp8_group)
from ..quantize.reference import FP8_BLOCK, FP8_DTYPE, QUANTIZE_MODES


@triton.jit
def _row_source(ids_ptr, w_ptr, nv_ptr, row, HAS_W: tl.constexpr, HAS_NV: tl.constexpr):
    """(valid, source token, weight) of output row ``row``."""
    if HAS_NV:
        valid = row < tl.load(nv_ptr)
    else:
        valid = row >= 0
    tok = tl.load(ids_ptr + row, mask=valid, other=0).to(tl.int64)
    w = 1.0
    if HAS_W:
        w = tl.load(w_ptr + row, mask=valid, other=0.0)
    return valid, tok, w


@triton.jit
def _gather_scale_kernel(
    x_ptr,  # [T, D] source rows
    ids_ptr,  # [A] int32/int64 source token of each output row
    w_ptr,  # [A] float32 weights (unused when not HAS_W)
    nv_ptr,  # [1] number of valid rows (unused when not HAS_NV)
    out_ptr,  # [A, D] output, x's dtype
    D,  # row length
    HAS_W: tl.constexpr,
    HAS_NV: tl.constexpr,
    INTERPRET: tl.constexpr,  # round with integer arithmetic (interpreter casts are wrong)
    BLOCK_D: tl.constexpr,  # columns per program (grid axis 1 covers D)
    PDL: tl.constexpr,  # launched with programmatic dependent launch (ops/_pdl.py)
):
    chain_start(PDL)
    row = tl.program_id(0)
    valid, tok, w = _row_source(ids_ptr, w_ptr, nv_ptr, row, HAS_W, HAS_NV)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = (cols < D) & valid
    v = tl.load(x_ptr + tok * D + cols, mask=mask)
    if HAS_W:
        # one rounding, as the reference
        v = cast_to(v.to(tl.float32) * w, out_ptr.dtype.element_ty, INTERPRET)
    tl.store(out_ptr + row.to(tl.int64) * D + cols, v, mask=mask)


@triton.jit
def _gather_tokens_kernel(
    x_ptr,  # [T, D] source rows
    pos_ptr,  # [T * K] int32/int64: the output row of token t's j-th pair (Routing.positions)
    w_ptr,  # [A] float32 weights, by output row (unused when not HAS_W)
    nv_ptr,  # [1] number of valid rows (unused when not HAS_NV: A)
    out_ptr,  # [A, D] output, x's dtype
    A, D,  # output rows, row length
    K: tl.constexpr,  # pairs a token
    HAS_W: tl.constexpr,
    HAS_NV: tl.constexpr,
    INTERPRET: tl.constexpr,  # round with integer arithmetic (interpreter casts are wrong)
    BLOCK_D: tl.constexpr,  # columns per program (grid axis 1 covers D)
    PDL: tl.constexpr,  # launched with programmatic dependent launch (ops/_pdl.py)
):
    """Token-major: token t's row piece is read once and written to its K pairs' output rows
    (the row-major kernel reads it K times, from DRAM once x outgrows the L2): the same values,
    the product in float32 rounded once."""
    chain_start(PDL)
    t = tl.program_id(0).to(tl.int64)
    if HAS_NV:
        n = tl.load(nv_ptr)
    else:
        n = A
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    cmask = cols < D
    v = tl.load(x_ptr + t * D + cols, mask=cmask)
    for j in tl.static_range(K):
        p = tl.load(pos_ptr + t * K + j)
        ok = (p >= 0) & (p < n)
        mask = cmask & ok
        dst = out_ptr + p.to(tl.int64) * D + cols
        if HAS_W:
            w = tl.load(w_ptr + p, mask=ok, other=0.0)
            tl.store(dst, cast_to(v.to(tl.float32) * w, out_ptr.dtype.element_ty, INTERPRET),
                     mask=mask)
        else:
            tl.store(dst, v, mask=mask)


@triton.jit
def _gather_scale_fp8_kernel(
    x_ptr,  # [T, D] source rows
    ids_ptr,  # [A] int32/int64 source token of each output row
    w_ptr,  # [A] float32 weights (unused when not HAS_W)
    nv_ptr,  # [1] number of valid rows (unused when not HAS_NV)
    q_ptr,  # [A, D] e4m3 output (uint8 view when INTERPRET)
    scale_ptr,  # [A] float32 row scales
    D,  # row length
    HAS_W: tl.constexpr,
    HAS_NV: tl.constexpr,
    INTERPRET: tl.constexpr,  # round with integer arithmetic (interpreter casts are wrong)
    BLOCK_D: tl.constexpr,  # the whole row when ONE_PASS, else a chunk
    ONE_PASS: tl.constexpr,  # the row fits in registers: read it once
    PDL: tl.constexpr,  # launched with programmatic dependent launch (ops/_pdl.py)
):
    chain_start(PDL)
    row = tl.program_id(0)
    valid, tok, w = _row_source(ids_ptr, w_ptr, nv_ptr, row, HAS_W, HAS_NV)
    src = x_ptr + tok * D
    dst = q_ptr + row.to(tl.int64) * D
    offs = tl.arange(0, BLOCK_D)
    if ONE_PASS:
        mask = (offs < D) & valid
        v = tl.load(src + offs, mask=mask, other=0.0).to(tl.float32) * w
        inv, scale = row_scales(tl.max(tl.abs(v), 0))
        store_fp8(dst + offs, v, inv, mask, INTERPRET)
    else:
        # while loops: a range() over a runtime bound fails in the interpreter
        amax = tl.zeros([BLOCK_D], tl.float32)
        c = 0
        while c < D:
            mask = (c + offs < D) & valid
            v = tl.load(src + c + offs, mask=mask, other=0.0).to(tl.float32) * w
            amax = tl.maximum(amax, tl.abs(v))
            c += BLOCK_D
        inv, scale = row_scales(tl.max(amax, 0))
        c = 0
        while c < D:
            mask = (c + offs < D) & valid
            v = tl.load(src + c + offs, mask=mask, other=0.0).to(tl.float32) * w
            store_fp8(dst + c + offs, v, inv, mask, INTERPRET)
            c += BLOCK_D
    tl.store(scale_ptr + row, scale, mask=valid)


@triton.jit
def _gather_tokens_fp8_kernel(
    x_ptr,  # [T, D] source rows
    pos_ptr,  # [T * K] int32/int64: the output row of token t's j-th pair (Routing.positions)
    w_ptr,  # [A] float32 weights, by output row (unused when not HAS_W)
    nv_ptr,  # [1] number of valid rows (unused when not HAS_NV: A)
    q_ptr,  # [A, D] e4m3 output (uint8 view when INTERPRET)
    scale_ptr,  # [A] float32 row scales
    A, D,  # output rows, row length
    K: tl.constexpr,  # pairs a token
    HAS_W: tl.constexpr,
    HAS_NV: tl.constexpr,
    INTERPRET: tl.constexpr,  # round with integer arithmetic (interpreter casts are wrong)
    BLOCK_D: tl.constexpr,  # the whole row (one pass)
    PDL: tl.constexpr,  # launched with programmatic dependent launch (ops/_pdl.py)
):
    """Token-major fp8 rowwise: token t's row is read once and its absolute maximum taken once;
    each of its K rows is then scaled and stored with no reduction of its own. The same bits as
    the row-major kernel: rounding is monotonic and symmetric, so the largest |fl(x_i * w)| is
    fl(max |x_i| * |w|)."""
    chain_start(PDL)
    t = tl.program_id(0).to(tl.int64)
    if HAS_NV:
        n = tl.load(nv_ptr)
    else:
        n = A
    offs = tl.arange(0, BLOCK_D)
    cmask = offs < D
    v = tl.load(x_ptr + t * D + offs, mask=cmask, other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(v), 0)
    for j in tl.static_range(K):
        p = tl.load(pos_ptr + t * K + j)
        ok = (p >= 0) & (p < n)
        vj = v
        aj = amax
        if HAS_W:
            w = tl.load(w_ptr + p, mask=ok, other=0.0)
            vj = v * w
            aj = amax * tl.abs(w)
        inv, scale = row_scales(aj)
        store_fp8(q_ptr + p.to(tl.int64) * D + offs, vj, inv, cmask & ok, INTERPRET)
        tl.store(scale_ptr + p, scale, mask=ok)


@triton.jit
def _gather_scale_groups_kernel(
    x_ptr,  # [T, D] source rows
    ids_ptr,  # [A] int32/int64 source token of each output row
    w_ptr,  # [A] float32 weights (unused when not HAS_W)
    nv_ptr,  # [1] number of valid rows (unused when not HAS_NV)
    q_ptr,  # [A, D] e4m3 output (uint8 view when INTERPRET)
    scale_ptr,  # [A, G] float32 group scales
    D, G,
    HAS_W: tl.constexpr,
    HAS_NV: tl.constexpr,
    INTERPRET: tl.constexpr,
    GROUP: tl.constexpr,  # columns per scale (one program per row and group)
    PDL: tl.constexpr,  # launched with programmatic dependent launch (ops/_pdl.py)
):
    """fp8_block's activations: the gathered row, times its weight rounded to x's dtype (the
    value gather_scale would store), quantized per group of GROUP columns as
    quantize_fp8_groups quantizes that stored row: the same bits as the two passes."""
    chain_start(PDL)
    row = tl.program_id(0)
    grp = tl.program_id(1)
    valid, tok, w = _row_source(ids_ptr, w_ptr, nv_ptr, row, HAS_W, HAS_NV)
    cols = grp * GROUP + tl.arange(0, GROUP)
    mask = (cols < D) & valid
    v = tl.load(x_ptr + tok * D + cols, mask=mask, other=0.0)
    if HAS_W:
        v = cast_to(v.to(tl.float32) * w, x_ptr.dtype.element_ty, INTERPRET)
    scale = store_fp8_group(q_ptr + row.to(tl.int64) * D + cols, v.to(tl.float32), mask,
                            INTERPRET)
    tl.store(scale_ptr + row.to(tl.int64) * G + grp, scale, mask=valid)


def _copy_block(D: int) -> int:
    """Columns per program: the largest power of two <= 2048 that divides D (no masked tail;
    5120 -> 1024), at least 256."""
    block = 2048
    while block > 256 and D % block:
        block //= 2
    return min(block, next_power_of_2(D))


MAX_TOKEN_K = 16  # token-major up to this many pairs a token (its loop over them is unrolled)


def token_k(positions: Optional[Tensor], T: int, A: int) -> int:
    """k, the pairs a token, where positions covers x's T tokens' A = T * k pairs with
    1 < k <= MAX_TOKEN_K (the token-major kernels' range); else 0 (row-major)."""
    if positions is None or not T or positions.shape[0] != A or A % T:
        return 0
    return A // T if 1 < A // T <= MAX_TOKEN_K else 0


def fp8_token_major(k: int, x_bytes: int, device: torch.device) -> bool:
    """Whether the fp8 rowwise gather goes token-major (given positions): at k >= 8, or where
    row-major's reads of x (each row k times, x_bytes * k) exceed twice the L2, which its fp8
    output stream then sweeps clean. Below that, row-major's T * k programs keep more stores in
    flight than T programs storing k rows each. H100 (L2 50 MB), D = 5120, % of copy,
    row-major / token-major (benchmarks/results/probe_fp8_tokens_ade96e0.json):
    x_bytes * k = 42 MB (T = 2048 k = 2) 69.7 / 59.6; 84 MB (T = 2048 k = 4) 64.7 / 61.7,
    (T = 4096 k = 2) 69.3 / 65.1; 168 MB (T = 4096 k = 4) 58.4 / 68.9, (T = 8192 k = 2)
    68.1 / 70.0; T = 2048 k = 8 59.6 / 69.0; T = 16384 k = 4 52.6 / 75.4."""
    return 1 < k <= MAX_TOKEN_K and (k >= 8 or x_bytes * k > 2 * device_l2_bytes(device))


@kernel_op("gather_scale", mutates_args=("out",))
def _gather_scale_op(x: Tensor, token_ids: Tensor, weights: Optional[Tensor],
                     num_valid: Optional[Tensor], positions: Optional[Tensor],
                     out: Tensor) -> None:
    A, D = out.shape
    if A == 0 or D == 0:
        return
    T, block = x.shape[0], _copy_block(D)
    common = dict(HAS_W=weights is not None, HAS_NV=num_valid is not None,
                  INTERPRET=interpreting(), BLOCK_D=block, num_warps=4 if block <= 1024 else 8)
    K = token_k(positions, T, A)
    if K:  # token-major
        grid = (T, cdiv(D, block))
        launch(_gather_tokens_kernel, grid,
            x, positions, weights, num_valid, out, A, D, K=K, **common, **chained(x, grid))
        return
    grid = (A, cdiv(D, block))
    launch(_gather_scale_kernel, grid,
        x, token_ids, weights, num_valid, out, D, **common, **chained(x, grid))


@kernel_op("gather_scale_fp8", mutates_args=("q", "scale"))
def _gather_scale_fp8_op(x: Tensor, token_ids: Tensor, weights: Optional[Tensor],
                         num_valid: Optional[Tensor], positions: Optional[Tensor], q: Tensor,
                         scale: Tensor) -> None:
    A, D = q.shape
    if A == 0 or D == 0:
        return
    target, interpret = fp8_target(q)
    block, one_pass = quant_block(D)
    T = x.shape[0]
    K = token_k(positions, T, A)
    if one_pass and K and fp8_token_major(K, x.nbytes, x.device):
        launch(_gather_tokens_fp8_kernel, (T,),
            x, positions, weights, num_valid, target, scale, A, D, K=K,
            HAS_W=weights is not None, HAS_NV=num_valid is not None, INTERPRET=interpret,
            BLOCK_D=block, num_warps=8 if block > 8192 else 4, **chained(x, (T,)))
        return
    # one pass up to 8192 lanes on 4 warps: 1-4% faster than 8 at D = 5120 over T = 2048 /
    # 16384, k = 1 / 4 (H100, benchmarks/results/probe_movement_88435b6.json)
    launch(_gather_scale_fp8_kernel, (A,),
        x, token_ids, weights, num_valid, target, scale, D,
        HAS_W=weights is not None, HAS_NV=num_valid is not None, INTERPRET=interpret,
        BLOCK_D=block, ONE_PASS=one_pass, num_warps=8 if block > 8192 or not one_pass else 4,
        **chained(x, (A,)))


@kernel_op("gather_scale_groups", mutates_args=("q", "scale"))
def _gather_scale_groups_op(x: Tensor, token_ids: Tensor, weights: Optional[Tensor],
                            num_valid: Optional[Tensor], q: Tensor, scale: Tensor) -> None:
    A, D = q.shape
    if A == 0 or D == 0:
        return
    target, interpret = fp8_target(q)
    launch(_gather_scale_groups_kernel, (A, scale.shape[1]),
        x, token_ids, weights, num_valid, target, scale, D, scale.shape[1],
        HAS_W=weights is not None, HAS_NV=num_valid is not None, INTERPRET=interpret,
        GROUP=FP8_BLOCK, num_warps=1, **chained(x, (A, scale.shape[1])))


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
    "groups". positions [A = T * k] (token_ids' inverse) makes the unquantized gather
    token-major at 1 < k <= MAX_TOKEN_K, and the fp8 rowwise one for rows that fit one pass where
    fp8_token_major says. Arguments were checked by the public function."""
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
