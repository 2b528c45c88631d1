"""Quantization: fp8 rowwise (weights at load time; activations inside the fused kernels), fp8
per-token groups of 128 (fp8_block's activations), fp8 128 x 128 blocks and mxfp4 (weights at
load time). formats.py describes each MoEConfig.quantization value in one table."""

from __future__ import annotations

import torch
from torch import Tensor

from ..._checks import check_num_valid, check_same_device, check_tensor
from .._impl import ops_for, resolve
from .reference import (
    FP8_BLOCK,
    FP8_DTYPE,
    FP8_EPS,
    FP8_MAX,
    MX_GROUP,
    dequantize_fp8_blockwise,
    dequantize_fp8_groups,
    dequantize_fp8_rowwise,
    dequantize_mxfp4,
    quantize_fp8_blockwise,
    quantize_mxfp4,
)
from .reference import quantize_fp8_rowwise as _quantize

X_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def quantize_fp8_rowwise(x: Tensor) -> tuple[Tensor, Tensor]:
    """x [..., K] -> (q [..., K] float8_e4m3fn, scale [...] float32), one scale per row."""
    check_tensor("x", x)
    if x.dim() < 1 or x.shape[-1] == 0:
        raise ValueError(f"x must have a non-empty last dimension, got shape {tuple(x.shape)}")
    if not x.is_floating_point() or x.dtype == FP8_DTYPE:
        raise TypeError(f"x must be a float16/bfloat16/float32 tensor, got {x.dtype}")
    q, s = _quantize(x.reshape(-1, x.shape[-1]))
    return q.view(x.shape), s.view(x.shape[:-1])


def quantize_fp8_groups(
    x: Tensor,
    *,
    num_valid: Tensor | None = None,
    out: tuple[Tensor, Tensor] | None = None,
    impl: str | None = None,
) -> tuple[Tensor, Tensor]:
    """x [M, K] -> (q [M, K] float8_e4m3fn, scale [M, ceil(K / 128)] float32): one scale per row
    and group of 128 columns (fp8_block's activations). Rows at or past num_valid [1] are
    neither read nor written."""
    check_tensor("x", x, dim=2, dtypes=X_DTYPES, contiguous=True)
    M, K = x.shape
    G = -(-K // FP8_BLOCK)
    dev = check_same_device(x=x, num_valid=num_valid)
    check_num_valid(num_valid, dev)
    if out is None:
        out = (torch.empty(M, K, dtype=FP8_DTYPE, device=dev),
               torch.empty(M, G, dtype=torch.float32, device=dev))
    elif not isinstance(out, tuple) or len(out) != 2:
        raise TypeError("out must be a (q, scale) tuple")
    check_tensor("out[0]", out[0], shape=[M, K], dtypes=(FP8_DTYPE,), device=dev, contiguous=True)
    check_tensor("out[1]", out[1], shape=[M, G], dtypes=(torch.float32,), device=dev,
                 contiguous=True)
    ops_for(resolve(impl, x)).quantize_fp8_groups(x, num_valid, out[0], out[1], FP8_BLOCK)
    return out


__all__ = [
    "FP8_BLOCK",
    "FP8_DTYPE",
    "FP8_EPS",
    "FP8_MAX",
    "MX_GROUP",
    "dequantize_fp8_blockwise",
    "dequantize_fp8_groups",
    "dequantize_fp8_rowwise",
    "dequantize_mxfp4",
    "quantize_fp8_blockwise",
    "quantize_fp8_groups",
    "quantize_fp8_rowwise",
    "quantize_mxfp4",
]
