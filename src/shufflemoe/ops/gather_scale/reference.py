"""GatherMul in torch ops: rows of x in routed order, times their routing weight."""

from __future__ import annotations

from torch import Tensor

from .._common import store_rows
from ..quantize.reference import quantize_fp8_rowwise


def gather_scale(
    x: Tensor,
    token_ids: Tensor,
    weights: Tensor | None,
    num_valid: Tensor | None,
    quantize: bool,
    out: Tensor | tuple[Tensor, Tensor] | None,
) -> Tensor | tuple[Tensor, Tensor]:
    rows = x.index_select(0, token_ids.long())  # [A, D]
    if weights is not None:
        rows = rows.float() * weights.float()[:, None]  # scaled in float32, rounded once
    if quantize:
        q, scale = quantize_fp8_rowwise(rows)
        q_out, s_out = out if out is not None else (None, None)
        return store_rows(q_out, q, num_valid), store_rows(s_out, scale, num_valid)
    return store_rows(out, rows.to(x.dtype), num_valid)
