"""ScatterAdd in torch ops: out[token_ids[i]] += y[i] * weights[i], summed in float32."""

from __future__ import annotations

import torch
from torch import Tensor

from .._common import valid_rows


def scatter_add(
    out: Tensor,
    y: Tensor,
    token_ids: Tensor,
    weights: Tensor | None,
    num_valid: Tensor | None,
    rows: Tensor | None,
) -> Tensor:
    A = token_ids.shape[0]
    if A == 0 or y.shape[0] == 0:
        return out
    src = y[:A] if rows is None else y.index_select(0, rows.long().clamp(0, y.shape[0] - 1))
    contrib = src.float()  # [A, D]
    if weights is not None:
        contrib = contrib * weights.float()[:, None]
    mask = valid_rows(A, num_valid, y.device)
    if mask is not None:
        contrib = torch.where(mask[:, None], contrib, 0.0)  # also clears poisoned (NaN) rows
    acc = out.float().index_add_(0, token_ids.long(), contrib)
    return out.copy_(acc)
