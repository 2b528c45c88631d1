"""The fused decode path in torch ops: the composition of the existing references (gather_scale,
grouped_gemm, silu_mul, scatter_add's token-major sum), with the gate/up product kept in float32
as the fused kernel keeps it in registers (the unfused path rounds it to the model dtype). Weight
formats as the grouped GEMM's (FORMATS below: bf16, the w8a8 fp8 rowwise and fp8_block, and the
weight-only fp8_w8a16 and mxfp4)."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .._impl import inplace_op
from ..gather_scale.reference import gather_scale
from ..grouped_gemm.reference import grouped_gemm
from ..quantize.formats import FORMATS as ALL_FORMATS
from ..quantize.reference import FP8_DTYPE, quantize_fp8_rowwise
from ..scatter_add.reference import token_sum
from ..silu_mul.reference import Act, silu_mul


def _num_valid(counts: Tensor) -> Tensor:
    return counts.sum().reshape(1).to(torch.int32)


FORMATS = ("none", "fp8_rowwise", "fp8_w8a16", "fp8_block", "mxfp4")  # the formats the kernels read
WEIGHT_ONLY = ("fp8_w8a16", "mxfp4")  # ... of which these keep activations in x's dtype
W8A8 = ("fp8_rowwise", "fp8_block")  # ... and these quantize them: a = (q, scale[, sa])


def activation_of(quant: str) -> str:
    """How a format quantizes the GEMM inputs: "none", "rowwise" (scale [A]) or "groups" (scale
    [A, ceil(I / 128)])."""
    return ALL_FORMATS[quant].activation


def w13_split(quant: str, w13: Tensor) -> int | None:
    """fp8_block's w13 scale blocks restart at the up half (ops/quantize/formats.py)."""
    return w13.shape[1] // 2 if quant == "fp8_block" else None
SILU: Act = ("silu", 1.0, None)  # the GLU: (activation, alpha, limit) as ops.silu_mul takes it


def format_of(w: Tensor, quant: str | None) -> str:
    """The weight format: ``quant`` when given, else fp8 rowwise (w8a8) for e4m3 weights and
    "none" for weights in the activations' dtype."""
    return quant or ("fp8_rowwise" if w.dtype == FP8_DTYPE else "none")


def _all_tokens(x: Tensor) -> Tensor:
    """counts [1] = T: every row of x on one expert (the shared expert)."""
    return torch.full((1,), x.shape[0], dtype=torch.int32, device=x.device)


@inplace_op("decode_gate_up_ref", mutates_args=("a", "q", "scale", "sa"))
def _gate_up(x: Tensor, w13: Tensor, w13_scale: Optional[Tensor], counts: Tensor,
             token_ids: Tensor, row_weights: Optional[Tensor], a: Optional[Tensor],
             q: Optional[Tensor], scale: Optional[Tensor], sa: Optional[Tensor], workspace: int,
             quant: str, bias: Optional[Tensor], activation: str, alpha: float,
             limit: Optional[float], words: Optional[Tensor] = None,
             shared: Optional[Tensor] = None, early: bool = False) -> None:
    # words: the kernel's, unused; shared [2I, D]: a's first T rows are the shared expert's
    # (fp8 rowwise: sa's); early: the kernel's launch detail; fp8 rowwise without q: a holds
    # the rows in float32, for down to quantize
    act = (activation, alpha, limit)
    if shared is not None:
        T = x.shape[0]
        h = grouped_gemm(x, shared.unsqueeze(0), _all_tokens(x), None, None, None, None, None,
                         None, torch.float32)
        if sa is None:
            silu_mul(h, None, False, a[:T], act)
            a = a[T:]
        else:
            silu_mul(h, None, False, sa, act)
    mode = activation_of(quant)
    nv = _num_valid(counts)
    xs = gather_scale(x, token_ids, row_weights, nv, mode, None)
    xq, x_scale = xs if mode != "none" else (xs, None)
    h = grouped_gemm(xq, w13, counts, x_scale, w13_scale, None, None, None, None,
                     torch.float32, quantization=quant, bias=bias,
                     scale_split=w13_split(quant, w13))  # [A, 2I]
    # rows past num_valid keep their values
    silu_mul(h, nv, mode if q is not None else "none", (q, scale) if q is not None else a, act)


@inplace_op("decode_down_ref", mutates_args=("out",))
def _down(a: Tensor, a_scale: Optional[Tensor], sa: Optional[Tensor], w2: Tensor,
          w2_scale: Optional[Tensor], counts: Tensor, token_ids: Tensor, positions: Tensor,
          row_weights: Optional[Tensor], out: Tensor, accumulate: bool, workspace: int,
          quant: str, bias: Optional[Tensor], words: Optional[Tensor] = None,
          shared: Optional[Tensor] = None, early: bool = False,
          gate_input: Optional[Tensor] = None, shared_gate: Optional[Tensor] = None) -> None:
    # words: unused; shared [D, I]: a's first T rows (fp8 rowwise: sa) are the shared expert's,
    # added first; early: the kernel's launch detail; shared_gate [1, D], gate_input [T, D]:
    # the shared expert's rows (without shared: every row) times sigmoid(gate_input . gate)
    if shared is not None and sa is None:
        sa, a = a[:out.shape[0]], a[out.shape[0]:]
    if quant == "fp8_rowwise" and a_scale is None:  # a's rows in float32: quantized here
        a, a_scale = quantize_fp8_rowwise(a)
    y = grouped_gemm(a, w2, counts, a_scale, w2_scale, None, None, None, None,
                     torch.float32, quantization=quant, bias=bias)  # [A, D]
    nv = _num_valid(counts)
    gate = None
    if shared_gate is not None:  # [T, 1]
        gate = torch.sigmoid(gate_input.float() @ shared_gate.float().t())
    if shared is not None:
        acc = grouped_gemm(sa, shared.unsqueeze(0), _all_tokens(out), None, None, None,
                           None, None, None, torch.float32)  # [T, D]
        if gate is not None:
            acc = acc * gate
        if accumulate:
            acc = out.float() + acc
        token_sum(acc, y, positions, row_weights, nv)
        out.copy_(acc)
        return
    if gate is not None:  # the shared expert alone: its rows are pairs of tokens token_ids
        y = y * gate[token_ids[:y.shape[0]].long().clamp(0, out.shape[0] - 1)]
    if accumulate:
        token_sum(out, y, positions, row_weights, nv)
        return
    # out = the sum, for tokens with a routed pair; the other rows keep their values
    fresh = torch.zeros_like(out)
    token_sum(fresh, y, positions, row_weights, nv)
    p = positions.view(out.shape[0], -1)
    routed = ((p >= 0) & (p < nv)).any(1)
    out[routed] = fresh[routed]


def unpack_outputs(out: Tensor | tuple) -> tuple:
    """decode_gate_up's out (see gate_up_outputs) as the ops take it: (a, q, scale, sa). a: the
    rows in x's dtype, or fp8 rowwise's in float32 ((a, None[, sa]): down quantizes them); q,
    scale: w8a8's quantized rows; sa: a merged shared expert's rows beside w8a8 ones."""
    if not isinstance(out, tuple):
        return out, None, None, None
    q, scale, sa = (*out, None)[:3]
    return (q, None, None, sa) if scale is None else (None, q, scale, sa)


def gate_up(x: Tensor, w13: Tensor, w13_scale: Tensor | None, counts: Tensor, token_ids: Tensor,
            row_weights: Tensor | None, out: Tensor | tuple[Tensor, Tensor],
            workspace: int = 0, quant: str | None = None, bias: Tensor | None = None,
            act: Act = SILU, shared: Tensor | None = None,
            early: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """As ops.decode_gate_up (out allocated by the public function; no workspace here; early:
    the kernels' launch detail)."""
    a, q, scale, sa = unpack_outputs(out)
    _gate_up(x, w13, w13_scale, counts, token_ids, row_weights, a, q, scale, sa, workspace,
             format_of(w13, quant), bias, *act, None, shared)
    return out


def down(a: Tensor, a_scale: Tensor | None, w2: Tensor, w2_scale: Tensor | None, counts: Tensor,
         token_ids: Tensor, positions: Tensor, row_weights: Tensor | None, out: Tensor,
         accumulate: bool = True, workspace: int = 0, quant: str | None = None,
         bias: Tensor | None = None, shared: Tensor | None = None,
         early: bool = False, shared_a: Tensor | None = None,
         shared_gate: Tensor | None = None, gate_input: Tensor | None = None) -> Tensor:
    """As ops.decode_down (no workspace here; early: the kernels' launch detail)."""
    _down(a, a_scale, shared_a, w2, w2_scale, counts, token_ids, positions, row_weights, out,
          accumulate, workspace, format_of(w2, quant), bias, None, shared, False, gate_input,
          shared_gate)
    return out
