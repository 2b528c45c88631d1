"""Padding: every expert's tokens padded to the longest expert's count C, one batched matmul over
[E, C, D] (a grouped GEMM with E equal groups). C is read on the host: one sync per layer, and
E * C rows of work however few are real."""

from __future__ import annotations

import torch

from ..ops import backend_for
from .base import Experts, expert_gemm, gather_input, glu, register


@register
class Padded(Experts):
    name = "padded"
    graph_safe = False
    summary = "pad each expert to the max count, batched matmul (1 host sync)"

    def forward(self, x, routing, weights, out, cfg, before_combine=lambda: None):
        r, w = routing, weights
        E, A = r.num_experts, r.num_pairs
        C = int(r.counts.max()) if A else 0  # host sync: the padded length
        if C == 0:
            return
        dev, ops = x.device, backend_for(x)
        e = r.expert_ids.long().clamp(0, E - 1)
        rank = torch.arange(A, device=dev) - r.offsets()[e]
        slot = torch.where(r.valid_mask(), e * C + rank, E * C)  # [A]; dropped pairs -> spare row
        slot_token = torch.zeros(E * C + 1, dtype=torch.int32, device=dev)
        slot_token = slot_token.index_copy_(0, slot, r.token_ids)[: E * C]
        on_input = cfg.apply_router_weight_on_input
        slot_weight = None
        if on_input:  # padding rows get weight 0, so they are zero rows
            slot_weight = torch.zeros(E * C + 1, dtype=torch.float32, device=dev)
            slot_weight = slot_weight.index_copy_(0, slot, r.weights)[: E * C]
        sizes = torch.full((E,), C, dtype=torch.int32, device=dev)
        xb = gather_input(ops, x, slot_token, slot_weight, w)  # [E * C, D]
        hb = expert_gemm(ops, xb, w, "w13", sizes, cfg.dtype)
        ab = glu(ops, hb, w, cfg)
        yb = expert_gemm(ops, ab, w, "w2", sizes, cfg.dtype)  # [E * C, D]
        before_combine()  # pair p's row is slot[p]
        ops.token_sum(out, yb, r.positions, None if on_input else r.weights, r.num_valid, slot)
