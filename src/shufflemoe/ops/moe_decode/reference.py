"""The fused decode path in torch ops: the composition of the existing references (gather_scale,
grouped_gemm, silu_mul, scatter_add's token-major sum), with the gate/up product kept in float32
as the fused kernel keeps it in registers (the unfused path rounds it to the model dtype)."""

from __future__ import annotations

import torch
from torch import Tensor

from .._common import store_rows
from ..gather_scale.reference import gather_scale
from ..grouped_gemm.reference import grouped_gemm
from ..quantize.reference import FP8_DTYPE
from ..scatter_add.reference import token_sum
from ..silu_mul.reference import silu_mul


def _num_valid(counts: Tensor) -> Tensor:
    return counts.sum().reshape(1).to(torch.int32)


def gate_up(x: Tensor, w13: Tensor, w13_scale: Tensor | None, counts: Tensor, token_ids: Tensor,
            row_weights: Tensor | None,
            out: Tensor | tuple[Tensor, Tensor]) -> Tensor | tuple[Tensor, Tensor]:
    fp8 = w13.dtype == FP8_DTYPE
    nv = _num_valid(counts)
    xs = gather_scale(x, token_ids, row_weights, nv, fp8, None)
    xq, x_scale = xs if fp8 else (xs, None)
    h = grouped_gemm(xq, w13, counts, x_scale, w13_scale, None, None, None, None,
                     torch.float32)  # [A, 2I]
    if fp8:
        silu_mul(h, nv, True, out)  # writes into out's (q, scale)
        return out
    return store_rows(out, silu_mul(h, nv, False, None).to(x.dtype), nv)


def down(a: Tensor, a_scale: Tensor | None, w2: Tensor, w2_scale: Tensor | None, counts: Tensor,
         token_ids: Tensor, positions: Tensor, row_weights: Tensor | None, out: Tensor) -> Tensor:
    y = grouped_gemm(a, w2, counts, a_scale, w2_scale, None, None, None, None,
                     torch.float32)  # [A, D]
    return token_sum(out, y, positions, row_weights, _num_valid(counts))
