"""SwiGLU: a = silu(h[:, :I]) * h[:, I:] (optionally fused fp8 rowwise quantization)."""

from __future__ import annotations

import torch
from torch import Tensor

from ..._checks import check_num_valid, check_same_device, check_tensor
from .._impl import ops_for, resolve
from ..quantize import FP8_DTYPE

H_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def silu_mul(
    h: Tensor,
    *,
    num_valid: Tensor | None = None,
    quantize: bool = False,
    out: Tensor | tuple[Tensor, Tensor] | None = None,
    impl: str | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """h [A, 2I] (gate columns then up columns) -> a [A, I] in h's dtype, or with quantize=True
    (q [A, I] float8_e4m3fn, scale [A] float32). Rows at or past num_valid [1] are neither read
    nor written."""
    check_tensor("h", h, dim=2, dtypes=H_DTYPES, contiguous=True)
    A, two_i = h.shape
    if two_i % 2:
        raise ValueError(f"h must have an even number of columns (gate, up), got {two_i}")
    dev = check_same_device(h=h, num_valid=num_valid)
    check_num_valid(num_valid, dev)
    if out is not None:
        if quantize:
            if not isinstance(out, tuple) or len(out) != 2:
                raise TypeError("out must be a (q, scale) tuple when quantize=True")
            check_tensor("out[0]", out[0], shape=[A, two_i // 2], dtypes=(FP8_DTYPE,), device=dev,
                         contiguous=True)
            check_tensor("out[1]", out[1], shape=[A], dtypes=(torch.float32,), device=dev)
        else:
            check_tensor("out", out, shape=[A, two_i // 2], dtypes=(h.dtype,), device=dev,
                         contiguous=True)
    return ops_for(resolve(impl, h)).silu_mul(h, num_valid, quantize, out)


__all__ = ["silu_mul"]
