"""SwiGLU's non-linearity in torch ops: a = silu(gate) * up, computed in float32."""

from __future__ import annotations

import torch
from torch import Tensor

from .._common import store_rows
from ..quantize.reference import quantize_fp8_rowwise


def silu_mul(
    h: Tensor,
    num_valid: Tensor | None,
    quantize: bool,
    out: Tensor | tuple[Tensor, Tensor] | None,
) -> Tensor | tuple[Tensor, Tensor]:
    inter = h.shape[1] // 2
    gate, up = h[:, :inter].float(), h[:, inter:].float()
    a = torch.nn.functional.silu(gate) * up  # [A, I]
    if quantize:
        q, scale = quantize_fp8_rowwise(a)
        q_out, s_out = out if out is not None else (None, None)
        return store_rows(q_out, q, num_valid), store_rows(s_out, scale, num_valid)
    return store_rows(out, a.to(h.dtype), num_valid)
