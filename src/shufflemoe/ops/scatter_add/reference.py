"""ScatterAdd in torch ops: out[token_ids[i]] += y[i] * weights[i], summed in float32; and its
token-major form through Routing.positions."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .._common import valid_rows
from .._impl import inplace_op


@inplace_op("scatter_add_ref", mutates_args=("out",))
def _scatter_add(out: Tensor, y: Tensor, token_ids: Tensor, weights: Optional[Tensor],
                 num_valid: Optional[Tensor], rows: Optional[Tensor]) -> None:
    A = token_ids.shape[0]
    if A == 0 or y.shape[0] == 0:
        return
    src = y[:A] if rows is None else y.index_select(0, rows.clamp(0, y.shape[0] - 1))
    contrib = src.float()  # [A, D]
    if weights is not None:
        contrib = contrib * weights.unsqueeze(1)
    mask = valid_rows(A, num_valid, y.device)
    if mask is not None:
        contrib = torch.where(mask.unsqueeze(1), contrib, 0.0)  # also clears poisoned (NaN) rows
    out.copy_(out.float().index_add_(0, token_ids, contrib))


@inplace_op("scatter_add_token_major_ref", mutates_args=("out",))
def _token_sum(out: Tensor, y: Tensor, positions: Tensor, weights: Optional[Tensor],
               num_valid: Optional[Tensor], rows: Optional[Tensor], accumulate: bool) -> None:
    T, A = out.shape[0], positions.shape[0]
    if A == 0:
        return
    P = y.shape[0] if rows is None else rows.shape[0]  # pairs p can address
    pos = positions.long().view(T, A // T).sort(dim=1).values  # [T, k]
    n = P if num_valid is None else num_valid.long()
    valid = (pos >= 0) & (pos < n)  # [T, k]
    pos = pos.clamp(0, max(P - 1, 0))
    row = pos if rows is None else rows.long()[pos].clamp(0, max(y.shape[0] - 1, 0))
    terms = y.index_select(0, row.flatten()).float().view(T, A // T, -1)  # [T, k, D]
    if weights is not None:
        terms = terms * weights[pos].unsqueeze(2)
    terms = torch.where(valid.unsqueeze(2), terms, 0.0)  # also clears poisoned (NaN) rows
    acc = out.float() if accumulate else torch.zeros_like(terms[:, 0])
    for j in range(A // T):  # k sequential adds, not a tree: the sum order is fixed
        acc = acc + terms[:, j]
    out.copy_(acc)


def scatter_add(
    out: Tensor,
    y: Tensor,
    token_ids: Tensor,
    weights: Tensor | None,
    num_valid: Tensor | None,
    rows: Tensor | None,
) -> Tensor:
    """As ops.scatter_add without positions."""
    _scatter_add(out, y, token_ids, weights, num_valid, rows)
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
    """out [T, D] += sum over j of y[rows[p]] * weights[p], p = positions [T * k] in ascending
    order per token, only 0 <= p < num_valid (not accumulate: out = the sum, out's old values
    unread). Float32 from out (or zero) on, one rounding: the kernel's order exactly."""
    _token_sum(out, y, positions, weights, num_valid, rows, accumulate)
    return out
