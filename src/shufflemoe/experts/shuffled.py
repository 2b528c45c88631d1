"""MetaShuffling: pairs already sorted by expert -> gather-scale, one grouped GEMM for all experts
(sizes read on the device), SwiGLU, a second grouped GEMM whose epilogue scatter-adds into the
output. No padding, no host sync, static shapes."""

from __future__ import annotations

from ..ops import silu_mul
from .base import Experts, expert_gemm, gather_input, pair_weights, register


@register
class Shuffled(Experts):
    name = "shuffled"
    summary = "sorted pairs, grouped GEMM with on-device sizes, fused scatter-add (no sync)"

    def forward(self, x, routing, weights, out, cfg, before_combine=lambda: None):
        r, w = routing, weights
        w_in, w_out = pair_weights(r, cfg)
        xs = gather_input(x, r.token_ids, w_in, num_valid=r.num_valid, quantize=w.quantized)
        h = expert_gemm(xs, w.w13, w.w13_scale, r.counts, cfg.dtype)  # [A, 2I]
        a = silu_mul(h, num_valid=r.num_valid, quantize=w.quantized)  # [A, I]
        before_combine()
        # top-1: each token has one pair, so the scatter needs no atomics
        expert_gemm(a, w.w2, w.w2_scale, r.counts, cfg.dtype, row_weights=w_out,
                    scatter_ids=r.token_ids, out=out, scatter_unique=cfg.top_k == 1)
