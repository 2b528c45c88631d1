"""FP8 rowwise quantization: the one formula every fused quantizing kernel reproduces bit for bit."""

from __future__ import annotations

import torch
from torch import Tensor

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3 value
FP8_EPS = 1e-12  # floor on a row's absolute maximum, so all-zero rows get a finite scale


def quantize_fp8_rowwise(x: Tensor) -> tuple[Tensor, Tensor]:
    """x [M, K] -> (q [M, K] float8_e4m3fn, scale [M] float32) with x ~= q * scale[:, None].

    In float32: amax = max(|row|, eps); q = clamp(row * (448 / amax)); scale = amax * (1 / 448).
    (The scale multiplies by the rounded reciprocal because that is what torch does for a
    division by a constant on CUDA; written so, CPU and GPU agree bit for bit.)
    """
    xf = x.float()
    amax = xf.abs().amax(dim=-1).clamp_min(FP8_EPS)
    q = (xf * (FP8_MAX / amax)[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, amax * (1.0 / FP8_MAX)


def dequantize_fp8_rowwise(q: Tensor, scale: Tensor) -> Tensor:
    """(q [M, K], scale [M]) -> float32 [M, K]."""
    return q.float() * scale[..., None]
