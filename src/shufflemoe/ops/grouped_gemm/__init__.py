"""Grouped GEMM with group sizes on the device (MetaShuffling's GroupedGEMM).

y[r] = x[r] @ w[g(r)]^T where rows are split into consecutive groups by m_sizes [G] (a device
tensor: no host sync). sum(m_sizes) may be < M: the tail is neither read nor written. Empty
groups load no weights. Optional epilogues: scale row r by row_weights[r]; scatter-add row r into
out[scatter_ids[r]] (so the second expert GEMM writes straight into the combined output).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..._checks import INDEX_DTYPES, check_same_device, check_tensor
from .._impl import ops_for, resolve
from ..quantize import FP8_DTYPE

DTYPES = (torch.bfloat16, torch.float16, torch.float32, FP8_DTYPE)
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def grouped_gemm(
    x: Tensor,
    w: Tensor,
    m_sizes: Tensor,
    *,
    x_scale: Tensor | None = None,
    w_scale: Tensor | None = None,
    weight_ids: Tensor | None = None,
    row_weights: Tensor | None = None,
    scatter_ids: Tensor | None = None,
    out: Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    scatter_unique: bool = False,
    impl: str | None = None,
) -> Tensor:
    """x [M, K], w [W, N, K], m_sizes [G] int32 -> [M, N].

    x_scale [M] / w_scale [W, N] float32: fp8 rowwise (x and w float8_e4m3fn, out bfloat16 unless
    out_dtype says otherwise). weight_ids [G]: group g uses w[weight_ids[g]] (default: w[g], then
    G must equal W). row_weights [M] float32: multiply row r. scatter_ids [M]: add row r into
    out[scatter_ids[r]] (out [T, N] required, accumulated in place and returned); otherwise the
    result goes to out [M, N] (allocated when None). scatter_unique: the caller guarantees that
    the valid rows' scatter_ids are distinct (top-1 routing, or one expert's rows), so the kernel
    may add without atomics (in float32, one rounding); a duplicate would race.
    """
    check_tensor("x", x, dim=2, dtypes=DTYPES, contiguous=True)
    check_tensor("w", w, dim=3, dtypes=DTYPES, contiguous=True)
    M, K = x.shape
    W, N, Kw = w.shape
    if Kw != K:
        raise ValueError(f"w must be [W, N, K] with K={K} (x's columns), got {list(w.shape)}")
    check_tensor("m_sizes", m_sizes, dim=1, dtypes=INDEX_DTYPES)
    G = m_sizes.shape[0]
    if weight_ids is not None:
        check_tensor("weight_ids", weight_ids, shape=[G], dtypes=INDEX_DTYPES)
    elif G != W:
        raise ValueError(f"m_sizes must have one entry per weight matrix ({W}), got {G}")
    fp8 = x.dtype == FP8_DTYPE
    if fp8 != (w.dtype == FP8_DTYPE):
        raise TypeError(f"x and w must both be float8_e4m3fn or neither (x {x.dtype}, w {w.dtype})")
    if fp8:
        check_tensor("x_scale", x_scale, shape=[M], dtypes=(torch.float32,))
        check_tensor("w_scale", w_scale, shape=[W, N], dtypes=(torch.float32,))
    else:
        if x_scale is not None or w_scale is not None:
            raise ValueError("x_scale and w_scale are only for float8_e4m3fn x and w")
        if x.dtype != w.dtype:
            raise TypeError(f"w must have x's dtype {x.dtype}, got {w.dtype}")
    out_dtype = out_dtype or (torch.bfloat16 if fp8 else x.dtype)
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype must be one of {OUT_DTYPES}, got {out_dtype}")
    if row_weights is not None:
        check_tensor("row_weights", row_weights, shape=[M], dtypes=(torch.float32,))
    if scatter_ids is not None:
        check_tensor("scatter_ids", scatter_ids, shape=[M], dtypes=INDEX_DTYPES)
        if out is None:
            raise ValueError("out [T, N] is required when scatter_ids is given")
        check_tensor("out", out, shape=[None, N], dtypes=(out_dtype,), contiguous=True)
    elif out is not None:
        check_tensor("out", out, shape=[M, N], dtypes=(out_dtype,), contiguous=True)
    if scatter_unique and scatter_ids is None:
        raise ValueError("scatter_unique needs scatter_ids")
    check_same_device(x=x, w=w, m_sizes=m_sizes, x_scale=x_scale, w_scale=w_scale,
                      weight_ids=weight_ids, row_weights=row_weights, scatter_ids=scatter_ids,
                      out=out)
    return ops_for(resolve(impl, x)).grouped_gemm(x, w, m_sizes, x_scale, w_scale, weight_ids,
                                                  row_weights, scatter_ids, out, out_dtype,
                                                  scatter_unique)


__all__ = ["grouped_gemm"]
