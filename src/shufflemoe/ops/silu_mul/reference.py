"""SwiGLU's non-linearity in torch ops: a = silu(gate) * up, computed in float32."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from .._common import store_rows
from .._impl import inplace_op
from ..quantize.reference import FP8_DTYPE, quantize_fp8_rowwise


def _silu_mul_f32(h: Tensor) -> Tensor:
    """h [A, 2I] -> silu(h[:, :I]) * h[:, I:] [A, I] in float32."""
    inter = h.shape[1] // 2
    return F.silu(h[:, :inter].float()) * h[:, inter:].float()


@inplace_op("silu_mul_ref", mutates_args=("out",))
def _silu_mul(h: Tensor, num_valid: Optional[Tensor], out: Tensor) -> None:
    store_rows(out, _silu_mul_f32(h), num_valid)


@inplace_op("silu_mul_fp8_ref", mutates_args=("q", "scale"))
def _silu_mul_fp8(h: Tensor, num_valid: Optional[Tensor], q: Tensor, scale: Tensor) -> None:
    new_q, new_scale = quantize_fp8_rowwise(_silu_mul_f32(h))
    store_rows(q, new_q, num_valid)
    store_rows(scale, new_scale, num_valid)


def silu_mul(
    h: Tensor,
    num_valid: Tensor | None,
    quantize: bool,
    out: Tensor | tuple[Tensor, Tensor] | None,
) -> Tensor | tuple[Tensor, Tensor]:
    """As ops.silu_mul. Rows of a new output past num_valid may hold anything: computed, not
    masked."""
    A, inter = h.shape[0], h.shape[1] // 2
    if out is None:
        num_valid = None
        out = ((torch.empty(A, inter, dtype=FP8_DTYPE, device=h.device),
                torch.empty(A, dtype=torch.float32, device=h.device)) if quantize
               else torch.empty(A, inter, dtype=h.dtype, device=h.device))
    if quantize:
        _silu_mul_fp8(h, num_valid, *out)
    else:
        _silu_mul(h, num_valid, out)
    return out
