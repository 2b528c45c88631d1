"""MetaShuffling: pairs already sorted by expert -> gather-scale, one grouped GEMM for all experts
(sizes read on the device; where it pays, _gathers_in_gemm, the GEMM gathers 16-bit rows in
its loads), SwiGLU, a second grouped GEMM whose epilogue adds into the output
(top-1) or writes pair rows that one token-major sum combines (k > 1). No padding, no host sync,
static shapes.

At decode (A = T * k <= ops.moe_decode.configs.Switch.max_pairs) the same pipeline runs as two
fused launches instead of four: gather (+ input weights) in the first GEMM's loads and SwiGLU
(+ fp8 quantization) in its epilogue, the token-major combine in the second's, both splitting K
so that a few experts' weights stream through every SM."""

from __future__ import annotations

from ..ops import backend_for
from ..ops._common import device_name
from ..ops.grouped_gemm import configs as gemm_configs
from ..ops.moe_decode import configs as decode_configs
from ..ops.moe_decode import gate_up_outputs
from ..ops.moe_decode import reference as decode_formats
from .base import Experts, QuantizedRows, expert_gemm, gather_input, glu, pair_weights, register


@register
class Shuffled(Experts):
    name = "shuffled"
    summary = "sorted pairs, grouped GEMM with on-device sizes, fused scatter-add (no sync)"
    batch_invariant = True
    overwrites = True

    def forward(self, x, routing, weights, out, cfg, before_combine=lambda: None,
                overwrite=False, x_ready=False):
        """out += the routed output; overwrite (every pair routed): out = it. x_ready: x was
        written before the routing's launches (the layer's input under local dispatch), so the
        fused decode gate_up may read it before its PDL wait (fp8 rowwise at T = 1: x's amax)."""
        r, w, ops = routing, weights, backend_for(x)
        w_in, w_out = pair_weights(r, cfg)
        # fused kernels only: the torch reference of the fused path composes the same ops as
        # below plus a token-major sum (on the CPU at T = 1, ~100 us more per call)
        atomic = not cfg.deterministic and cfg.top_k > 1  # opt-in: any order of a token's adds
        if (x.shape[0] and ops.name == "triton" and not atomic and _fusable(x, w, cfg)
                and decode_configs.use_fused(r.num_pairs, cfg.top_k, w.quantization,
                                             r.num_experts, cfg.batch_invariant,
                                             device_name(x.device))):
            # unchecked like the rest: the layer made every tensor. I from w13's shape, not
            # w.intermediate_size: torch.compile would guard that property in every layer
            (E, D), I = w.w2.shape[:2], w.w13.shape[1] // 2
            fp32 = decode_configs.down_quantizes(r.num_pairs, E, D, I, w.w2.dtype, x.device,
                                                 w.quantization)
            a = ops.decode_gate_up(x, w.w13, w.w13_scale, r.counts, r.token_ids, w_in,
                                   gate_up_outputs(None, r.num_pairs, I, x.dtype, w.quantization,
                                                   x.device, fp32=fp32), 0,
                                   w.quantization, w.w13_bias, cfg.act, early=x_ready)
            before_combine()
            ops.decode_down(*(a if isinstance(a, tuple) else (a, None)), w.w2, w.w2_scale,
                            r.counts, r.token_ids, r.positions, w_out, out, not overwrite, 0,
                            w.quantization, w.w2_bias)
            return
        nv = None if r.all_routed else r.num_valid  # known: every row is valid
        # rows scaled at the input: GEMM13 gathers them unscaled and scales its sums instead
        scales = _scales_in_gemm(x, w, w_in, r.num_pairs, r.num_experts)
        gathered = scales or _gathers_in_gemm(x, w, w_in, r.num_pairs, r.num_experts)
        xs = x if gathered else gather_input(ops, x, r.token_ids, w_in, w, nv, r.positions)
        ids = r.token_ids if gathered else None
        if not scales and _glu_in_gemm(w, r.num_pairs, r.num_experts, cfg):  # GLU in GEMM13
            a = expert_gemm(ops, xs, w, "w13", r.counts, cfg.dtype, x_ids=ids, glu=cfg.act)
        else:
            h = expert_gemm(ops, xs, w, "w13", r.counts, cfg.dtype, x_ids=ids,
                            row_weights=w_in if scales else None)
            a = glu(ops, h, w, cfg, nv)  # [A, I], quantized as GEMM2 takes it
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


GATHER_MAX_N = 4096  # GEMM13 gathers its rows itself up to this width (2I)
GATHER_MAX_ROWS = 64  # ... and bf16 rows of any width on the 128-row tiles up to this many pairs
# an expert (A / E): past gemm_configs.MID_SWAP_ROWS, below which the GEMM takes swapped tiles


def _gathers_in_gemm(x, w, w_in, num_pairs: int, num_experts: int) -> bool:
    """Whether the unfused path's GEMM13 reads x's rows by id (pointer loads) instead of a copy
    gather_scale writes first (the weights still through TMA; the same bits either way): for rows
    in the model dtype, not scaled at the input, against bf16 or fp8_w8a16 weights where the
    copy's bytes (2 A D) weigh against GEMM13's (A D 2I), 2I <= GATHER_MAX_N; and against bf16
    weights of any width where the pairs average more than gemm_configs.MID_SWAP_ROWS and at
    most GATHER_MAX_ROWS an expert: the 128-row tiles there load 128 rows of x through TMA
    whatever a group holds, the gathering loads skip the rows past it. Measured on an H100
    (benchmarks/results/probe_gather_gemm_ab92b7b.json, the layer in CUDA graphs, the copy's
    time / the gathering GEMM's): Qwen3-30B-A3B (2I = 1536) T = 64 1.009x, 128 1.012x, 2048
    1.063x, 16384 1.12x, fp8_w8a16 T = 64 1.019x; Mixtral TP2 (2I = 14336) 1.004x at T = 64 but
    0.977x at 2048 and fp8_w8a16 0.983x; mxfp4 0.961x (its K steps are bound by the
    conversion). The rows term, on an H200 (probe_decode_glue --set gather / tiles,
    results/probe_decode_glue_gather_87c91ff.json and _tiles_c1bb07b.json, the same method,
    shipped / gathering, us): Mixtral TP2 bf16 T = 224 (56 pairs an expert) 420.8 / 408.0, T =
    256 (64) 413.0 / 407.6; Mixtral TP1 T = 256 (64) 807.1 / 795.3; gpt-oss-120b bf16 T = 2048
    (64) 2022.7 / 1979.4; past 64 pairs it lost at Mixtral TP2 (T = 384, 96 pairs: 446 /
    447-456; T = 1024 818 / 842), on the swapped tiles of <= 48 pairs it costs ~2% (T = 160:
    360.3 / 368.0), and fp8_w8a16 lost at 16-32 (Mixtral TP2 225 / 232, 312 / 320)."""
    if isinstance(x, QuantizedRows) or w_in is not None:
        return False
    if (w.quantization == "none"
            and gemm_configs.MID_SWAP_ROWS * num_experts < num_pairs <= GATHER_MAX_ROWS * num_experts):
        return True
    return w.quantization in ("none", "fp8_w8a16") and w.w13.shape[1] <= GATHER_MAX_N


SCALED_GATHER_MIN_EXPERTS = 64  # GEMM13 gathers rows scaled at the input from this many experts


def _scales_in_gemm(x, w, w_in, num_pairs: int, num_experts: int) -> bool:
    """Whether GEMM13 gathers rows that the router weights scale at the input (Llama 4) unscaled
    and multiplies its fp32 sums by the weights instead (W (s x) = s (W x): bf16 weights, no
    bias), where it is bound by the weights' bytes: many experts of at most 128 rows (more
    than GLU_MAX_ROWS, where the GLU takes the epilogue). H200, GEMM13 alone at T = 16384
    (benchmarks/results/probe_prefill_tiles.json: contiguous rows through TMA / gathered by id
    and scaled in the epilogue, us): Llama 4 Maverick TP8 (128 experts of ~128 rows) 955 / 961
    against the ~88 us copy it saves; Scout TP8 (16 of ~1024: compute bound) 594 / 683, and
    fp8_w8a16 weights lost at both (+68 / +132 us)."""
    rows = num_pairs / max(num_experts, 1)
    return (w_in is not None and not isinstance(x, QuantizedRows) and w.quantization == "none"
            and w.w13_bias is None and num_experts >= SCALED_GATHER_MIN_EXPERTS
            and GLU_MAX_ROWS < rows <= 128)


GLU_MAX_ROWS = 16  # GEMM13 takes the GLU up to this many pairs an expert (A / E)


def _glu_in_gemm(w, num_pairs: int, num_experts: int, cfg) -> bool:
    """Whether GEMM13's epilogue takes the GLU (a [A, I] from its fp32 sums, one rounding: no
    h [A, 2I] stored and read by silu_mul): bf16 weights, at most GLU_MAX_ROWS pairs an expert,
    not in batch-invariant mode (h unrounded would give a row other bits past the limit's T).
    Each tile then holds two weight tiles a K step (gate and up) and two accumulators, which
    pays where the weights' bytes bound the GEMM and loses where its MMAs do. Measured
    (benchmarks/results/probe_gather_gemm_2809e21.json, on an H200: the layer in CUDA graphs,
    silu_mul after / the GLU in the epilogue): Qwen3-30B-A3B T = 64 (4 pairs an expert) 1.004x,
    128 1.016x; Llama 4 Scout TP8 T = 128 1.015x; Mixtral TP2 T = 64 (16) 1.009x; but Qwen3 T =
    2048 (128) 0.80x, 16384 0.88x, Scout T = 16384 0.87x, Maverick 0.98x, Mixtral T = 2048
    0.85x, and fp8_w8a16 0.91x, mxfp4 0.97x at Qwen3 T = 64 (their weight tiles are converted in
    registers, and two a step cost more than the stores saved)."""
    return (w.quantization == "none" and num_pairs <= GLU_MAX_ROWS * num_experts
            and not cfg.batch_invariant)


def _fusable(x, w, cfg) -> bool:
    """The fused decode kernels take bf16/fp16/fp32, the w8a8 fp8 rowwise and fp8_block and the
    weight-only fp8_w8a16 and mxfp4 weights (with expert biases and either GLU), on rows in the
    model dtype (not rows expert parallelism quantized before sending, which run the four-launch
    pipeline)."""
    return not isinstance(x, QuantizedRows) and w.quantization in decode_formats.FORMATS
