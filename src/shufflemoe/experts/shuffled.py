"""MetaShuffling: pairs already sorted by expert -> gather-scale, one grouped GEMM for all experts
(sizes read on the device; 16-bit rows are gathered and scaled in its loads, quantized ones by
gather_scale first), SwiGLU, a second grouped GEMM whose epilogue adds into the output
(top-1) or writes pair rows that one token-major sum combines (k > 1). No padding, no host sync,
static shapes.

At decode (A = T * k <= ops.moe_decode.configs.Switch.max_pairs) the same pipeline runs as two
fused launches instead of four: gather (+ input weights) in the first GEMM's loads and SwiGLU
(+ fp8 quantization) in its epilogue, the token-major combine in the second's, both splitting K
so that a few experts' weights stream through every SM."""

from __future__ import annotations

from ..ops import backend_for
from ..ops.moe_decode import configs as decode_configs
from ..ops.moe_decode import gate_up_outputs
from ..ops.moe_decode import reference as decode_formats
from ..ops.quantize.formats import FORMATS
from .base import Experts, QuantizedRows, expert_gemm, gather_input, glu, pair_weights, register


@register
class Shuffled(Experts):
    name = "shuffled"
    summary = "sorted pairs, grouped GEMM with on-device sizes, fused scatter-add (no sync)"
    batch_invariant = True
    overwrites = True

    def forward(self, x, routing, weights, out, cfg, before_combine=lambda: None,
                overwrite=False):
        """out += the routed output; overwrite (every pair routed): out = it."""
        r, w, ops = routing, weights, backend_for(x)
        w_in, w_out = pair_weights(r, cfg)
        # fused kernels only: the torch reference of the fused path composes the same ops as
        # below plus a token-major sum (on the CPU at T = 1, ~100 us more per call)
        atomic = not cfg.deterministic and cfg.top_k > 1  # opt-in: any order of a token's adds
        if (x.shape[0] and ops.name == "triton" and not atomic and _fusable(x, w, cfg)
                and decode_configs.use_fused(r.num_pairs, cfg.top_k, w.quantization,
                                             r.num_experts, cfg.batch_invariant)):
            # unchecked like the rest: the layer made every tensor
            a = ops.decode_gate_up(x, w.w13, w.w13_scale, r.counts, r.token_ids, w_in,
                                   gate_up_outputs(None, r.num_pairs, w.intermediate_size,
                                                   x.dtype, w.quantization, x.device), 0,
                                   w.quantization, w.w13_bias, cfg.act)
            before_combine()
            ops.decode_down(*(a if isinstance(a, tuple) else (a, None)), w.w2, w.w2_scale,
                            r.counts, r.token_ids, r.positions, w_out, out, not overwrite, 0,
                            w.quantization, w.w2_bias)
            return
        nv = None if r.all_routed else r.num_valid  # known: every row is valid
        if isinstance(x, QuantizedRows) or FORMATS[w.quantization].activation != "none":
            xs = gather_input(ops, x, r.token_ids, w_in, w, nv)  # [A, D], quantized
            h = expert_gemm(ops, xs, w, "w13", r.counts, cfg.dtype)  # [A, 2I]
        else:  # 16-bit rows: gathered (and scaled) in the GEMM's loads, no [A, D] copy
            h = expert_gemm(ops, x, w, "w13", r.counts, cfg.dtype, x_ids=r.token_ids,
                            x_weights=w_in)
        a = glu(ops, h, w, cfg, nv)  # [A, I]
        # top-1: one pair a token, the epilogue adds it without atomics (or stores it: nothing
        # to read); the opt-in atomic combine adds k > 1 rows in any order
        if overwrite and atomic:  # atomics add into out (the layer does not ask for this)
            out.zero_()
        if cfg.top_k == 1 or atomic:
            before_combine()
            scatter = "add" if cfg.top_k > 1 else "store" if overwrite else "add_unique"
            expert_gemm(ops, a, w, "w2", r.counts, cfg.dtype, row_weights=w_out,
                        scatter_ids=r.token_ids, out=out, scatter=scatter, all_rows=r.all_routed)
            return
        # k > 1: pair rows, then each token's rows summed in a fixed order (base.py)
        y = expert_gemm(ops, a, w, "w2", r.counts, cfg.dtype, row_weights=w_out,
                        all_rows=r.all_routed)  # [A, D]
        before_combine()
        ops.token_sum(out, y, r.positions, None, nv, None, not overwrite)


def _fusable(x, w, cfg) -> bool:
    """The fused decode kernels take bf16/fp16/fp32, the w8a8 fp8 rowwise and fp8_block and the
    weight-only fp8_w8a16 and mxfp4 weights (with expert biases and either GLU), on rows in the
    model dtype (not rows expert parallelism quantized before sending, which run the four-launch
    pipeline)."""
    return not isinstance(x, QuantizedRows) and w.quantization in decode_formats.FORMATS
