"""Routers: router logits [T, E] -> Routing (token-expert pairs sorted by expert).

Each router kind is a registry entry. The logits are ``x @ router_weight^T`` in the model dtype,
as HF transformers computes them (F.linear; at decode sizes on the GPU one Triton launch,
ops/router: fp32 sums rounded once, as cuBLAS's, in another order), so a patched model routes
as before.

| router        | experts chosen by                          | weight of a chosen expert           |
| ------------- | ------------------------------------------ | ----------------------------------- |
| topk          | top-k of the logits                        | softmax or sigmoid, opt. renormalized |
| llama4        | top-k of the logits                        | sigmoid(logit), applied to the input |
| group_limited | top-k of score + bias inside the best groups | unbiased score, opt. renormalized   |

A group scores the sum of its two best choices (``group_score="top2"``, DeepSeek-V3) or its best
one (``"max"``, DeepSeek-V2's group_limited_greedy); ``round_scores`` rounds the scores to the
logits' dtype before the bias is added (LFM2-MoE takes its sigmoid in bf16).

Every weight is finally multiplied by ``routed_scaling_factor``; with a capacity factor, pairs
past an expert's capacity (in token order) are dropped and counted. Renormalizing with a capacity
factor divides by the kept experts' affinities (``renormalize_over="kept"``, NxD's order: drop,
then normalize) or by the k chosen ones (``"chosen"``: normalize, then drop).

| semantics        | rule                                                                   |
| ---------------- | ---------------------------------------------------------------------- |
| ties             | equal scores go to the lower expert id (top-k and group selection)     |
| capacity         | ceil(capacity_factor * T * k / E) pairs per expert, exact rationals;   |
|                  | an expert keeps its pairs in ascending token order, the rest drop      |
| renormalize      | weights / their sum over the token's kept (default) or chosen experts  |
| dropped pairs    | sit past num_valid, never contribute; weight 0 with "kept"             |
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch
from torch import Tensor

from ._registry import Registry
from .config import MoEConfig
from .ops import backend_for
from .ops.index_shuffle.reference import DEEPSEEK_EPS
from .ops.router.kernel import invariant_router_logits
from .types import Routing

RouterFn = Callable[[Tensor, MoEConfig, Tensor | None], Routing]
ROUTERS: Registry[RouterFn] = Registry("router")


def router_logits(x: Tensor, router_weight: Tensor, dtype: torch.dtype | None = None,
                  bias: Tensor | None = None, batch_invariant: bool = False) -> Tensor:
    """x [T, D], router_weight [E, D], bias [E] (gpt-oss) -> logits [T, E] in ``dtype`` (default:
    x's dtype), as F.linear of x, weight and bias cast to it (DeepSeek-V3's float32 logits of a
    bf16 model). The router kernel reads them as stored and sums exact fp32 upcasts, so at decode
    no cast runs, of the weight least (DeepSeek-V3: 7 MB a layer a call). batch_invariant: through
    the router kernel with one tile at every T, each row computed the same way whatever T (BLAS
    and cuBLAS pick their blocking by shape)."""
    dtype = dtype or x.dtype
    if batch_invariant:
        return invariant_router_logits(x, router_weight, bias, dtype)
    return backend_for(x).router_logits(x, router_weight, bias, dtype)  # decode: one launch


def _renormalize_kept(r: Routing, top_k: int, scaling: float, eps: float = 0.0) -> Routing:
    """Divide each token's kept weights by their sum (+ eps), then scale; dropped pairs weigh 0.
    r's weights are the unnormalized affinities. Found through r.positions: no host sync."""
    A = r.num_pairs
    pos = r.positions.long()  # [A] by pair index t * k + j
    kept = (r.positions < r.num_valid).view(-1, top_k)  # [T, k]
    w = torch.where(kept, r.weights[pos].view(-1, top_k), 0.0)  # [T, k]
    total = w.sum(1, keepdim=True) + eps
    w = torch.where(kept, w / total * scaling, 0.0)
    weights = torch.empty_like(r.weights).scatter_(0, pos, w.view(A))
    return dataclasses.replace(r, weights=weights)


def drops_before_normalizing(cfg: MoEConfig) -> bool:
    """Renormalize over the kept experts, after capacity dropping (a pass over the Routing)."""
    return cfg.renormalize and cfg.capacity_factor is not None and cfg.renormalize_over == "kept"


# Routers call the ops unchecked: MoEConfig validated every option, the layer made the logits.
@ROUTERS.register("topk")
def _topk(logits: Tensor, cfg: MoEConfig, bias: Tensor | None) -> Routing:
    ops = backend_for(logits)
    capacity = cfg.capacity(logits.shape[0])
    if drops_before_normalizing(cfg):
        r = ops.index_shuffle(logits, cfg.top_k, cfg.scoring, False, 1.0, capacity,
                              batch_invariant=cfg.batch_invariant)
        return _renormalize_kept(r, cfg.top_k, cfg.routed_scaling_factor)
    return ops.index_shuffle(logits, cfg.top_k, cfg.scoring, cfg.renormalize,
                             cfg.routed_scaling_factor, capacity,
                             batch_invariant=cfg.batch_invariant)


@ROUTERS.register("llama4")
def _llama4(logits: Tensor, cfg: MoEConfig, bias: Tensor | None) -> Routing:
    return backend_for(logits).index_shuffle(logits, cfg.top_k, "sigmoid", False,
                                             cfg.routed_scaling_factor,
                                             cfg.capacity(logits.shape[0]),
                                             batch_invariant=cfg.batch_invariant)


@ROUTERS.register("group_limited")
def _group_limited(logits: Tensor, cfg: MoEConfig, bias: Tensor | None) -> Routing:
    ops = backend_for(logits)
    capacity = cfg.capacity(logits.shape[0])
    groups = (cfg.n_group, cfg.topk_group)
    if drops_before_normalizing(cfg):
        r = ops.index_shuffle(logits, cfg.top_k, cfg.scoring, False, 1.0, capacity,
                              batch_invariant=cfg.batch_invariant, groups=groups, bias=bias,
                              group_score=cfg.group_score, round_scores=cfg.round_scores)
        return _renormalize_kept(r, cfg.top_k, cfg.routed_scaling_factor, DEEPSEEK_EPS)
    return ops.index_shuffle(logits, cfg.top_k, cfg.scoring, cfg.renormalize,
                             cfg.routed_scaling_factor, capacity,
                             batch_invariant=cfg.batch_invariant, groups=groups, bias=bias,
                             group_score=cfg.group_score, round_scores=cfg.round_scores)


def route(logits: Tensor, cfg: MoEConfig, bias: Tensor | None = None) -> Routing:
    """logits [T, E] -> Routing with A = T * k pairs, for cfg.router."""
    return ROUTERS.get(cfg.router)(logits, cfg, bias)
