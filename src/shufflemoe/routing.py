"""Routers: router logits [T, E] -> Routing (token-expert pairs sorted by expert).

Each router kind is a registry entry. The logits come from ``F.linear(x, router_weight)`` in the
model dtype, the way HF transformers computes them, so a patched model routes exactly as before.

| router        | experts chosen by                          | weight of a chosen expert           |
| ------------- | ------------------------------------------ | ----------------------------------- |
| topk          | top-k of the logits                        | softmax or sigmoid, opt. renormalized |
| llama4        | top-k of the logits                        | sigmoid(logit), applied to the input |
| group_limited | top-k of score + bias inside the best groups | unbiased score, opt. renormalized   |

Every weight is finally multiplied by ``routed_scaling_factor``; with a capacity factor, pairs
past an expert's capacity (in token order) are dropped and counted.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ._registry import Registry
from .config import MoEConfig
from .ops import backend_for
from .types import Routing

RouterFn = Callable[[Tensor, MoEConfig, Tensor | None], Routing]
ROUTERS: Registry[RouterFn] = Registry("router")


def router_logits(x: Tensor, router_weight: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """x [T, D], router_weight [E, D] -> logits [T, E] in ``dtype`` (default: x's dtype)."""
    if dtype is not None and dtype != x.dtype:
        x, router_weight = x.to(dtype), router_weight.to(dtype)
    return F.linear(x, router_weight)


# Routers call the ops unchecked: MoEConfig validated every option, the layer made the logits.
@ROUTERS.register("topk")
def _topk(logits: Tensor, cfg: MoEConfig, bias: Tensor | None) -> Routing:
    return backend_for(logits).index_shuffle(logits, cfg.top_k, cfg.scoring, cfg.renormalize,
                                             cfg.routed_scaling_factor,
                                             cfg.capacity(logits.shape[0]))


@ROUTERS.register("llama4")
def _llama4(logits: Tensor, cfg: MoEConfig, bias: Tensor | None) -> Routing:
    return backend_for(logits).index_shuffle(logits, cfg.top_k, "sigmoid", False,
                                             cfg.routed_scaling_factor,
                                             cfg.capacity(logits.shape[0]))


def group_limited_topk(
    logits: Tensor, cfg: MoEConfig, bias: Tensor | None
) -> tuple[Tensor, Tensor]:
    """DeepSeek-V3 selection -> (topk_ids [T, k] int64, topk_weights [T, k] float32)."""
    T, E = logits.shape
    scores = torch.softmax(logits.float(), -1) if cfg.scoring == "softmax" else logits.float().sigmoid()
    choice = scores if bias is None else scores + bias.float()  # the bias steers selection only
    per_group = choice.view(T, cfg.n_group, E // cfg.n_group)
    # A group scores the sum of its two best experts (its best one when a group has one expert).
    group_score = per_group.topk(min(2, E // cfg.n_group), dim=-1).values.sum(-1)
    groups = group_score.topk(cfg.topk_group, dim=-1, sorted=False).indices  # [T, topk_group]
    drop = torch.ones_like(group_score, dtype=torch.bool).scatter_(1, groups, False)  # [T, n_group]
    drop = drop[:, :, None].expand_as(per_group).reshape(T, E)
    ids = choice.masked_fill(drop, float("-inf")).topk(cfg.top_k, dim=-1, sorted=False).indices
    weights = scores.gather(1, ids)
    if cfg.renormalize:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    return ids, weights * cfg.routed_scaling_factor


@ROUTERS.register("group_limited")
def _group_limited(logits: Tensor, cfg: MoEConfig, bias: Tensor | None) -> Routing:
    ids, weights = group_limited_topk(logits, cfg, bias)
    return backend_for(ids).sort_by_expert(ids, cfg.num_experts, weights,
                                           cfg.capacity(logits.shape[0]), True)


def route(logits: Tensor, cfg: MoEConfig, bias: Tensor | None = None) -> Routing:
    """logits [T, E] -> Routing with A = T * k pairs, for cfg.router."""
    return ROUTERS.get(cfg.router)(logits, cfg, bias)
