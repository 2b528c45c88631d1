"""GatherMul in torch ops: rows of x in routed order, times their routing weight."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .._common import store_rows
from .._impl import _is_compiling, inplace_op
from ..quantize.reference import (FP8_BLOCK, FP8_DTYPE, QUANTIZE_MODES, quantize_fp8_groups,
                                  quantize_fp8_rowwise)


def _rows(x: Tensor, token_ids: Tensor, weights: Optional[Tensor],
          out: Optional[Tensor] = None) -> Tensor:
    """[A, D] rows of x in routed order, times their weight (in float32, rounded once into out
    when given)."""
    if weights is None:
        return torch.index_select(x, 0, token_ids, out=out)
    return torch.mul(x.index_select(0, token_ids).float(), weights.unsqueeze(1), out=out)


@inplace_op("gather_scale_ref", mutates_args=("out",))
def _gather_scale(x: Tensor, token_ids: Tensor, weights: Optional[Tensor],
                  num_valid: Optional[Tensor], out: Tensor) -> None:
    if num_valid is None:
        _rows(x, token_ids, weights, out)  # straight into out: one op fewer
    else:
        store_rows(out, _rows(x, token_ids, weights), num_valid)


@inplace_op("gather_scale_fp8_ref", mutates_args=("q", "scale"))
def _gather_scale_fp8(x: Tensor, token_ids: Tensor, weights: Optional[Tensor],
                      num_valid: Optional[Tensor], q: Tensor, scale: Tensor,
                      scales: str) -> None:
    """scales "rowwise": one a row of the float32 product; "groups": one a 128-column group of
    the row as gather_scale stores it (rounded to x's dtype), as fp8_block's GEMMs take it. (Not
    named ``mode``: torch.compile's tracing passes a keyword of that name.)"""
    rows = _rows(x, token_ids, weights)
    if scales == "groups":
        new_q, new_scale = quantize_fp8_groups(rows.to(x.dtype))
    else:
        new_q, new_scale = quantize_fp8_rowwise(rows)
    store_rows(q, new_q, num_valid)
    store_rows(scale, new_scale, num_valid)


def gather_scale(
    x: Tensor,
    token_ids: Tensor,
    weights: Tensor | None,
    num_valid: Tensor | None,
    quantize: bool | str,
    out: Tensor | tuple[Tensor, Tensor] | None,
    positions: Tensor | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """As ops.gather_scale (positions, the kernels' token-major hint, is not needed). Rows of a
    new output past num_valid may hold anything, so they are computed like the others rather
    than masked (three ops fewer), in eager straight into the result rather than into an
    allocated output."""
    A, D = token_ids.shape[0], x.shape[1]
    mode = QUANTIZE_MODES[quantize]
    if out is None and mode == "none" and not _is_compiling():
        rows = _rows(x, token_ids, weights)  # eager: no allocation to copy into
        return rows if rows.dtype == x.dtype else rows.to(x.dtype)
    if out is None:
        num_valid = None
        scales = (A,) if mode == "rowwise" else (A, -(-D // FP8_BLOCK))
        out = ((torch.empty(A, D, dtype=FP8_DTYPE, device=x.device),
                torch.empty(scales, dtype=torch.float32, device=x.device)) if mode != "none"
               else torch.empty(A, D, dtype=x.dtype, device=x.device))
    if mode != "none":
        _gather_scale_fp8(x, token_ids, weights, num_valid, *out, mode)
    else:
        _gather_scale(x, token_ids, weights, num_valid, out)
    return out
