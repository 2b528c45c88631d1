"""CombineShuffling / SplitShuffling in torch ops (expert parallelism).

Rows arrive from EP source ranks; source rank r's rows for the local experts start at row
starts[r] and are ordered by local expert (counts[r, e] rows for expert e). Combine reorders them
expert-major (all ranks' rows for expert 0, then expert 1, ...: the order a grouped GEMM wants);
split is its inverse. Dense (eager) and padded (graph) forms differ only in ``starts``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._common import store_rows, valid_rows
from .._impl import inplace_op


def _layout(counts: Tensor) -> tuple[Tensor, Tensor]:
    """(em_starts [El, EP]: first expert-major row of segment (e, r);
    rank_offsets [EP, El]: where expert e's rows begin inside rank r's rows)."""
    c = counts.long()
    em = c.t().reshape(-1)
    em_starts = (em.cumsum(0) - em).view(c.shape[1], c.shape[0])
    return em_starts, c.cumsum(1) - c


@inplace_op("combine_shuffling_ref", mutates_args=("out", "totals"))
def _combine(x: Tensor, counts: Tensor, starts: Tensor, out: Tensor, totals: Tensor) -> None:
    EP, El = counts.shape
    n = out.shape[0]
    em_starts, rank_offsets = _layout(counts)
    flat_starts = em_starts.reshape(-1)  # segments in (e, r) order
    i = torch.arange(n, device=x.device)
    seg = (torch.searchsorted(flat_starts, i, right=True) - 1).clamp(min=0)
    e, r = seg // EP, seg % EP
    src = starts.long()[r] + rank_offsets[r, e] + (i - flat_starts[seg])
    total = counts.long().sum().reshape(1)
    valid = valid_rows(n, total, x.device)
    src = torch.where(valid, src, 0).clamp(max=max(x.shape[0] - 1, 0))
    rows = x.index_select(0, src) if x.shape[0] else x.new_zeros(n, x.shape[1])
    store_rows(out, rows, total)
    totals.copy_(counts.sum(0))


@inplace_op("split_shuffling_ref", mutates_args=("out",))
def _split(y: Tensor, counts: Tensor, starts: Tensor, out: Tensor) -> None:
    EP, El = counts.shape
    n = out.shape[0]
    c = counts.long()
    em_starts, rank_offsets = _layout(counts)
    j = torch.arange(n, device=y.device)
    r = (torch.searchsorted(starts.long(), j, right=True) - 1).clamp(min=0)  # [n]
    q = j - starts.long()[r]  # row inside rank r's segment
    rank_ends = c.cumsum(1)  # [EP, El]
    e = torch.searchsorted(rank_ends[r], q[:, None], right=True)[:, 0].clamp(max=El - 1)
    valid = (q >= 0) & (q < rank_ends[r, -1])
    src = em_starts[e, r] + q - rank_offsets[r, e]
    src = torch.where(valid, src, 0).clamp(0, max(y.shape[0] - 1, 0))
    rows = y.index_select(0, src) if y.shape[0] else y.new_zeros(n, y.shape[1])
    out.copy_(torch.where(valid.unsqueeze(1), rows, out))


def combine_shuffling(x: Tensor, counts: Tensor, starts: Tensor,
                      out: Tensor) -> tuple[Tensor, Tensor]:
    """As ops.combine_shuffling, into out (allocated by the caller)."""
    totals = torch.empty(counts.shape[1], dtype=torch.int32, device=x.device)
    _combine(x, counts, starts, out, totals)
    return out, totals


def split_shuffling(y: Tensor, counts: Tensor, starts: Tensor, out: Tensor) -> Tensor:
    """As ops.split_shuffling, into out (allocated by the caller)."""
    _split(y, counts, starts, out)
    return out
