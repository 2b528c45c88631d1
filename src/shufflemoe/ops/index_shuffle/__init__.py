"""IndexShuffling: routing scores -> token-expert pairs sorted by expert (a Routing)."""

from __future__ import annotations

import torch
from torch import Tensor

from ..._checks import INDEX_DTYPES, check_tensor
from ...types import Routing
from .._impl import ops_for, resolve
from .reference import GROUP_BEST

SCORINGS = ("none", "softmax", "sigmoid")
SCORE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
GROUP_SCORES = tuple(GROUP_BEST)


def _check_capacity(capacity: int | None) -> None:
    if capacity is not None and (not isinstance(capacity, int) or capacity < 0):
        raise ValueError(f"capacity must be None or an int >= 0, got {capacity!r}")


def index_shuffle(
    scores: Tensor,
    top_k: int,
    *,
    scoring: str = "none",
    renormalize: bool = False,
    scaling: float = 1.0,
    capacity: int | None = None,
    groups: tuple[int, int] | None = None,
    bias: Tensor | None = None,
    group_score: str = "top2",
    round_scores: bool = False,
    batch_invariant: bool = False,
    impl: str | None = None,
) -> Routing:
    """Fused top-k + histogram + sort. scores [T, E] (logits or scores) -> Routing, A = T * k.

    scoring: how a chosen expert's weight is computed from the row ("none": the score itself,
    "softmax": softmax over all E, "sigmoid"); renormalize: divide by the sum of the k weights
    (before capacity dropping: routing.py renormalizes over the kept pairs itself); scaling:
    multiply the weights; capacity: keep at most this many pairs per expert (in token order),
    the rest move past ``num_valid``. Experts are chosen on the raw scores, or with ``groups``
    = (n_group, topk_group) as DeepSeek-V3 chooses: on the weights' score plus ``bias`` [E] (a
    correction bias, selection only; None: 0), among the topk_group groups (of E / n_group
    experts) whose two best such choices sum highest (group_score="top2"), or whose best one is
    highest ("max": DeepSeek-V2's group_limited_greedy); renormalizing then adds DeepSeek's 1e-20.
    round_scores (with groups): the scores are rounded to ``scores``' dtype before the bias is
    added, and weigh so (LFM2-MoE's sigmoid in bf16).
    batch_invariant: the kernel tiles a row's reductions the same way whatever T, so a row's
    weights are the same bits in any batch (the reference computes row by row already).
    """
    check_tensor("scores", scores, dim=2, dtypes=SCORE_DTYPES)
    T, E = scores.shape
    if E == 0:
        raise ValueError("scores must have at least one expert column")
    if not isinstance(top_k, int) or not 1 <= top_k <= E:
        raise ValueError(f"top_k must be an int in 1..E={E}, got {top_k!r}")
    if scoring not in SCORINGS:
        raise ValueError(f"scoring must be one of {SCORINGS}, got {scoring!r}")
    _check_capacity(capacity)
    if groups is not None:
        _check_groups(groups, E, top_k)
    if round_scores and groups is None:
        raise ValueError("round_scores rounds the grouped selection's scores: pass groups with it")
    if group_score not in GROUP_SCORES:
        raise ValueError(f"group_score must be one of {GROUP_SCORES}, got {group_score!r}")
    if bias is not None:
        if groups is None:
            raise ValueError("bias steers DeepSeek-V3's grouped selection: pass groups with it")
        check_tensor("bias", bias, shape=[E], dtypes=SCORE_DTYPES, device=scores.device)
    return ops_for(resolve(impl, scores)).index_shuffle(
        scores, top_k, scoring, renormalize, float(scaling), capacity,
        batch_invariant=batch_invariant, groups=groups, bias=bias, group_score=group_score,
        round_scores=round_scores)


def _check_groups(groups: tuple[int, int], E: int, top_k: int) -> None:
    if (not isinstance(groups, tuple) or len(groups) != 2
            or not all(isinstance(v, int) for v in groups)):
        raise TypeError(f"groups must be a tuple (n_group, topk_group) of ints, got {groups!r}")
    n_group, topk_group = groups
    if n_group < 1 or E % n_group:
        raise ValueError(f"groups: n_group must divide E={E}, got {n_group}")
    if not 1 <= topk_group <= n_group:
        raise ValueError(f"groups: topk_group must be in 1..n_group={n_group}, got {topk_group}")
    if top_k > topk_group * (E // n_group):
        raise ValueError(f"top_k={top_k} exceeds the {topk_group * (E // n_group)} experts in "
                         f"groups={groups}'s kept groups")


def sort_by_expert(
    topk_ids: Tensor,
    num_experts: int,
    topk_weights: Tensor | None = None,
    *,
    capacity: int | None = None,
    impl: str | None = None,
) -> Routing:
    """Precomputed top-k: topk_ids [T, k] (ids outside [0, E) are not routed), topk_weights
    [T, k] (None: 1.0) -> Routing with A = T * k pairs, in index_shuffle's order."""
    check_tensor("topk_ids", topk_ids, dim=2, dtypes=INDEX_DTYPES)
    if topk_weights is not None:
        check_tensor("topk_weights", topk_weights, shape=list(topk_ids.shape),
                     dtypes=SCORE_DTYPES, device=topk_ids.device)
    if not isinstance(num_experts, int) or num_experts <= 0:
        raise ValueError(f"num_experts must be a positive int, got {num_experts!r}")
    _check_capacity(capacity)
    return ops_for(resolve(impl, topk_ids)).sort_by_expert(topk_ids, num_experts, topk_weights,
                                                           capacity)


__all__ = ["index_shuffle", "sort_by_expert", "Routing"]
