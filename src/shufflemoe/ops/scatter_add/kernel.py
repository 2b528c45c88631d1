"""ScatterAdd in Triton: out[token_ids[i]] += y[rows[i]] * weights[i] for every pair i < num_valid,
in place, without materialising an unshuffled tensor (MetaShuffling's ScatterAdd; with ``rows``
its padded form for expert parallelism).

A token's pairs sit at unrelated rows of y, so programs add with atomics (relaxed, one per
element; Hopper adds bf16/fp16 natively). The product is taken in float32 and rounded to out's
dtype before the add, so bf16/fp16 outputs see two roundings where the reference (which sums in
float32) sees one, and the order of a token's k additions is not fixed: results agree with the
reference within the dtype tolerance, bit for bit for float32 with one pair per token. Rows of
invalid pairs are never read (their ``rows`` entries may point anywhere).

The interpreter has no bf16 atomics; it runs programs one at a time, so there a plain
read-modify-write with the same roundings stands in for the atomic.

The token-major form (``token_sum``, given Routing.positions) needs no atomics: a program owns
one token and BLOCK_D columns, sorts the token's k positions, and adds its valid pairs' rows
(through ``rows`` when pair p sits at another row) to out[t] in float32 in ascending position
order, rounding once. Every strategy combines this way, so a rerun gives the same bits. Each y row is read once and each
out row read and written once, with full-width stores; each weighted row is rounded before it
is added (mul.rn, never contracted into an FMA, whoever compiles the kernel), so the result is
the reference's bit for bit (and the atomic reference's on the CPU, whose index_add_ adds a
token's pairs in that order too).
"""

from __future__ import annotations

from typing import Optional

import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice
from torch import Tensor

from .._common import cdiv, next_power_of_2
from .._impl import interpreting, kernel_op
from .._launch import launch
from .._pdl import chain_start, chained
from ..quantize.kernel import cast_to


@triton.jit
def _scatter_add_kernel(
    out_ptr,  # [T, D] added to in place (ACCUMULATE) or written
    y_ptr,  # [R, D] rows to add
    ids_ptr,  # [A] int32/int64 destination token of each pair
    w_ptr,  # [A] float32 weights (unused when not HAS_W)
    nv_ptr,  # [1] number of valid pairs (unused when not HAS_NV)
    rows_ptr,  # [A] row of y holding each pair (unused when not HAS_ROWS: row i)
    D,  # row length
    HAS_W: tl.constexpr,
    HAS_NV: tl.constexpr,
    HAS_ROWS: tl.constexpr,
    INTERPRET: tl.constexpr,  # read-modify-write instead of atomics, integer bf16 rounding
    BLOCK_D: tl.constexpr,  # columns per program (grid axis 1 covers D)
    PDL: tl.constexpr,  # launched with programmatic dependent launch (ops/_pdl.py)
):
    chain_start(PDL)
    i = tl.program_id(0)
    if HAS_NV:
        valid = i < tl.load(nv_ptr)
    else:
        valid = i >= 0
    tok = tl.load(ids_ptr + i, mask=valid, other=0).to(tl.int64)
    if HAS_ROWS:
        src = tl.load(rows_ptr + i, mask=valid, other=0).to(tl.int64)
    else:
        src = i.to(tl.int64)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = (cols < D) & valid
    v = tl.load(y_ptr + src * D + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_W:
        v = v * tl.load(w_ptr + i, mask=valid, other=0.0)
    v = cast_to(v, out_ptr.dtype.element_ty, INTERPRET)
    dst = out_ptr + tok * D + cols
    if INTERPRET:
        new = tl.load(dst, mask=mask, other=0.0).to(tl.float32) + v.to(tl.float32)
        tl.store(dst, cast_to(new, out_ptr.dtype.element_ty, INTERPRET), mask=mask)
    else:
        tl.atomic_add(dst, v, mask=mask, sem="relaxed")


@triton.jit
def _token_sum_kernel(
    out_ptr,  # [T, D] added to in place (ACCUMULATE) or written
    y_ptr,  # [R, D] pair rows
    pos_ptr,  # [T * K] int32/int64: pair p of token t's j-th choice (Routing.positions)
    w_ptr,  # [P] float32 weights, by pair (unused when not HAS_W)
    nv_ptr,  # [1] number of valid pairs (unused when not HAS_NV: P)
    rows_ptr,  # [P] row of y holding pair p (unused when not HAS_ROWS: row p)
    P,  # pairs p can address
    D,  # row length
    K: tl.constexpr,  # pairs per token
    KP: tl.constexpr,  # K rounded up to a power of two
    UNROLL: tl.constexpr,  # unroll the K adds (K <= 16); a loop for the dense strategies' K = E
    HAS_W: tl.constexpr,
    HAS_NV: tl.constexpr,
    HAS_ROWS: tl.constexpr,
    ACCUMULATE: tl.constexpr,  # out += the sum (else out = it)
    INTERPRET: tl.constexpr,  # integer bf16 rounding
    BLOCK_D: tl.constexpr,  # columns per program (grid axis 1 covers D)
    PDL: tl.constexpr,  # launched with programmatic dependent launch (ops/_pdl.py)
):
    chain_start(PDL)
    t = tl.program_id(0).to(tl.int64)
    if HAS_NV:
        n = tl.load(nv_ptr)
    else:
        n = P
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    cmask = cols < D
    dst = out_ptr + t * D + cols
    if ACCUMULATE:
        acc = tl.load(dst, mask=cmask, other=0.0).to(tl.float32)  # [BLOCK_D]
    else:
        acc = tl.zeros([BLOCK_D], tl.float32)
    jj = tl.arange(0, KP)
    pos = tl.load(pos_ptr + t * K + jj, mask=jj < K, other=2**31 - 1).to(tl.int32)  # [KP]
    if K > 1:
        pos = tl.sort(pos)  # ascending: a fixed sum order; padding lanes last
    if UNROLL:
        for j in tl.static_range(K):
            p = tl.sum(tl.where(jj == j, pos, 0), 0)  # the j-th smallest position
            acc += _pair_row(y_ptr, w_ptr, rows_ptr, p, n, cols, cmask, D, HAS_W, HAS_ROWS,
                             INTERPRET)
    else:
        for j in range(K):
            p = tl.sum(tl.where(jj == j, pos, 0), 0)
            acc += _pair_row(y_ptr, w_ptr, rows_ptr, p, n, cols, cmask, D, HAS_W, HAS_ROWS,
                             INTERPRET)
    tl.store(dst, cast_to(acc, out_ptr.dtype.element_ty, INTERPRET), mask=cmask)


@triton.jit
def _pair_row(y_ptr, w_ptr, rows_ptr, p, n, cols, cmask, D, HAS_W: tl.constexpr,
              HAS_ROWS: tl.constexpr, INTERPRET: tl.constexpr):
    """Pair p's row of y (times its weight) in float32; zeros for a pair past num_valid (or a
    negative one), whose row is never read."""
    ok = (p >= 0) & (p < n)
    if HAS_ROWS:
        row = tl.load(rows_ptr + p, mask=ok, other=0).to(tl.int64)
    else:
        row = p.to(tl.int64)
    v = tl.load(y_ptr + row * D + cols, mask=cmask & ok, other=0.0).to(tl.float32)
    if HAS_W:
        w = tl.load(w_ptr + p, mask=ok, other=0.0)
        if INTERPRET:  # (numpy never fuses)
            v = v * w
        else:  # rounded product (mul.rn): never contracted with the add into an FMA
            v = libdevice.mul_rn(v, w)
    return v


def _block(D: int) -> int:
    """Columns per program: the largest power of two <= 2048 dividing D (5120 -> 1024), >= 256."""
    block = 2048
    while block > 256 and D % block:
        block //= 2
    return min(block, next_power_of_2(D))


@kernel_op("scatter_add", mutates_args=("out",))
def _scatter_add_op(out: Tensor, y: Tensor, token_ids: Tensor, weights: Optional[Tensor],
                    num_valid: Optional[Tensor], rows: Optional[Tensor]) -> None:
    A, D = token_ids.shape[0], out.shape[1]
    if A == 0 or D == 0 or y.shape[0] == 0:
        return
    block = _block(D)
    grid = (A, cdiv(D, block))
    launch(_scatter_add_kernel, grid,
        out, y, token_ids, weights, num_valid, rows, D,
        HAS_W=weights is not None, HAS_NV=num_valid is not None, HAS_ROWS=rows is not None,
        INTERPRET=interpreting(), BLOCK_D=block, num_warps=4 if block <= 1024 else 8,
        **chained(y, grid))


@kernel_op("scatter_add_token_major", mutates_args=("out",))
def _token_sum_op(out: Tensor, y: Tensor, positions: Tensor, weights: Optional[Tensor],
                  num_valid: Optional[Tensor], rows: Optional[Tensor], accumulate: bool) -> None:
    (T, D), A = out.shape, positions.shape[0]
    if A == 0 or D == 0:
        return
    k, block = A // T, _block(D)
    # 8 columns a thread: one 16-byte bf16 vector per row (1024 columns: 4 warps, as above).
    grid = (T, cdiv(D, block))
    launch(_token_sum_kernel, grid,
        out, y, positions, weights, num_valid, rows,
        y.shape[0] if rows is None else rows.shape[0], D, K=k, KP=next_power_of_2(k),
        UNROLL=k <= 16, HAS_W=weights is not None, HAS_NV=num_valid is not None,
        HAS_ROWS=rows is not None, ACCUMULATE=accumulate, INTERPRET=interpreting(),
        BLOCK_D=block, num_warps=max(1, min(8, block // 256)), **chained(y, grid))


def scatter_add(
    out: Tensor,
    y: Tensor,
    token_ids: Tensor,
    weights: Tensor | None,
    num_valid: Tensor | None,
    rows: Tensor | None,
) -> Tensor:
    """out [T, D] += y [R, D] rows of valid pairs; returns out. Arguments were checked by the
    public function."""
    _scatter_add_op(out, y, token_ids, weights, num_valid, rows)
    return out


def token_sum(
    out: Tensor,
    y: Tensor,
    positions: Tensor,
    weights: Tensor | None,
    num_valid: Tensor | None,
    rows: Tensor | None = None,
    accumulate: bool = True,
) -> Tensor:
    """out [T, D] += the valid pairs of each token, found through positions [T * k] (not
    accumulate: out = their sum); returns out. Arguments were checked by the public function."""
    _token_sum_op(out, y, positions, weights, num_valid, rows, accumulate)
    return out
