"""Grouped GEMM with group sizes on the device (MetaShuffling's GroupedGEMM).

y[r] = x[r] @ w[g(r)]^T where rows are split into consecutive groups by m_sizes [G] (a device
tensor: no host sync). sum(m_sizes) may be < M: the tail is neither read nor written. Empty
groups load no weights. Weights in any format of ops/quantize/formats.py. Optional epilogues: add
bias[e]; scale row r by row_weights[r]; add or store row r into out[scatter_ids[r]] (so the
second expert GEMM writes straight into the combined output).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..._checks import INDEX_DTYPES, check_same_device, check_tensor
from .._impl import ops_for, resolve
from ..quantize import FP8_BLOCK, FP8_DTYPE
from ..quantize.formats import WeightFormat, weight_format
from ..silu_mul.reference import ACTIVATIONS

DTYPES = (torch.bfloat16, torch.float16, torch.float32, FP8_DTYPE)
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
SCATTERS = ("add", "add_unique", "store")


def grouped_gemm(
    x: Tensor,
    w: Tensor,
    m_sizes: Tensor,
    *,
    x_scale: Tensor | None = None,
    w_scale: Tensor | None = None,
    quantization: str | None = None,
    bias: Tensor | None = None,
    scale_split: int | None = None,
    weight_ids: Tensor | None = None,
    row_weights: Tensor | None = None,
    scatter_ids: Tensor | None = None,
    out: Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    scatter: str = "add",
    all_rows: bool = False,
    x_ids: Tensor | None = None,
    glu: str | tuple[str, float, float | None] | None = None,
    impl: str | None = None,
) -> Tensor:
    """x [M, K], w [W, N, K], m_sizes [G] int32 -> [M, N].

    x_ids [M] (16-bit or float32 x only; x is then [T, K] for any T): row r of the product is
    x[x_ids[r]], gathered in the GEMM's loads instead of ops.gather_scale's pass. Only the ids
    of rows inside the groups are read; they must be in [0, T).

    glu ("silu", "swiglu_oai", or (activation, alpha, limit) as ops.silu_mul's act; 16-bit or
    float32 x only): out [M, N / 2] = act(gate, up) of each row's products with w's first N / 2
    rows (gate) and its last (up), from the float32 sums (bias and fp8_w8a16 scales applied
    first), rounded once: SwiGLU in the epilogue, no [M, N] product stored and read again. Not
    with row_weights or scatter_ids.

    quantization (ops/quantize/formats.py; default "fp8_rowwise" for float8 x, else "none"):
    "fp8_rowwise": x, w e4m3, x_scale [M], w_scale [W, N] float32. "fp8_w8a16": x in bf16/fp16/
    fp32, w e4m3, w_scale [W, N]. "fp8_block": x, w e4m3, x_scale [M, ceil(K/128)], w_scale
    [W, NB, ceil(K/128)] float32, one per 128 x 128 block (scale_split: output rows restart their
    blocks there, w13's up half; NB counts the blocks). "mxfp4": x in bf16/fp16/fp32, w uint8
    [W, N, K/2] (two e2m1 a byte, element 2j in the low nibble), w_scale uint8 [W, N, K/32] e8m0.
    Out is bfloat16 for e4m3 x unless out_dtype says otherwise, else x's dtype.
    bias [W, N]: added to every row of a group of w[e] (before row_weights). weight_ids [G]: group
    g uses w[weight_ids[g]] (default: w[g], then G must equal W). row_weights [M] float32:
    multiply row r. scatter_ids [M]: row r goes to out[scatter_ids[r]] (out [T, N] required,
    updated in place and returned) as ``scatter`` says; otherwise the result goes to out [M, N]
    (allocated when None). scatter: "add" (accumulated, atomically: any order), "add_unique" (the
    caller guarantees that the valid rows' scatter_ids are distinct -- top-1 routing, or one
    expert's rows -- so the kernel adds without atomics, in float32, one rounding; a duplicate
    would race), "store" (distinct ids too; the rows are overwritten, their old values never
    read; rows no valid row reaches keep theirs). all_rows: the caller guarantees sum(m_sizes) ==
    M (no tail), so the torch reference masks nothing.
    """
    check_tensor("x", x, dim=2, dtypes=DTYPES, contiguous=True)
    check_tensor("w", w, dim=3, contiguous=True)
    M, K = x.shape
    if quantization is None:
        quantization = "fp8_rowwise" if x.dtype == FP8_DTYPE else "none"
    fmt = weight_format(quantization)
    W, N = w.shape[:2]
    _check_operands(fmt, x, w, x_scale, w_scale, scale_split)
    if x_ids is not None:
        check_tensor("x_ids", x_ids, dim=1, dtypes=INDEX_DTYPES)
        if fmt.activation != "none":
            raise ValueError(f"x_ids gathers 16-bit or float32 rows only, not the fp8 x of "
                             f"quantization={fmt.name!r} (gather and quantize with gather_scale)")
        M = x_ids.shape[0]
    if glu is not None:
        glu = _glu_act(glu)
        if fmt.activation != "none" or row_weights is not None or scatter_ids is not None:
            raise ValueError("glu needs 16-bit or float32 x and no row_weights or scatter_ids")
        if N % 2:
            raise ValueError(f"glu needs an even N (gate rows, then as many up rows), got {N}")
        N //= 2
    check_tensor("m_sizes", m_sizes, dim=1, dtypes=INDEX_DTYPES)
    G = m_sizes.shape[0]
    if weight_ids is not None:
        check_tensor("weight_ids", weight_ids, shape=[G], dtypes=INDEX_DTYPES)
    elif G != W:
        raise ValueError(f"m_sizes must have one entry per weight matrix ({W}), got {G}")
    out_dtype = out_dtype or (torch.bfloat16 if x.dtype == FP8_DTYPE else x.dtype)
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype must be one of {OUT_DTYPES}, got {out_dtype}")
    if bias is not None:
        check_tensor("bias", bias, shape=[W, w.shape[1]], dtypes=OUT_DTYPES, contiguous=True)
    if row_weights is not None:
        check_tensor("row_weights", row_weights, shape=[M], dtypes=(torch.float32,))
    if scatter_ids is not None:
        check_tensor("scatter_ids", scatter_ids, shape=[M], dtypes=INDEX_DTYPES)
        if out is None:
            raise ValueError("out [T, N] is required when scatter_ids is given")
        check_tensor("out", out, shape=[None, N], dtypes=(out_dtype,), contiguous=True)
    elif out is not None:
        check_tensor("out", out, shape=[M, N], dtypes=(out_dtype,), contiguous=True)
    if scatter not in SCATTERS:
        raise ValueError(f"scatter must be one of {SCATTERS}, got {scatter!r}")
    if scatter != "add" and scatter_ids is None:
        raise ValueError(f"scatter={scatter!r} needs scatter_ids")
    check_same_device(x=x, w=w, m_sizes=m_sizes, x_scale=x_scale, w_scale=w_scale, bias=bias,
                      weight_ids=weight_ids, row_weights=row_weights, scatter_ids=scatter_ids,
                      out=out, x_ids=x_ids)
    return ops_for(resolve(impl, x)).grouped_gemm(x, w, m_sizes, x_scale, w_scale, weight_ids,
                                                  row_weights, scatter_ids, out, out_dtype,
                                                  scatter, quantization, bias, scale_split,
                                                  all_rows, x_ids, glu)


def _glu_act(glu) -> tuple[str, float, float | None]:
    """glu as (activation, alpha, limit)."""
    act = (glu, 1.0, None) if isinstance(glu, str) else tuple(glu)
    if len(act) != 3 or act[0] not in ACTIVATIONS:
        raise ValueError(f"glu must be one of {sorted(ACTIVATIONS)} or (activation, alpha, "
                         f"limit), got {glu!r}")
    return act


def _check_operands(fmt: WeightFormat, x: Tensor, w: Tensor, x_scale: Tensor | None,
                    w_scale: Tensor | None, scale_split: int | None) -> None:
    """x, w and their scales as the weight format ``fmt`` stores them."""
    M, K = x.shape
    W, N, Kw = w.shape
    fp8_x = fmt.activation != "none"
    if fp8_x != (x.dtype == FP8_DTYPE):
        raise TypeError(f"quantization={fmt.name!r} needs x in "
                        f"{'float8_e4m3fn' if fp8_x else 'bfloat16/float16/float32'}, got {x.dtype}")
    if fmt.weight_dtype is None and w.dtype != x.dtype:
        raise TypeError(f"w must have x's dtype {x.dtype}, got {w.dtype}")
    if fmt.weight_dtype is not None and w.dtype != fmt.weight_dtype:
        raise TypeError(f"w must have dtype {fmt.weight_dtype} for quantization={fmt.name!r}, "
                        f"got {w.dtype}")
    if fmt.why_not(N, K):
        raise ValueError(f"x: {fmt.why_not(N, K)}")
    if Kw != K // fmt.k_per_element:
        raise ValueError(f"w must be [W, N, {K // fmt.k_per_element}] for x's K={K} "
                         f"({fmt.name}), got {list(w.shape)}")
    if scale_split is not None and (fmt.name != "fp8_block" or not 0 < scale_split < N):
        raise ValueError(f"scale_split must be None, or in 1..N-1 with fp8_block, got {scale_split}")
    x_scale_shape = {"none": None, "rowwise": [M], "groups": [M, -(-K // FP8_BLOCK)]}[fmt.activation]
    for name, t, shape, dtype in (
            ("x_scale", x_scale, x_scale_shape, torch.float32),
            ("w_scale", w_scale, fmt.scale_shape(N, K, scale_split), fmt.scale_dtype)):
        if shape is None:
            if t is not None:
                raise ValueError(f"{name} is not used with quantization={fmt.name!r}")
        else:
            check_tensor(name, t, shape=[W, *shape] if name == "w_scale" else shape,
                         dtypes=(dtype,), contiguous=True)


__all__ = ["grouped_gemm"]
