"""Concatenation: counts copied to the host, the exact-size activation (dynamic shape) run through
one grouped matmul whose group sizes come from the host. One launch per GEMM, but a host sync per
layer and shapes that change every step, so no CUDA graph."""

from __future__ import annotations

import torch

from ..ops import backend_for
from .base import Experts, expert_gemm, gather_input, glu, pair_weights, register


@register
class Concat(Experts):
    name = "concat"
    graph_safe = False
    summary = "exact-size concatenated activation, grouped GEMM with host-known sizes (sync)"

    def forward(self, x, routing, weights, out, cfg, before_combine=lambda: None):
        r, w = routing, weights
        counts = r.counts.tolist()  # host sync
        n = sum(counts)
        if n == 0:
            return
        sizes = torch.tensor(counts, dtype=torch.int32, device=x.device)  # host -> device
        w_in, w_out = pair_weights(r, cfg)
        ops = backend_for(x)
        tokens = r.token_ids[:n]
        xs = gather_input(ops, x, tokens, None if w_in is None else w_in[:n], w)
        h = expert_gemm(ops, xs, w, "w13", sizes, cfg.dtype)  # [n, 2I]
        a = glu(ops, h, w, cfg)
        y = expert_gemm(ops, a, w, "w2", sizes, cfg.dtype,
                        row_weights=None if w_out is None else w_out[:n])  # [n, D] pair rows
        before_combine()
        ops.token_sum(out, y, r.positions, None, r.num_valid, None)
