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
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from .._impl import interpreting, kernel_op
from ..quantize.kernel import cast_to


@triton.jit
def _scatter_add_kernel(
    out_ptr,  # [T, D] added to in place
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
):
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


def _block(D: int) -> int:
    """Columns per program: the largest power of two <= 2048 dividing D (5120 -> 1024), >= 256."""
    block = 2048
    while block > 256 and D % block:
        block //= 2
    return min(block, triton.next_power_of_2(D))


@kernel_op("scatter_add", mutates_args=("out",))
def _scatter_add_op(out: Tensor, y: Tensor, token_ids: Tensor, weights: Optional[Tensor],
                    num_valid: Optional[Tensor], rows: Optional[Tensor]) -> None:
    A, D = token_ids.shape[0], out.shape[1]
    if A == 0 or D == 0 or y.shape[0] == 0:
        return
    block = _block(D)
    _scatter_add_kernel[(A, triton.cdiv(D, block))](
        out, y, token_ids, weights, num_valid, rows, D,
        HAS_W=weights is not None, HAS_NV=num_valid is not None, HAS_ROWS=rows is not None,
        INTERPRET=interpreting(), BLOCK_D=block, num_warps=4 if block <= 1024 else 8)


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
