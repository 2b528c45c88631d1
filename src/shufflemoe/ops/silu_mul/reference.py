"""SwiGLU's non-linearity in torch ops: a = act(gate, up), computed in float32.

| activation | a                                                              | models          |
| ---------- | -------------------------------------------------------------- | --------------- |
| silu       | silu(gate) * up                                                | most MoE models |
| swiglu_oai | (up + 1) * gate * sigmoid(alpha * gate)                        | gpt-oss         |

With a limit, gate = min(gate, limit) and up = clamp(up, -limit, limit) first (gpt-oss: 7.0).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from .._common import store_rows
from .._impl import _is_compiling, inplace_op
from ..quantize.reference import (FP8_BLOCK, FP8_DTYPE, QUANTIZE_MODES, quantize_fp8_groups,
                                  quantize_fp8_rowwise)

ACTIVATIONS = {  # (gate, up, alpha, out) -> a, rounded once into out when given
    "silu": lambda g, u, alpha, out: torch.mul(F.silu(g), u, out=out),
    "swiglu_oai": lambda g, u, alpha, out: torch.mul(u + 1.0, g * torch.sigmoid(g * alpha),
                                                     out=out),
}
QUANTIZERS = {"rowwise": quantize_fp8_rowwise, "groups": quantize_fp8_groups}
Act = tuple  # (activation, alpha, limit): (str, float, float | None)


def glu(gate: Tensor, up: Tensor, activation: str = "silu", alpha: float = 1.0,
        limit: float | None = None, out: Tensor | None = None) -> Tensor:
    """gate, up [..., I] -> act(gate, up) in their dtype (float32 or float64; rounded once into
    out when given)."""
    if limit is not None:
        gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
    return ACTIVATIONS[activation](gate, up, alpha, out)


def _glu_f32(h: Tensor, act: str, alpha: float, limit: Optional[float],
             out: Optional[Tensor] = None) -> Tensor:
    """h [A, 2I] -> act(h[:, :I], h[:, I:]) [A, I] in float32 (rounded once into out when
    given)."""
    gate, up = h.float().chunk(2, dim=1)  # one call for both views (two slices cost ~1 us more)
    return glu(gate, up, act, alpha, limit, out)


@inplace_op("silu_mul_ref", mutates_args=("out",))
def _silu_mul(h: Tensor, num_valid: Optional[Tensor], out: Tensor, act: str, alpha: float,
              limit: Optional[float]) -> None:
    if num_valid is None:
        _glu_f32(h, act, alpha, limit, out)  # straight into out: one op fewer
    else:
        store_rows(out, _glu_f32(h, act, alpha, limit), num_valid)


def _quantized(mode: str, h: Tensor, num_valid: Optional[Tensor], q: Tensor, scale: Tensor,
               act: str, alpha: float, limit: Optional[float]) -> None:
    new_q, new_scale = QUANTIZERS[mode](_glu_f32(h, act, alpha, limit))
    store_rows(q, new_q, num_valid)
    store_rows(scale, new_scale, num_valid)


@inplace_op("silu_mul_fp8_ref", mutates_args=("q", "scale"))
def _silu_mul_fp8(h: Tensor, num_valid: Optional[Tensor], q: Tensor, scale: Tensor, act: str,
                  alpha: float, limit: Optional[float]) -> None:
    _quantized("rowwise", h, num_valid, q, scale, act, alpha, limit)


@inplace_op("silu_mul_fp8_groups_ref", mutates_args=("q", "scale"))
def _silu_mul_fp8_groups(h: Tensor, num_valid: Optional[Tensor], q: Tensor, scale: Tensor,
                         act: str, alpha: float, limit: Optional[float]) -> None:
    _quantized("groups", h, num_valid, q, scale, act, alpha, limit)


def silu_mul(
    h: Tensor,
    num_valid: Tensor | None,
    quantize: bool | str,
    out: Tensor | tuple[Tensor, Tensor] | None,
    act: Act = ("silu", 1.0, None),
) -> Tensor | tuple[Tensor, Tensor]:
    """As ops.silu_mul. Rows of a new output past num_valid may hold anything: computed, not
    masked (in eager straight into the result)."""
    mode = QUANTIZE_MODES[quantize]
    A, inter = h.shape[0], h.shape[1] // 2
    if out is None and mode == "none" and not _is_compiling():
        a = _glu_f32(h, *act)  # eager: no allocation to copy into
        return a if a.dtype == h.dtype else a.to(h.dtype)
    if out is None:
        num_valid = None
        scale_shape = (A,) if mode == "rowwise" else (A, -(-inter // FP8_BLOCK))
        out = ((torch.empty(A, inter, dtype=FP8_DTYPE, device=h.device),
                torch.empty(scale_shape, dtype=torch.float32, device=h.device)) if mode != "none"
               else torch.empty(A, inter, dtype=h.dtype, device=h.device))
    if mode == "groups":
        _silu_mul_fp8_groups(h, num_valid, *out, *act)
    elif mode == "rowwise":
        _silu_mul_fp8(h, num_valid, *out, *act)
    else:
        _silu_mul(h, num_valid, out, *act)
    return out
