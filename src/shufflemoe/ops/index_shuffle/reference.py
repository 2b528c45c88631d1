"""IndexShuffling in torch ops: top-k, histogram and a stable sort by expert, all on the device.

Pair order (shared with the kernel, which must reproduce it exactly):
  1. routed pairs, expert-major, ascending token id within an expert;
  2. pairs over an expert's capacity (capacity factor), expert-major, ascending token id;
  3. pairs whose expert id is outside [0, E) (sort_by_expert only), in pair order.
Top-k ties go to the lower expert id.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...types import Routing


def _exclusive_cumsum(x: Tensor) -> Tensor:
    return x.cumsum(0) - x


def sort_by_expert(
    topk_ids: Tensor,
    num_experts: int,
    topk_weights: Tensor | None = None,
    capacity: int | None = None,
) -> Routing:
    """topk_ids [T, k] (ids outside [0, E) are not routed) -> Routing with A = T * k pairs."""
    T, k = topk_ids.shape
    A, E, dev = T * k, num_experts, topk_ids.device
    ids = topk_ids.reshape(A).long()
    routed = (ids >= 0) & (ids < E)
    bucket = torch.where(routed, ids, E)  # [A]; not-routed pairs share the extra bucket E
    per_bucket = torch.zeros(E + 1, dtype=torch.long, device=dev).scatter_add_(
        0, bucket, torch.ones_like(bucket)
    )
    order = torch.sort(bucket, stable=True).indices  # [A]: by (bucket, pair index)
    rank = torch.empty_like(order)  # [A]: position of each pair inside its bucket
    rank[order] = torch.arange(A, device=dev) - _exclusive_cumsum(per_bucket)[bucket[order]]

    counts = per_bucket[:E] if capacity is None else per_bucket[:E].clamp(max=capacity)
    dropped = per_bucket[:E] - counts
    n_kept, n_dropped = counts.sum(), dropped.sum()
    e = bucket.clamp(max=E - 1)
    cap = A if capacity is None else capacity
    pos = torch.where(  # [A]: each pair's place in the sorted order (Routing.positions)
        ~routed,
        n_kept + n_dropped + rank,
        torch.where(
            rank < cap,
            _exclusive_cumsum(counts)[e] + rank,
            n_kept + _exclusive_cumsum(dropped)[e] + rank - cap,
        ),
    )
    token_ids = torch.empty(A, dtype=torch.int32, device=dev)
    token_ids[pos] = torch.arange(A, device=dev, dtype=torch.int32) // k
    expert_ids = torch.empty(A, dtype=torch.int32, device=dev)
    expert_ids[pos] = ids.int()
    weights = torch.empty(A, dtype=torch.float32, device=dev)
    weights[pos] = 1.0 if topk_weights is None else topk_weights.reshape(A).float()
    return Routing(counts.int(), token_ids, expert_ids, weights, n_kept.int().reshape(1),
                   pos.int())


def select_topk(scores: Tensor, top_k: int) -> Tensor:
    """scores [T, E] -> [T, k] int64 expert ids, highest score first, ties to the lower id."""
    return torch.sort(scores.float(), dim=1, descending=True, stable=True).indices[:, :top_k]


def index_shuffle(
    scores: Tensor,
    top_k: int,
    scoring: str = "none",
    renormalize: bool = False,
    scaling: float = 1.0,
    capacity: int | None = None,
) -> Routing:
    """scores [T, E] -> Routing. Experts are chosen on the raw scores; the weight of a pair is
    softmax(scores)[t, e] | sigmoid(scores[t, e]) | scores[t, e], renormalized over the k chosen
    if asked, times ``scaling``."""
    s = scores.float()
    ids = select_topk(s, top_k)  # [T, k]
    if scoring == "softmax":
        w = torch.softmax(s, dim=1).gather(1, ids)
    elif scoring == "sigmoid":
        w = torch.sigmoid(s.gather(1, ids))
    else:
        w = s.gather(1, ids)
    if renormalize:
        w = w / w.sum(dim=1, keepdim=True)
    return sort_by_expert(ids, scores.shape[1], w * scaling, capacity)
