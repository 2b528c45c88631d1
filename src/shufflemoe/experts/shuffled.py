"""MetaShuffling: pairs already sorted by expert -> gather-scale, one grouped GEMM for all experts
(sizes read on the device), SwiGLU, a second grouped GEMM whose epilogue scatter-adds into the
output. No padding, no host sync, static shapes."""

from __future__ import annotations

from ..ops import backend_for
from .base import Experts, expert_gemm, pair_weights, register


@register
class Shuffled(Experts):
    name = "shuffled"
    summary = "sorted pairs, grouped GEMM with on-device sizes, fused scatter-add (no sync)"

    def forward(self, x, routing, weights, out, cfg, before_combine=lambda: None):
        r, w, ops = routing, weights, backend_for(x)
        w_in, w_out = pair_weights(r, cfg)
        nv = None if r.all_routed else r.num_valid  # known: every row is valid
        xs = ops.gather_scale(x, r.token_ids, w_in, nv, w.quantized, None)  # [A, D]
        h = expert_gemm(ops, xs, w.w13, w.w13_scale, r.counts, cfg.dtype)  # [A, 2I]
        a = ops.silu_mul(h, nv, w.quantized, None)  # [A, I]
        before_combine()
        # top-1: each token has one pair, so the scatter needs no atomics
        expert_gemm(ops, a, w.w2, w.w2_scale, r.counts, cfg.dtype, row_weights=w_out,
                    scatter_ids=r.token_ids, out=out, scatter_unique=cfg.top_k == 1,
                    all_rows=r.all_routed)
