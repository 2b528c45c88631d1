"""SwiGLU: a = silu(h[:, :I]) * h[:, I:], or gpt-oss's clamped variant (optionally fused fp8
quantization, per row or per group of 128 columns)."""

from __future__ import annotations

import torch
from torch import Tensor

from ..._checks import check_num_valid, check_same_device, check_tensor
from .._impl import ops_for, resolve
from ..quantize import FP8_BLOCK, FP8_DTYPE
from ..quantize.reference import QUANTIZE_MODES
from .reference import ACTIVATIONS

H_DTYPES = (torch.bfloat16, torch.float16, torch.float32)



def silu_mul(
    h: Tensor,
    *,
    num_valid: Tensor | None = None,
    quantize: bool | str = False,
    activation: str = "silu",
    alpha: float = 1.0,
    limit: float | None = None,
    out: Tensor | tuple[Tensor, Tensor] | None = None,
    impl: str | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """h [A, 2I] (gate columns then up columns) -> a [A, I] in h's dtype. quantize: False; True or
    "rowwise": (q [A, I] float8_e4m3fn, scale [A] float32); "groups": (q, scale [A, ceil(I/128)]),
    one scale per 128 columns (fp8_block). activation: "silu" (silu(gate) * up) or "swiglu_oai"
    ((up + 1) * gate * sigmoid(alpha * gate), gpt-oss); limit: clamp gate above and up on both
    sides first (reference.py). Rows at or past num_valid [1] are neither read nor written."""
    check_tensor("h", h, dim=2, dtypes=H_DTYPES, contiguous=True)
    A, two_i = h.shape
    if two_i % 2:
        raise ValueError(f"h must have an even number of columns (gate, up), got {two_i}")
    I = two_i // 2
    mode = QUANTIZE_MODES.get(quantize)
    if mode is None:
        raise ValueError(f"quantize must be one of {list(QUANTIZE_MODES)}, got {quantize!r}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {list(ACTIVATIONS)}, got {activation!r}")
    if limit is not None and not limit > 0:
        raise ValueError(f"limit must be None or positive, got {limit}")
    dev = check_same_device(h=h, num_valid=num_valid)
    check_num_valid(num_valid, dev)
    if out is not None:
        if mode != "none":
            if not isinstance(out, tuple) or len(out) != 2:
                raise TypeError("out must be a (q, scale) tuple when quantizing")
            check_tensor("out[0]", out[0], shape=[A, I], dtypes=(FP8_DTYPE,), device=dev,
                         contiguous=True)
            scale = [A] if mode == "rowwise" else [A, -(-I // FP8_BLOCK)]
            check_tensor("out[1]", out[1], shape=scale, dtypes=(torch.float32,), device=dev,
                         contiguous=True)
        else:
            check_tensor("out", out, shape=[A, I], dtypes=(h.dtype,), device=dev, contiguous=True)
    act = (activation, float(alpha), None if limit is None else float(limit))
    return ops_for(resolve(impl, h)).silu_mul(h, num_valid, mode, out, act)


__all__ = ["silu_mul"]
