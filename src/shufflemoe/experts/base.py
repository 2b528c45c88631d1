"""Expert strategies: how routed pairs meet the expert weights (vLLM's PermuteExpertsUnpermute).

A strategy adds the routed output into ``out`` [T, D] (which already holds the shared expert's
output, or zeros): out[t] += sum over t's pairs of w * expert(x[t]) (or expert(w * x[t]) when the
router weight is applied on the input). ``before_combine`` is called before the first write into
``out``, so the layer can join the shared expert's stream as late as possible.

Same input, same bits: no strategy adds into ``out`` with atomics. A token's k rows are written
as pair rows and summed by ``ops.token_sum`` in ascending pair position (= ascending expert id),
in float32 from out's value on, rounded once; a top-1 pair (the only one of its token) is added
by the second GEMM's epilogue, also rounded once. Atomic adds made the order of a token's k
additions, each rounded to bf16, vary from run to run (0.27-0.50% relative difference at k = 8
on an H100).

Every strategy multiplies through ``ops.grouped_gemm``; they differ in grouping, padding and host
syncs, which is what the spec compares (padding / slicing / concatenation / shuffling). They call
the ops unchecked (``ops.backend_for``): the layer checked its weights once, and every other
tensor here is made by the layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar

import torch
from torch import Tensor

from .._registry import Registry
from ..config import MoEConfig
from ..ops import Ops, gather_scale
from ..ops.quantize.formats import FORMATS
from ..types import ExpertWeights, Routing

Activation = Tensor | tuple[Tensor, Tensor]  # rows in the model dtype, or fp8 (q, scale) rows


@dataclass(frozen=True)
class QuantizedRows:
    """An expert input already quantized fp8 rowwise (expert parallelism quantizes before it
    communicates, so fp8 layers send 1 byte per value): strategies take it where they take x."""

    q: Tensor  # [N, D] float8_e4m3fn
    scale: Tensor  # [N] float32

    @property
    def shape(self) -> torch.Size:
        return self.q.shape

    @property
    def device(self) -> torch.device:
        return self.q.device

    @property
    def is_cuda(self) -> bool:
        return self.q.is_cuda


def gather_rows(src: Tensor, index: Tensor, num_valid: Tensor | None = None,
                out: Tensor | None = None) -> Tensor:
    """out [M, W] = src [N, W][index [M]], only rows below num_valid written, for any dtype:
    bytes that are not a float type move as 16-bit words through gather_scale (a pure copy, bit
    for bit, when no weight is given); an odd row of bytes falls back to index_select."""
    if src.dtype in (torch.bfloat16, torch.float16, torch.float32):
        return gather_scale(src, index, num_valid=num_valid, out=out)
    if src.shape[1] * src.element_size() % 2:
        rows = src.index_select(0, index.long().clamp(0, max(src.shape[0] - 1, 0)))
        return rows if out is None else out.copy_(rows)
    words = gather_scale(src.view(torch.float16), index, num_valid=num_valid,
                         out=None if out is None else out.view(torch.float16))
    return words.view(src.dtype)


class Experts:
    name: ClassVar[str]
    graph_safe: ClassVar[bool] = True  # no host sync: works inside a captured CUDA graph
    batch_invariant: ClassVar[bool] = False  # honours MoEConfig.batch_invariant
    # takes forward(..., overwrite=True): every pair routed, the routed output written into out
    # (whose old values are not wanted) instead of added to it
    overwrites: ClassVar[bool] = False
    summary: ClassVar[str] = ""

    def supports(self, cfg: MoEConfig, device: torch.device) -> tuple[bool, str]:
        return True, ""

    def forward(
        self,
        x: Tensor,
        routing: Routing,
        weights: ExpertWeights,
        out: Tensor,
        cfg: MoEConfig,
        before_combine: Callable[[], None] = lambda: None,
    ) -> None:
        raise NotImplementedError


EXPERTS: Registry[Experts] = Registry("experts strategy")


def register(cls: type[Experts]) -> type[Experts]:
    EXPERTS.register(cls.name)(cls())
    return cls


def quantizes_rows(quantization: str) -> bool:
    """Whether a format's expert input is fp8 rowwise, which expert parallelism quantizes before
    it communicates (QuantizedRows); the other formats' rows travel in the model dtype."""
    return FORMATS[quantization].activation == "rowwise"


def gather_input(ops: Ops, x: Tensor | QuantizedRows, token_ids: Tensor,
                 row_weights: Tensor | None,
                 w: ExpertWeights, num_valid: Tensor | None = None,
                 positions: Tensor | None = None) -> Activation:
    """xs = x[token_ids] (* row_weights) [A, D], quantized as the weight format's first GEMM
    takes it (in gather_scale's pass: one scale a row, or a 128-column group for fp8_block).
    positions (the Routing's, token_ids' inverse) lets the kernel read each token's row once.
    Rows already quantized (QuantizedRows, fp8_rowwise only) are gathered as they are."""
    act = FORMATS[w.quantization].activation
    if isinstance(x, QuantizedRows):
        if act != "rowwise" or row_weights is not None:
            raise ValueError(f"quantized rows feed fp8_rowwise experts only (got "
                             f"{w.quantization!r}), and cannot be scaled again")
        return (gather_rows(x.q, token_ids, num_valid),
                gather_rows(x.scale.view(-1, 1), token_ids, num_valid).view(-1))
    return ops.gather_scale(x, token_ids, row_weights, num_valid, act, None, positions)


def glu(ops: Ops, h: Tensor, w: ExpertWeights, cfg: MoEConfig,
        num_valid: Tensor | None = None) -> Activation:
    """a = act(gate, up) [A, I] of the first GEMM's output h [A, 2I], quantized as the second
    GEMM takes it (fused): cfg.activation, swiglu_alpha, swiglu_limit (MoEConfig checked them)."""
    return ops.silu_mul(h, num_valid, FORMATS[w.quantization].activation, None, cfg.act)


def expert_gemm(
    ops: Ops,
    inp: Activation,
    w: ExpertWeights,
    proj: str,
    m_sizes: Tensor,
    out_dtype: torch.dtype,
    *,
    weight_ids: Tensor | None = None,
    row_weights: Tensor | None = None,
    scatter_ids: Tensor | None = None,
    out: Tensor | None = None,
    scatter: str = "add",
    all_rows: bool = False,
    x_ids: Tensor | None = None,
    glu: tuple[str, float, float | None] | None = None,
) -> Tensor:
    """grouped_gemm of rows (in out_dtype, or fp8 (q, scale); or the rows of inp that x_ids
    gathers) against w.w13 (proj "w13", with its bias; fp8_block scale blocks
    restart at its up half; glu: act(gate, up) in the epilogue) or w.w2 (proj "w2")."""
    if proj == "w13":
        weight, scale, bias = w.w13, w.w13_scale, w.w13_bias
        split = w.intermediate_size if w.quantization == "fp8_block" else None
    else:
        weight, scale, bias, split = w.w2, w.w2_scale, w.w2_bias, None
    x, x_scale = inp if isinstance(inp, tuple) else (inp, None)
    return ops.grouped_gemm(x, weight, m_sizes, x_scale, scale, weight_ids, row_weights,
                            scatter_ids, out, out_dtype, scatter, w.quantization, bias,
                            split, all_rows, x_ids, glu)


def pair_weights(routing: Routing, cfg: MoEConfig) -> tuple[Tensor | None, Tensor | None]:
    """(weights applied at the input, weights applied at the output): one of them is None."""
    if cfg.apply_router_weight_on_input:
        return routing.weights, None
    return None, routing.weights
