"""The routed experts at decode in two fused launches (after index_shuffle), for small A = T * k:

    decode_gate_up: a = GLU(gather(x) (* w_in) @ W13^T (+ b13))     [A, I]  (+ fp8 rowwise quant)
    decode_down:    out[t] += sum of t's pairs' (a @ W2^T (+ b2)) (* w_out)   [T, D]

With a shared expert's weights (shared_w13 [2I, D], shared_w2 [D, I], in the activations' dtype,
whatever the routed experts' format) the same two launches run it too, as an expert every token
visits: a holds its T rows first (fp8 rowwise: a third output, sa [T, I] in x's dtype, holds
them, unquantized), and down adds each token's shared row before its pairs', rounding once. A
gated one (Qwen2-MoE, Qwen3-Next: shared_gate [1, D]) has down multiply its rows by
sigmoid(x . shared_gate) in its epilogue.

GLU: SwiGLU, or gpt-oss's clamped variant (ops.silu_mul's activation, alpha, limit); b13, b2:
expert biases (gpt-oss).

Split-K spreads a few experts' weights over every SM; see kernel.py for the schedule and
configs.py for when the ``shuffled`` strategy uses it. Weights in the model dtype or one of the
formats of ops/quantize/formats.py: fp8 rowwise and fp8_block keep the layer's w8a8 contract (x
and a quantized per row, or per 128-column group, with ops.quantize's formulas); fp8_w8a16 and
mxfp4 are weight-only, dequantized in registers.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..._checks import INDEX_DTYPES, check_same_device, check_tensor
from .._impl import ops_for, resolve, triton_available
from ..quantize import FP8_BLOCK, FP8_DTYPE
from ..quantize.formats import weight_format
from ..silu_mul.reference import ACTIVATIONS
from . import configs
from .reference import FORMATS, W8A8, WEIGHT_ONLY, activation_of, format_of

X_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _check_routing(counts: Tensor, token_ids: Tensor, E: int) -> int:
    check_tensor("counts", counts, shape=[E], dtypes=INDEX_DTYPES, contiguous=True)
    check_tensor("token_ids", token_ids, dim=1, dtypes=INDEX_DTYPES, contiguous=True)
    return token_ids.shape[0]


def _check_weights(w: Tensor, w_scale: Tensor | None, name: str, x_dtype: torch.dtype,
                   quantization: str | None, K: int) -> str:
    """w [E, N, K as stored] and its scales in ``quantization``'s format (None: fp8_rowwise
    for float8_e4m3fn w, else the activations' dtype; fp8_block's w13 holds the gate rows'
    scale blocks, then the up rows'); returns the format's name."""
    if quantization is not None and quantization not in FORMATS:
        raise ValueError(f"quantization must be one of {FORMATS} for the fused decode kernels, "
                         f"got {quantization!r}")
    quant = format_of(w, quantization)
    fmt = weight_format(quant)
    want = fmt.weight_dtype or x_dtype
    if w.dtype != want:
        raise TypeError(f"{name} must be {want} for quantization={quant!r} with {x_dtype} "
                        f"activations, got {w.dtype}")
    E, N = w.shape[:2]
    if fmt.why_not(N, K):
        raise ValueError(f"{name}: {fmt.why_not(N, K)}")
    if w.shape[2] * fmt.k_per_element != K:
        raise ValueError(f"{name} must be [E, N, {K // fmt.k_per_element}] for K={K} "
                         f"({quant}), got {list(w.shape)}")
    shape = fmt.scale_shape(N, K, N // 2 if name == "w13" and quant == "fp8_block" else None)
    if shape is None:
        if w_scale is not None:
            raise ValueError(f"{name}_scale is not used with quantization={quant!r}")
    else:
        check_tensor(f"{name}_scale", w_scale, shape=[E, *shape], dtypes=(fmt.scale_dtype,),
                     contiguous=True)
    if quant in W8A8 and x_dtype == torch.float32:
        raise TypeError(f"{quant} {name} needs bfloat16 or float16 activations")
    return quant


def _check_bias(bias: Tensor | None, name: str, shape: list[int]) -> None:
    if bias is not None:
        check_tensor(name, bias, shape=shape, dtypes=X_DTYPES, contiguous=True)


def _check_shared(w: Tensor | None, name: str, shape: list[int], dtype: torch.dtype,
                  bias: Tensor | None) -> int:
    """The shared expert's weights (in the activations' dtype) for the routed ones' launches;
    returns its rows of a per token (1, or 0 without one)."""
    if w is None:
        return 0
    check_tensor(name, w, shape=shape, dtypes=(dtype,), contiguous=True)
    if bias is not None:
        raise ValueError(f"{name} is only taken with routed experts without an expert bias")
    return 1


def _check_workspace(workspace: int) -> None:
    if not isinstance(workspace, int) or isinstance(workspace, bool) or workspace < 0:
        raise ValueError(f"workspace must be an int >= 0, got {workspace!r}")


def gate_up_outputs(out, A: int, I: int, dtype: torch.dtype, quant: str, dev: torch.device,
                    shared_rows: int | None = None, fp32: bool = False):
    """decode_gate_up's outputs for weights in the format ``quant``: a [A, I] in x's dtype, or
    for w8a8 (q [A, I], scale [A] (fp8 rowwise) or [A, ceil(I / 128)] (fp8_block)), or for fp8
    rowwise also (a [A, I] float32, None): a's rows unquantized, for decode_down to quantize
    (allocated so with ``fp32``: where configs.down_quantizes); with a shared expert of
    shared_rows (T) rows, a [T + A, I], or (q, scale, sa [T, I] in x's dtype); checked when
    given, else allocated (the shuffled strategy's unchecked call allocates them here)."""
    shared = shared_rows is not None
    if quant in W8A8:
        rowwise = activation_of(quant) == "rowwise"
        scale_shape = [A] if rowwise else [A, -(-I // FP8_BLOCK)]
        if out is None:
            out = ((torch.empty(A, I, dtype=torch.float32, device=dev), None) if fp32 else
                   (torch.empty(A, I, dtype=FP8_DTYPE, device=dev),
                    torch.empty(scale_shape, dtype=torch.float32, device=dev)))
            return out + (torch.empty(shared_rows, I, dtype=dtype, device=dev),) if shared \
                else out
        if not isinstance(out, tuple) or len(out) != 2 + shared:
            raise TypeError(f"out must be a (q, scale, sa) tuple for {quant} w13 and a shared "
                            f"expert" if shared else
                            f"out must be a (q, scale) tuple for {quant} w13")
        if out[1] is None and rowwise:  # a's rows in float32, quantized by decode_down
            check_tensor("out[0]", out[0], shape=[A, I], dtypes=(torch.float32,), device=dev,
                         contiguous=True)
        else:
            check_tensor("out[0]", out[0], shape=[A, I], dtypes=(FP8_DTYPE,), device=dev,
                         contiguous=True)
            check_tensor("out[1]", out[1], shape=scale_shape, dtypes=(torch.float32,),
                         device=dev, contiguous=True)
        if shared:
            check_tensor("out[2]", out[2], shape=[shared_rows, I], dtypes=(dtype,), device=dev,
                         contiguous=True)
        return out
    rows = A + (shared_rows or 0)
    if out is None:
        return torch.empty(rows, I, dtype=dtype, device=dev)
    return check_tensor("out", out, shape=[rows, I], dtypes=(dtype,), device=dev,
                        contiguous=True)


def decode_gate_up(
    x: Tensor,
    w13: Tensor,
    counts: Tensor,
    token_ids: Tensor,
    row_weights: Tensor | None = None,
    *,
    w13_scale: Tensor | None = None,
    w13_bias: Tensor | None = None,
    activation: str = "silu",
    alpha: float = 1.0,
    limit: float | None = None,
    quantization: str | None = None,
    out: Tensor | tuple[Tensor, ...] | None = None,
    workspace: int = 0,
    shared_w13: Tensor | None = None,
    impl: str | None = None,
) -> Tensor | tuple[Tensor, ...]:
    """x [T, D], w13 [E, 2I, D] (gate rows then up rows), counts [E] and token_ids [A] of a
    Routing (pairs sorted by expert, sum(counts) <= A routed), row_weights [A] float32 applied to
    the input rows (Llama 4) -> a = silu(gate) * up [A, I] in x's dtype; with w13_bias [E, 2I]
    (gpt-oss) added to gate and up first, and activation, alpha, limit as ops.silu_mul's (gpt-oss:
    "swiglu_oai", 1.702, 7.0), all in float32 before a is rounded. quantization (the
    weight format, ops/quantize/formats.py; default "fp8_rowwise" for float8_e4m3fn w13, else
    "none"): "fp8_rowwise" (w13_scale [E, 2I] float32) returns (q [A, I] e4m3, scale [A]
    float32), x quantized per row first; "fp8_block" (w13_scale [E, 2 ceil(I / 128),
    ceil(D / 128)] float32: the gate rows' 128 x 128 blocks, then the up rows') returns (q,
    scale [A, ceil(I / 128)]), x and a quantized per 128-column group (fp8_rowwise: out=(a
    [A, I] float32, None) leaves a's rows unquantized, for decode_down to quantize in its
    loads; configs.down_quantizes says where that is faster); "fp8_w8a16" (e4m3 w13, w13_scale [E, 2I]) and "mxfp4"
    (uint8 w13 [E, 2I, D/2], e8m0 w13_scale [E, 2I, D/32]) keep x and a in x's dtype. Rows past
    sum(counts) are not written (out: preallocated outputs). workspace: which buffer of split-K
    arrival words the kernel uses (0, 1, ...): calls that may run at the same time on two
    streams need two. shared_w13 [2I, D] (x's dtype, not quantized, whatever w13's format; no
    expert bias): a shared expert in the same launch, a [T + A, I] with its rows (every
    token's, in order) first; for w8a8 its rows stay in x's dtype, a third output:
    (q [A, I], scale, sa [T, I])."""
    check_tensor("x", x, dim=2, dtypes=X_DTYPES, contiguous=True)
    check_tensor("w13", w13, dim=3, contiguous=True)
    E, two_i = w13.shape[:2]
    if two_i % 2:
        raise ValueError(f"w13 must be [E, 2I, K] (gate rows then up rows), got {list(w13.shape)}")
    A = _check_routing(counts, token_ids, E)
    quant = _check_weights(w13, w13_scale, "w13", x.dtype, quantization, x.shape[1])
    if row_weights is not None:
        check_tensor("row_weights", row_weights, shape=[A], dtypes=(torch.float32,),
                     contiguous=True)
    _check_bias(w13_bias, "w13_bias", [E, two_i])
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {list(ACTIVATIONS)}, got {activation!r}")
    if limit is not None and not limit > 0:
        raise ValueError(f"limit must be None or positive, got {limit}")
    shared = _check_shared(shared_w13, "shared_w13", [two_i, x.shape[1]], x.dtype, w13_bias)
    dev = check_same_device(x=x, w13=w13, counts=counts, token_ids=token_ids,
                            row_weights=row_weights, w13_scale=w13_scale, w13_bias=w13_bias,
                            shared_w13=shared_w13)
    out = gate_up_outputs(out, A, two_i // 2, x.dtype, quant, dev,
                          x.shape[0] if shared else None)
    _check_workspace(workspace)
    return ops_for(resolve(impl, x)).decode_gate_up(
        x, w13, w13_scale, counts, token_ids, row_weights, out, workspace, quant, w13_bias,
        (activation, float(alpha), None if limit is None else float(limit)), shared=shared_w13)


def decode_down(
    a: Tensor | tuple[Tensor, ...],
    w2: Tensor,
    counts: Tensor,
    token_ids: Tensor,
    positions: Tensor,
    out: Tensor,
    row_weights: Tensor | None = None,
    *,
    w2_scale: Tensor | None = None,
    w2_bias: Tensor | None = None,
    quantization: str | None = None,
    accumulate: bool = True,
    workspace: int = 0,
    shared_w2: Tensor | None = None,
    shared_gate: Tensor | None = None,
    gate_input: Tensor | None = None,
    impl: str | None = None,
) -> Tensor:
    """a [A, I] (or the w8a8 (q, scale[, sa]) from decode_gate_up; fp8_rowwise also (a float32,
    None[, sa]), quantized per row here as ops.quantize does), w2 [E, D, I], counts [E],
    token_ids [A], positions [A = T * k] of a Routing; out [T, D] += for each token the sum of
    its routed pairs' a @ w2[e]^T plus w2_bias[e] ([E, D], gpt-oss; times row_weights [A]
    float32, the output weights), in
    float32, rounded once, in a fixed order (no atomics). quantization and w2_scale: as
    decode_gate_up's (mxfp4: uint8 w2 [E, D, I/2]). accumulate=False: out = that sum instead,
    for the tokens with a routed pair (the others' rows keep their values). workspace: as in
    decode_gate_up. shared_w2 [D, I] (the activations' dtype, not quantized, no expert bias): a
    shared expert in the same launch, a [T + A, I] with its rows first, or for fp8 rowwise a =
    (q, scale, sa [T, I]) (as decode_gate_up's shared_w13 makes them), each token's added before
    its pairs'. shared_gate [1, D] with gate_input [T, D] (the layer's input; both in out's
    dtype): Qwen2-MoE's gated shared expert, each token's shared row times
    sigmoid(gate_input[t] . shared_gate) in float32 before the sum; without shared_w2, w2 must
    be the shared expert's alone ([1, D, I], every token routed to it) and every row is gated.
    Returns out."""
    q, a_scale, sa = a, None, None
    packed = isinstance(a, tuple)  # w8a8's (q, scale[, sa]) or fp8 rowwise's (a, None[, sa])
    if packed:
        if len(a) not in (2, 3):
            raise TypeError(f"a must be a tensor, (q, scale) or (q, scale, sa), got a tuple of "
                            f"{len(a)}")
        q, a_scale, sa = (*a, None)[:3]
    fp32_rows = packed and a_scale is None  # fp8 rowwise's rows, quantized here
    check_tensor("a", q, dim=2, dtypes=(torch.float32,) if fp32_rows else
                 X_DTYPES + (FP8_DTYPE,), contiguous=True)
    check_tensor("w2", w2, dim=3, contiguous=True)
    E, D = w2.shape[:2]
    A = _check_routing(counts, token_ids, E)
    check_tensor("out", out, dim=2, dtypes=X_DTYPES, contiguous=True)
    act = out.dtype if packed else q.dtype  # the activations' dtype
    shared = _check_shared(shared_w2, "shared_w2", [D, q.shape[1]], act, w2_bias)
    if (sa is not None) != (packed and bool(shared)):
        raise TypeError("a = (q, scale, sa) goes with w8a8 weights (fp8_rowwise, fp8_block) and "
                        "shared_w2 only")
    if sa is not None:
        check_tensor("a's sa", sa, shape=[out.shape[0], q.shape[1]], dtypes=(act,),
                     contiguous=True)
    s_rows = out.shape[0] if shared and sa is None else 0  # the shared expert's rows of q
    if q.shape[0] != s_rows + A:
        raise ValueError(f"a must have {'T + ' if s_rows else ''}A={s_rows + A} rows (one per "
                         f"{'token, then one per ' if s_rows else ''}pair), got {list(q.shape)}")
    quant = _check_weights(w2, w2_scale, "w2", act, quantization, q.shape[1])
    w8a8 = quant in W8A8
    if (packed and not fp32_rows and q.dtype != FP8_DTYPE) or packed != w8a8 or (
            fp32_rows and quant != "fp8_rowwise"):
        raise TypeError("fp8_rowwise and fp8_block need a = (q, scale) with e4m3 q (fp8_rowwise "
                        "also (a, None) with a float32), and other formats a in the model dtype")
    if a_scale is not None:
        groups = activation_of(quant) == "groups"
        check_tensor("a scale", a_scale, shape=[A, -(-q.shape[1] // FP8_BLOCK)] if groups else [A],
                     dtypes=(torch.float32,), contiguous=True)
    T = out.shape[0]
    if out.shape[1] != D:
        raise ValueError(f"out must be [T, {D}], got {list(out.shape)}")
    check_tensor("positions", positions, shape=[A], dtypes=INDEX_DTYPES, contiguous=True)
    if (T == 0) != (A == 0) or (T and A % T):
        raise ValueError(f"positions must have T * k entries for out's T={T} rows, got {A}")
    if row_weights is not None:
        check_tensor("row_weights", row_weights, shape=[A], dtypes=(torch.float32,),
                     contiguous=True)
    _check_bias(w2_bias, "w2_bias", [E, D])
    if (shared_gate is None) != (gate_input is None):
        raise TypeError("shared_gate and gate_input go together (the gate and the layer's input)")
    if shared_gate is not None:
        check_tensor("shared_gate", shared_gate, shape=[1, D], dtypes=(out.dtype,),
                     contiguous=True)
        check_tensor("gate_input", gate_input, shape=[T, D], dtypes=(out.dtype,),
                     contiguous=True)
        if not shared and E != 1:
            raise ValueError(f"shared_gate without shared_w2 gates every row: w2 must be the "
                             f"shared expert's alone, [1, {D}, I], got {list(w2.shape)}")
    check_same_device(a=q, w2=w2, counts=counts, token_ids=token_ids, positions=positions,
                      out=out, row_weights=row_weights, a_scale=a_scale, w2_scale=w2_scale,
                      w2_bias=w2_bias, shared_w2=shared_w2, sa=sa, shared_gate=shared_gate,
                      gate_input=gate_input)
    if not isinstance(accumulate, bool):
        raise TypeError(f"accumulate must be a bool, got {type(accumulate).__name__}")
    _check_workspace(workspace)
    return ops_for(resolve(impl, q)).decode_down(q, a_scale, w2, w2_scale, counts, token_ids,
                                                  positions, row_weights, out, accumulate,
                                                  workspace, quant, w2_bias, shared=shared_w2,
                                                  shared_a=sa, shared_gate=shared_gate,
                                                  gate_input=gate_input)


def reserve(w13: Tensor, w2: Tensor, workspace: int = 0, quantization: str = "none",
            shared_tokens: int = 0) -> None:
    """Allocate the fused kernels' persistent workspace for these weights (in ``quantization``'s
    format) now, for every A the default Switch fuses, with a shared expert in the same
    launches up to ``shared_tokens`` tokens (kernel.reserve_arrival_words): the layer calls it
    when it gathers its weights on a GPU, outside any CUDA-graph capture and compile trace."""
    if (w13.is_cuda and triton_available() and quantization in FORMATS
            and not torch.cuda.is_current_stream_capturing()):
        from .kernel import reserve_arrival_words  # the kernels' module: it needs triton

        reserve_arrival_words(w13, w2, configs.Switch().max_pairs, workspace,
                              weight_format(quantization).k_per_element, quantization,
                              shared_tokens)


__all__ = ["FORMATS", "WEIGHT_ONLY", "configs", "decode_down", "decode_gate_up", "reserve"]
