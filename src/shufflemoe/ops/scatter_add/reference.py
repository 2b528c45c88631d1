"""ScatterAdd in torch ops: out[token_ids[i]] += y[i] * weights[i], summed in float32; and its
token-major form through Routing.positions."""

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


def token_sum(
    out: Tensor,
    y: Tensor,
    positions: Tensor,
    weights: Tensor | None,
    num_valid: Tensor | None,
) -> Tensor:
    """out [T, D] += sum over j of y[p] * weights[p], p = positions [T * k] in ascending order per
    token, only p < num_valid. Float32 from out on, one rounding: the kernel's order exactly."""
    T, A = out.shape[0], positions.shape[0]
    if A == 0:
        return out
    pos = positions.long().view(T, A // T).sort(dim=1).values  # [T, k]
    n = A if num_valid is None else num_valid.long()
    valid = (pos >= 0) & (pos < n)  # [T, k]
    pos = pos.clamp(0, A - 1)
    terms = y.index_select(0, pos.flatten()).float().view(T, A // T, -1)  # [T, k, D]
    if weights is not None:
        terms = terms * weights.float()[pos][:, :, None]
    terms = torch.where(valid[:, :, None], terms, 0.0)  # also clears poisoned (NaN) rows
    acc = out.float()
    for j in range(A // T):  # k sequential adds, not a tree: the sum order is fixed
        acc = acc + terms[:, j]
    return out.copy_(acc)
