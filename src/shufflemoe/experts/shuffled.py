"""MetaShuffling: pairs already sorted by expert -> gather-scale, one grouped GEMM for all experts
(sizes read on the device), SwiGLU, a second grouped GEMM whose epilogue scatter-adds into the
output. No padding, no host sync, static shapes.

At decode (A = T * k <= ops.moe_decode.configs.Switch.max_pairs) the same pipeline runs as two
fused launches instead of four: gather (+ input weights) in the first GEMM's loads and SwiGLU
(+ fp8 quantization) in its epilogue, the token-major combine in the second's, both splitting K
so that a few experts' weights stream through every SM."""

from __future__ import annotations

from ..ops import scatter_add
from ..ops.moe_decode import configs as decode_configs
from ..ops.moe_decode import decode_down, decode_gate_up
from .base import Experts, QuantizedRows, expert_gemm, gather_input, glu, pair_weights, register


@register
class Shuffled(Experts):
    name = "shuffled"
    summary = "sorted pairs, grouped GEMM with on-device sizes, fused scatter-add (no sync)"
    batch_invariant = True

    def forward(self, x, routing, weights, out, cfg, before_combine=lambda: None):
        r, w = routing, weights
        w_in, w_out = pair_weights(r, cfg)
        if x.shape[0] and _fusable(x, w, cfg) and decode_configs.use_fused(r.num_pairs,
                                                                     cfg.batch_invariant):
            a = decode_gate_up(x, w.w13, r.counts, r.token_ids, w_in, w13_scale=w.w13_scale)
            before_combine()
            decode_down(a, w.w2, r.counts, r.token_ids, r.positions, out, w_out,
                        w2_scale=w.w2_scale)
            return
        xs = gather_input(x, r.token_ids, w_in, w, num_valid=r.num_valid)
        h = expert_gemm(xs, w, "w13", r.counts, cfg.dtype)  # [A, 2I]
        a = glu(h, w, cfg, num_valid=r.num_valid)  # [A, I]
        before_combine()
        if cfg.batch_invariant and cfg.top_k > 1:
            # a fixed order: each token's pairs summed in ascending position (= expert id)
            y = expert_gemm(a, w, "w2", r.counts, cfg.dtype, row_weights=w_out)
            scatter_add(out, y, r.token_ids, num_valid=r.num_valid, positions=r.positions)
            return
        # top-1: each token has one pair, so the scatter needs no atomics
        expert_gemm(a, w, "w2", r.counts, cfg.dtype, row_weights=w_out,
                    scatter_ids=r.token_ids, out=out, scatter_unique=cfg.top_k == 1)


def _fusable(x, w, cfg) -> bool:
    """The fused decode kernels take bf16/fp16/fp32 and fp8 rowwise w8a8 weights with plain
    SwiGLU (no clamp) and no expert biases, on rows in the model dtype (not rows expert
    parallelism quantized before sending); the other cases run the four-launch pipeline."""
    return (not isinstance(x, QuantizedRows) and w.quantization in ("none", "fp8_rowwise")
            and cfg.activation == "silu" and cfg.swiglu_limit is None
            and w.w13_bias is None and w.w2_bias is None)
