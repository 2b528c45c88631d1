"""IndexShuffling in torch ops: top-k, histogram and a stable sort by expert, all on the device.

Pair order (shared with the kernel, which must reproduce it exactly):
  1. routed pairs, expert-major, ascending token id within an expert;
  2. pairs over an expert's capacity (capacity factor), expert-major, ascending token id;
  3. pairs whose expert id is outside [0, E) (sort_by_expert only), in pair order.
Top-k ties go to the lower expert id.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ...types import Routing
from .._impl import inplace_op

_OUTPUTS = ("counts", "token_ids", "expert_ids", "weights", "num_valid", "positions")


def _exclusive_cumsum(x: Tensor) -> Tensor:
    return x.cumsum(0) - x


def _histogram(bucket: Tensor, bins: int) -> Tensor:
    """[bins] counts of the values 0..bins-1 in bucket (others ignored), sync-free on CUDA
    (bincount reads the maximum on the host); histc takes float input on the CPU only."""
    src = bucket.float() if bucket.device.type == "cpu" else bucket.int()
    return torch.histc(src, bins=bins, min=0, max=bins)


def _place(ids: Tensor, weights: Tensor | None, k: int, E: int, capacity: int | None,
           ids_valid: bool, out: Routing) -> None:
    """Write the Routing of pairs ids [A] int64 (pair p = token p // k's choice p % k) with
    weights [A] (None: 1.0) into ``out``. ids_valid: every id is known to be in [0, E)."""
    A = ids.shape[0]
    routed = None if ids_valid else (ids >= 0) & (ids < E)
    bucket = ids if routed is None else torch.where(routed, ids, E)  # unrouted share bucket E
    if capacity is None:  # a stable sort by bucket is the whole order
        sorted_bucket, order = torch.sort(bucket, stable=True)
        out.counts.copy_(_histogram(bucket, E + 1)[:E])
        out.token_ids.copy_(order if k == 1 else order // k)
        out.expert_ids.copy_(sorted_bucket if routed is None else ids[order])
        if weights is None:
            out.weights.fill_(1.0)
        else:
            out.weights.copy_(weights[order])
        if routed is None:
            out.num_valid.fill_(A)
        else:
            torch.sum(out.counts, 0, keepdim=True, dtype=torch.int32, out=out.num_valid)
        out.positions.scatter_(0, order, torch.arange(A, dtype=torch.int32, device=ids.device))
        return
    dev = ids.device
    per_bucket = _histogram(bucket, E + 1).long()
    order = torch.sort(bucket, stable=True).indices  # [A]: by (bucket, pair index)
    rank = torch.empty_like(order)  # [A]: position of each pair inside its bucket
    rank[order] = torch.arange(A, device=dev) - _exclusive_cumsum(per_bucket)[bucket[order]]
    counts = per_bucket[:E].clamp(max=capacity)
    dropped = per_bucket[:E] - counts
    n_kept, n_dropped = counts.sum(), dropped.sum()
    e = bucket.clamp(max=E - 1)
    not_routed = torch.zeros_like(ids, dtype=torch.bool) if routed is None else ~routed
    pos = torch.where(  # [A]: each pair's place in the sorted order (Routing.positions)
        not_routed,
        n_kept + n_dropped + rank,
        torch.where(
            rank < capacity,
            _exclusive_cumsum(counts)[e] + rank,
            n_kept + _exclusive_cumsum(dropped)[e] + rank - capacity,
        ),
    )
    out.counts.copy_(counts)
    out.token_ids[pos] = torch.arange(A, device=dev, dtype=torch.int32) // k
    out.expert_ids[pos] = ids.int()
    out.weights[pos] = 1.0 if weights is None else weights.float()
    out.num_valid.copy_(n_kept)
    out.positions.copy_(pos)


def select_topk(scores: Tensor, top_k: int) -> Tensor:
    """scores [T, E] -> [T, k] int64 expert ids, highest score first, ties to the lower id."""
    return torch.sort(scores.float(), dim=1, descending=True, stable=True).indices[:, :top_k]


@inplace_op("index_shuffle_ref", mutates_args=_OUTPUTS)
def _index_shuffle(scores: Tensor, top_k: int, scoring: str, renormalize: bool, scaling: float,
                   capacity: Optional[int], counts: Tensor, token_ids: Tensor,
                   expert_ids: Tensor, weights: Tensor, num_valid: Tensor,
                   positions: Tensor) -> None:
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
    if scaling != 1.0:
        w = w * scaling
    A = ids.numel()
    _place(ids.reshape(A), w.reshape(A), top_k, s.shape[1], capacity, True,
           Routing(counts, token_ids, expert_ids, weights, num_valid, positions))


@inplace_op("sort_by_expert_ref", mutates_args=_OUTPUTS)
def _sort_by_expert(topk_ids: Tensor, num_experts: int, topk_weights: Optional[Tensor],
                    capacity: Optional[int], counts: Tensor, token_ids: Tensor,
                    expert_ids: Tensor, weights: Tensor, num_valid: Tensor,
                    positions: Tensor) -> None:
    T, k = topk_ids.shape
    w = None if topk_weights is None else topk_weights.reshape(T * k)
    _place(topk_ids.reshape(T * k).long(), w, k, num_experts, capacity, False,
           Routing(counts, token_ids, expert_ids, weights, num_valid, positions))


def _empty_routing(A: int, E: int, device: torch.device) -> Routing:
    i32 = torch.int32
    return Routing(torch.empty(E, dtype=i32, device=device), torch.empty(A, dtype=i32, device=device),
                   torch.empty(A, dtype=i32, device=device),
                   torch.empty(A, dtype=torch.float32, device=device),
                   torch.empty(1, dtype=i32, device=device), torch.empty(A, dtype=i32, device=device))


def index_shuffle(
    scores: Tensor,
    top_k: int,
    scoring: str = "none",
    renormalize: bool = False,
    scaling: float = 1.0,
    capacity: int | None = None,
    batch_invariant: bool = False,
) -> Routing:
    """scores [T, E] -> Routing. Experts are chosen on the raw scores; the weight of a pair is
    softmax(scores)[t, e] | sigmoid(scores[t, e]) | scores[t, e], renormalized over the k chosen
    if asked, times ``scaling``. batch_invariant changes nothing here: torch's softmax and sum
    reduce each row the same way whatever T."""
    r = _empty_routing(scores.shape[0] * top_k, scores.shape[1], scores.device)
    _index_shuffle(scores, top_k, scoring, renormalize, float(scaling), capacity, *_fields(r))
    return r


def sort_by_expert(
    topk_ids: Tensor,
    num_experts: int,
    topk_weights: Tensor | None = None,
    capacity: int | None = None,
) -> Routing:
    """topk_ids [T, k] (ids outside [0, E) are not routed) -> Routing with A = T * k pairs."""
    r = _empty_routing(topk_ids.numel(), num_experts, topk_ids.device)
    _sort_by_expert(topk_ids, num_experts, topk_weights, capacity, *_fields(r))
    return r


def _fields(r: Routing) -> tuple[Tensor, ...]:
    return r.counts, r.token_ids, r.expert_ids, r.weights, r.num_valid, r.positions
