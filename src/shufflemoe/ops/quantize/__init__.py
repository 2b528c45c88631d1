"""FP8 rowwise quantization (weights at load time; activations inside the fused kernels)."""

from __future__ import annotations

from torch import Tensor

from ..._checks import check_tensor
from .reference import FP8_DTYPE, FP8_EPS, FP8_MAX, dequantize_fp8_rowwise
from .reference import quantize_fp8_rowwise as _quantize


def quantize_fp8_rowwise(x: Tensor) -> tuple[Tensor, Tensor]:
    """x [..., K] -> (q [..., K] float8_e4m3fn, scale [...] float32), one scale per row."""
    check_tensor("x", x)
    if x.dim() < 1 or x.shape[-1] == 0:
        raise ValueError(f"x must have a non-empty last dimension, got shape {tuple(x.shape)}")
    if not x.is_floating_point() or x.dtype == FP8_DTYPE:
        raise TypeError(f"x must be a float16/bfloat16/float32 tensor, got {x.dtype}")
    q, s = _quantize(x.reshape(-1, x.shape[-1]))
    return q.view(x.shape), s.view(x.shape[:-1])


__all__ = ["FP8_DTYPE", "FP8_EPS", "FP8_MAX", "quantize_fp8_rowwise", "dequantize_fp8_rowwise"]
