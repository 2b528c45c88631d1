"""Concatenation: counts copied to the host, the exact-size activation (dynamic shape) run through
one grouped matmul whose group sizes come from the host. One launch per GEMM, but a host sync per
layer and shapes that change every step, so no CUDA graph."""

from __future__ import annotations

import torch

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
        tokens = r.token_ids[:n]
        xs = gather_input(x, tokens, None if w_in is None else w_in[:n], w)
        h = expert_gemm(xs, w, "w13", sizes, cfg.dtype)  # [n, 2I]
        a = glu(h, w, cfg)
        before_combine()
        expert_gemm(a, w, "w2", sizes, cfg.dtype,
                    row_weights=None if w_out is None else w_out[:n], scatter_ids=tokens, out=out,
                    scatter_unique=cfg.top_k == 1)
