"""MetaShuffling: pairs already sorted by expert -> gather-scale, one grouped GEMM for all experts
(sizes read on the device), SwiGLU, a second grouped GEMM whose epilogue scatter-adds into the
output. No padding, no host sync, static shapes.

At decode (A = T * k <= ops.moe_decode.configs.Switch.max_pairs) the same pipeline runs as two
fused launches instead of four: gather (+ input weights) in the first GEMM's loads and SwiGLU
(+ fp8 quantization) in its epilogue, the token-major combine in the second's, both splitting K
so that a few experts' weights stream through every SM."""

from __future__ import annotations

from ..ops import gather_scale, scatter_add, silu_mul
from ..ops.moe_decode import configs as decode_configs
from ..ops.moe_decode import decode_down, decode_gate_up
from .base import Experts, expert_gemm, pair_weights, register


@register
class Shuffled(Experts):
    name = "shuffled"
    summary = "sorted pairs, grouped GEMM with on-device sizes, fused scatter-add (no sync)"
    batch_invariant = True

    def forward(self, x, routing, weights, out, cfg, before_combine=lambda: None):
        r, w = routing, weights
        w_in, w_out = pair_weights(r, cfg)
        # the fused path splits K by the pair count: never in batch-invariant mode
        if x.shape[0] and not cfg.batch_invariant and decode_configs.use_fused(r.num_pairs):
            a = decode_gate_up(x, w.w13, r.counts, r.token_ids, w_in, w13_scale=w.w13_scale)
            before_combine()
            decode_down(a, w.w2, r.counts, r.token_ids, r.positions, out, w_out,
                        w2_scale=w.w2_scale)
            return
        xs = gather_scale(x, r.token_ids, w_in, num_valid=r.num_valid, quantize=w.quantized)
        h = expert_gemm(xs, w.w13, w.w13_scale, r.counts, cfg.dtype)  # [A, 2I]
        a = silu_mul(h, num_valid=r.num_valid, quantize=w.quantized)  # [A, I]
        before_combine()
        if cfg.batch_invariant and cfg.top_k > 1:
            # a fixed order: each token's pairs summed in ascending position (= expert id)
            y = expert_gemm(a, w.w2, w.w2_scale, r.counts, cfg.dtype, row_weights=w_out)
            scatter_add(out, y, r.token_ids, num_valid=r.num_valid, positions=r.positions)
            return
        # top-1: each token has one pair, so the scatter needs no atomics
        expert_gemm(a, w.w2, w.w2_scale, r.counts, cfg.dtype, row_weights=w_out,
                    scatter_ids=r.token_ids, out=out, scatter_unique=cfg.top_k == 1)
