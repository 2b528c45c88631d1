"""GatherMul in torch ops: rows of x in routed order, times their routing weight."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .._common import store_rows
from .._impl import inplace_op
from ..quantize.reference import FP8_DTYPE, quantize_fp8_rowwise


def _rows(x: Tensor, token_ids: Tensor, weights: Optional[Tensor]) -> Tensor:
    rows = x.index_select(0, token_ids)  # [A, D]
    if weights is None:
        return rows
    return rows.float() * weights.unsqueeze(1)  # scaled in float32, rounded once


@inplace_op("gather_scale_ref", mutates_args=("out",))
def _gather_scale(x: Tensor, token_ids: Tensor, weights: Optional[Tensor],
                  num_valid: Optional[Tensor], out: Tensor) -> None:
    store_rows(out, _rows(x, token_ids, weights), num_valid)


@inplace_op("gather_scale_fp8_ref", mutates_args=("q", "scale"))
def _gather_scale_fp8(x: Tensor, token_ids: Tensor, weights: Optional[Tensor],
                      num_valid: Optional[Tensor], q: Tensor, scale: Tensor) -> None:
    new_q, new_scale = quantize_fp8_rowwise(_rows(x, token_ids, weights))
    store_rows(q, new_q, num_valid)
    store_rows(scale, new_scale, num_valid)


def gather_scale(
    x: Tensor,
    token_ids: Tensor,
    weights: Tensor | None,
    num_valid: Tensor | None,
    quantize: bool,
    out: Tensor | tuple[Tensor, Tensor] | None,
) -> Tensor | tuple[Tensor, Tensor]:
    """As ops.gather_scale. Rows of a new output past num_valid may hold anything, so they are
    computed like the others rather than masked (three ops fewer)."""
    A, D = token_ids.shape[0], x.shape[1]
    if out is None:
        num_valid = None
        out = ((torch.empty(A, D, dtype=FP8_DTYPE, device=x.device),
                torch.empty(A, dtype=torch.float32, device=x.device)) if quantize
               else torch.empty(A, D, dtype=x.dtype, device=x.device))
    if quantize:
        _gather_scale_fp8(x, token_ids, weights, num_valid, *out)
    else:
        _gather_scale(x, token_ids, weights, num_valid, out)
    return out
