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
from .._impl import _is_compiling, inplace_op

_OUTPUTS = ("counts", "token_ids", "expert_ids", "weights", "num_valid", "positions")
DEEPSEEK_EPS = 1e-20  # DeepSeek-V3's renormalization epsilon (HF transformers)
GROUP_BEST = {"top2": 2, "max": 1}  # group_score -> how many best choices a group's score sums


def _exclusive_cumsum(x: Tensor) -> Tensor:
    return x.cumsum(0) - x


def _histogram(bucket: Tensor, bins: int) -> Tensor:
    """[bins] counts of the values 0..bins-1 of bucket (values are in 0..bins-1). bincount on
    the CPU (one op); histc on CUDA, where bincount reads the maximum on the host."""
    if bucket.device.type == "cpu":
        return torch.bincount(bucket, minlength=bins)
    return torch.histc(bucket.int(), bins=bins, min=0, max=bins)


def _place(ids: Tensor, weights: Tensor | None, k: int, E: int, capacity: int | None,
           ids_valid: bool, counts: Tensor, token_ids: Tensor, expert_ids: Tensor,
           out_weights: Tensor, num_valid: Tensor, positions: Tensor) -> None:
    """Write the Routing of pairs ids [A] int64 (pair p = token p // k's choice p % k) with
    weights [A] (None: 1.0) into the given outputs. ids_valid: every id is known to be in [0, E)."""
    A, dev = ids.shape[0], ids.device
    routed = None if ids_valid else (ids >= 0) & (ids < E)
    bucket = ids if routed is None else torch.where(routed, ids, E)  # unrouted share bucket E
    per_bucket = _histogram(bucket, E if routed is None else E + 1)
    if capacity is None:  # a stable sort by bucket is the whole order
        sorted_bucket, order = torch.sort(bucket, stable=True)
        counts.copy_(per_bucket if routed is None else per_bucket[:E])
        torch.floor_divide(order, k, out=token_ids)
        expert_ids.copy_(sorted_bucket if routed is None else ids[order])
        if weights is None:
            out_weights.fill_(1.0)
        elif weights.dtype == torch.float32:
            torch.index_select(weights, 0, order, out=out_weights)
        else:
            out_weights.copy_(weights[order])
        if routed is None:
            num_valid.fill_(A)
        else:
            torch.sum(counts, 0, keepdim=True, dtype=torch.int32, out=num_valid)
        positions.scatter_(0, order, torch.arange(A, dtype=torch.int32, device=dev))
        return
    per_bucket = per_bucket.long()  # [E] or [E + 1]: only unrouted pairs are in bucket E
    order = torch.sort(bucket, stable=True).indices  # [A]: by (bucket, pair index)
    rank = torch.empty_like(order)  # [A]: position of each pair inside its bucket
    rank[order] = torch.arange(A, device=dev) - _exclusive_cumsum(per_bucket)[bucket[order]]
    kept = per_bucket[:E].clamp(max=capacity)
    dropped = per_bucket[:E] - kept
    n_kept, n_dropped = kept.sum(), dropped.sum()
    e = bucket.clamp(max=E - 1)
    not_routed = torch.zeros_like(ids, dtype=torch.bool) if routed is None else ~routed
    pos = torch.where(  # [A]: each pair's place in the sorted order (Routing.positions)
        not_routed,
        n_kept + n_dropped + rank,
        torch.where(
            rank < capacity,
            _exclusive_cumsum(kept)[e] + rank,
            n_kept + _exclusive_cumsum(dropped)[e] + rank - capacity,
        ),
    )
    counts.copy_(kept)
    token_ids[pos] = torch.arange(A, device=dev, dtype=torch.int32) // k
    expert_ids[pos] = ids.int()
    out_weights[pos] = 1.0 if weights is None else weights.float()
    num_valid.copy_(n_kept)
    positions.copy_(pos)


def select_topk(scores: Tensor, top_k: int) -> Tensor:
    """scores [T, E] -> [T, k] int64 expert ids, highest score first, ties to the lower id."""
    if top_k == 1:  # argmax returns the first maximum: the same id, one cheap op (~4 us less)
        return scores.float().argmax(dim=1, keepdim=True)
    return torch.sort(scores.float(), dim=1, descending=True, stable=True).indices[:, :top_k]


def _score(s: Tensor, scoring: str) -> Tensor:
    """The weights' scores of float32 rows s [T, C]: softmax over C, sigmoid, or s itself."""
    if scoring == "softmax":
        return torch.softmax(s, dim=1)
    return torch.sigmoid(s) if scoring == "sigmoid" else s


def _first_kept(value: Tensor, kept: Tensor, n: int) -> Tensor:
    """[T, n] int64 columns of value [T, C]: the kept columns (kept [T, C] bool) before the
    rest, each part by descending value, ties to the lower column (two stable sorts)."""
    order = torch.sort(value, dim=1, descending=True, stable=True).indices
    first = torch.sort(kept.gather(1, order).int(), dim=1, descending=True, stable=True).indices
    return order.gather(1, first[:, :n])


def select_groups(score: Tensor, bias: Optional[Tensor], top_k: int, n_group: int,
                  topk_group: int, group_best: int = 2) -> Tensor:
    """DeepSeek-V3's selection: score [T, E] float32 -> [T, k] int64 expert ids. The choice is
    score + bias; a group (n_group of E / n_group experts each) scores its group_best (2: V3; 1:
    DeepSeek-V2's group_limited_greedy) best choices summed (its one when it has one expert);
    the topk_group best groups are kept, then the k best choices in them, best first. Ties go
    to the lower group, then the lower expert."""
    T, E = score.shape
    choice = score if bias is None else score + bias.float()
    per_group = choice.view(T, n_group, E // n_group)
    best = min(group_best, E // n_group)
    group_score = per_group.topk(best, dim=-1).values.sum(-1)  # [T, n_group]
    every = torch.ones_like(group_score, dtype=torch.bool)
    groups = _first_kept(group_score, every, topk_group)
    kept = torch.zeros_like(every).scatter_(1, groups, True)
    return _first_kept(choice, kept.repeat_interleave(E // n_group, dim=1), top_k)


@inplace_op("index_shuffle_ref", mutates_args=_OUTPUTS)
def _index_shuffle(scores: Tensor, top_k: int, scoring: str, renormalize: bool, scaling: float,
                   capacity: Optional[int], bias: Optional[Tensor], n_group: int,
                   topk_group: int, group_best: int, round_scores: bool, counts: Tensor, token_ids: Tensor, expert_ids: Tensor,
                   weights: Tensor, num_valid: Tensor, positions: Tensor) -> None:
    s = scores.float()
    if n_group:  # DeepSeek-V3: chosen on the score (+ bias) in the best groups
        score = _score(s, scoring)
        if round_scores:  # as computed in the logits' dtype (LFM2-MoE)
            score = score.to(scores.dtype).float()
        ids = select_groups(score, bias, top_k, n_group, topk_group, group_best)
        w = score.gather(1, ids)
    else:  # chosen on the raw scores
        ids = select_topk(s, top_k)  # [T, k]
        w = (torch.softmax(s, dim=1).gather(1, ids) if scoring == "softmax"
             else _score(s.gather(1, ids), scoring))
    if renormalize:
        w = w / (w.sum(dim=1, keepdim=True) + (DEEPSEEK_EPS if n_group else 0.0))
    if scaling != 1.0:
        w = w * scaling
    A = ids.numel()
    _place(ids.reshape(A), w.reshape(A), top_k, s.shape[1], capacity, True, counts, token_ids,
           expert_ids, weights, num_valid, positions)


@inplace_op("sort_by_expert_ref", mutates_args=_OUTPUTS)
def _sort_by_expert(topk_ids: Tensor, num_experts: int, topk_weights: Optional[Tensor],
                    capacity: Optional[int], ids_valid: bool, counts: Tensor, token_ids: Tensor,
                    expert_ids: Tensor, weights: Tensor, num_valid: Tensor,
                    positions: Tensor) -> None:
    T, k = topk_ids.shape
    w = None if topk_weights is None else topk_weights.reshape(T * k)
    _place(topk_ids.reshape(T * k).long(), w, k, num_experts, capacity, ids_valid, counts,
           token_ids, expert_ids, weights, num_valid, positions)


def _empty_routing(A: int, E: int, device: torch.device, all_routed: bool) -> Routing:
    if _is_compiling():  # a custom op's mutated arguments must not alias: one buffer each
        i32 = dict(dtype=torch.int32, device=device)
        ints = (torch.empty(E, **i32), torch.empty(A, **i32), torch.empty(A, **i32),
                torch.empty(1, **i32), torch.empty(A, **i32))
    else:  # eager: one allocation for the five int32 outputs (each costs ~1 us of host time)
        ints = torch.empty(E + 3 * A + 1, dtype=torch.int32, device=device).split_with_sizes(
            [E, A, A, 1, A])
    counts, token_ids, expert_ids, num_valid, positions = ints
    weights = torch.empty(A, dtype=torch.float32, device=device)
    return Routing(counts, token_ids, expert_ids, weights, num_valid, positions, all_routed)


def index_shuffle(
    scores: Tensor,
    top_k: int,
    scoring: str = "none",
    renormalize: bool = False,
    scaling: float = 1.0,
    capacity: int | None = None,
    batch_invariant: bool = False,
    groups: tuple[int, int] | None = None,
    bias: Tensor | None = None,
    group_score: str = "top2",
    round_scores: bool = False,
) -> Routing:
    """scores [T, E] -> Routing. The weight of a pair is its score: softmax(scores)[t, e] |
    sigmoid(scores[t, e]) | scores[t, e], renormalized over the k chosen if asked, times
    ``scaling``. Experts are chosen on the raw scores, or with ``groups`` (n_group,
    topk_group) as DeepSeek-V3 chooses (select_groups: on the score plus ``bias``, in the best
    groups by ``group_score``, the scores rounded to ``scores``' dtype first with round_scores;
    renormalized with its epsilon). batch_invariant changes nothing here: torch's
    softmax and sum reduce each row the same way whatever T, and the chosen are ordered."""
    r = _empty_routing(scores.shape[0] * top_k, scores.shape[1], scores.device, capacity is None)
    n_group, topk_group = groups or (0, 0)
    _index_shuffle(scores, top_k, scoring, renormalize, float(scaling), capacity, bias, n_group,
                   topk_group, GROUP_BEST[group_score], round_scores, *_fields(r))
    return r


def sort_by_expert(
    topk_ids: Tensor,
    num_experts: int,
    topk_weights: Tensor | None = None,
    capacity: int | None = None,
    ids_valid: bool = False,
) -> Routing:
    """topk_ids [T, k] (ids outside [0, E) are not routed) -> Routing with A = T * k pairs.
    ids_valid: the caller knows every id is in [0, E) (a top-k it computed), so nothing is
    masked and, without a capacity, every pair is routed."""
    r = _empty_routing(topk_ids.numel(), num_experts, topk_ids.device,
                       ids_valid and capacity is None)
    _sort_by_expert(topk_ids, num_experts, topk_weights, capacity, ids_valid, *_fields(r))
    return r


def _fields(r: Routing) -> tuple[Tensor, ...]:
    return r.counts, r.token_ids, r.expert_ids, r.weights, r.num_valid, r.positions
