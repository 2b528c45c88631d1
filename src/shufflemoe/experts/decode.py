"""The Neuron guide's two decode strategies, for small T where weights dominate the bytes.

all_experts: every expert runs on every token; unrouted (token, expert) pairs get weight 0. No
indirection at all: each expert's weights are read once, in order.
selective: only experts some token picked are loaded: U = min(E, T * k) slots hold the active
experts first (by id), then inactive ones whose group size is 0, so the grouped GEMM never reads
their weights. Pick between them with ``planner.decode_strategy`` (T * k <= alpha * E).
Both run each loaded expert over all T tokens; static shapes, no host sync.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..ops import backend_for
from .base import Experts, expert_gemm, gather_input, glu, register


def _dense_experts(x, r, w, out, cfg, slot_expert: Tensor, slot_sizes: Tensor, before_combine):
    """Run experts slot_expert [U] over all T tokens (slot u covers rows u*T .. u*T + T, and only
    the first sum(slot_sizes) rows are computed)."""
    T, U = x.shape[0], slot_expert.shape[0]
    if T == 0 or U == 0:
        return
    slot_w = r.dense_weights(T)[:, slot_expert.long()].t().reshape(U * T)  # [U*T] 0 if unrouted
    rows = torch.arange(T, device=x.device, dtype=torch.int32).repeat(U)  # [U*T] token of row
    on_input = cfg.apply_router_weight_on_input
    valid = slot_sizes.sum().reshape(1)
    ops = backend_for(x)
    xb = gather_input(ops, x, rows, slot_w if on_input else None, w, num_valid=valid)
    hb = expert_gemm(ops, xb, w, "w13", slot_sizes, cfg.dtype, weight_ids=slot_expert)
    ab = glu(ops, hb, w, cfg, num_valid=valid)
    yb = expert_gemm(ops, ab, w, "w2", slot_sizes, cfg.dtype, weight_ids=slot_expert,
                     row_weights=None if on_input else slot_w)  # [U * T, D]
    # token t's rows u * T + t, summed in slot order (ascending expert id among loaded experts)
    positions = (rows.view(U, T).t() + torch.arange(0, U * T, T, device=x.device,
                                                      dtype=torch.int32)).reshape(U * T)
    before_combine()
    ops.token_sum(out, yb, positions, None, valid, None)


@register
class AllExperts(Experts):
    name = "all_experts"
    summary = "every expert on every token, unrouted pairs weighted 0 (decode, large T*k)"

    def forward(self, x, routing, weights, out, cfg, before_combine=lambda: None):
        E, T = routing.num_experts, x.shape[0]
        slots = torch.arange(E, device=x.device, dtype=torch.int32)
        sizes = torch.full((E,), T, device=x.device, dtype=torch.int32)
        _dense_experts(x, routing, weights, out, cfg, slots, sizes, before_combine)


@register
class Selective(Experts):
    name = "selective"
    summary = "load only the experts in use, each over all tokens (decode, small T*k)"

    def forward(self, x, routing, weights, out, cfg, before_combine=lambda: None):
        E, T = routing.num_experts, x.shape[0]
        U = min(E, routing.num_pairs)
        inactive = (routing.counts == 0).to(torch.int8)
        slots = torch.sort(inactive, stable=True).indices[:U].int()  # active experts first, by id
        sizes = torch.where(routing.counts[slots.long()] > 0, T, 0).int()
        _dense_experts(x, routing, weights, out, cfg, slots, sizes, before_combine)
