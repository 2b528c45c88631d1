"""SwiGLU's non-linearity in torch ops: a = act(gate, up), computed in float32.

| activation | a                                                              | models          |
| ---------- | -------------------------------------------------------------- | --------------- |
| silu       | silu(gate) * up                                                | most MoE models |
| swiglu_oai | (up + 1) * gate * sigmoid(alpha * gate)                        | gpt-oss         |

With a limit, gate = min(gate, limit) and up = clamp(up, -limit, limit) first (gpt-oss: 7.0).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .._common import store_rows
from ..quantize.reference import quantize_fp8_groups, quantize_fp8_rowwise

ACTIVATIONS = {
    "silu": lambda g, u, alpha: F.silu(g) * u,
    "swiglu_oai": lambda g, u, alpha: (u + 1.0) * (g * torch.sigmoid(g * alpha)),
}
QUANTIZERS = {"rowwise": quantize_fp8_rowwise, "groups": quantize_fp8_groups}


def glu(gate: Tensor, up: Tensor, activation: str = "silu", alpha: float = 1.0,
        limit: float | None = None) -> Tensor:
    """gate, up [..., I] -> act(gate, up) in their dtype (float32 or float64)."""
    if limit is not None:
        gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
    return ACTIVATIONS[activation](gate, up, alpha)


def silu_mul(
    h: Tensor,
    num_valid: Tensor | None,
    quantize: str,
    out: Tensor | tuple[Tensor, Tensor] | None,
    act: tuple[str, float, float | None] = ("silu", 1.0, None),
) -> Tensor | tuple[Tensor, Tensor]:
    inter = h.shape[1] // 2
    a = glu(h[:, :inter].float(), h[:, inter:].float(), *act)  # [A, I]
    if quantize != "none":
        q, scale = QUANTIZERS[quantize](a)
        q_out, s_out = out if out is not None else (None, None)
        return store_rows(q_out, q, num_valid), store_rows(s_out, scale, num_valid)
    return store_rows(out, a.to(h.dtype), num_valid)
