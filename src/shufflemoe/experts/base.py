"""Expert strategies: how routed pairs meet the expert weights (vLLM's PermuteExpertsUnpermute).

A strategy adds the routed output into ``out`` [T, D] (which already holds the shared expert's
output, or zeros): out[t] += sum over t's pairs of w * expert(x[t]) (or expert(w * x[t]) when the
router weight is applied on the input). ``before_combine`` is called before the first write into
``out``, so the layer can join the shared expert's stream as late as possible.

Every strategy multiplies through ``ops.grouped_gemm``; they differ in grouping, padding and host
syncs, which is what the spec compares (padding / slicing / concatenation / shuffling).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar

import torch
from torch import Tensor

from .._registry import Registry
from ..config import MoEConfig
from ..ops import gather_scale, grouped_gemm
from ..types import ExpertWeights, Routing

Activation = Tensor | tuple[Tensor, Tensor]  # bf16 rows, or fp8 (q, scale) rows


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


def gather_input(x: Tensor | QuantizedRows, token_ids: Tensor, weights: Tensor | None, *,
                 num_valid: Tensor | None = None, quantize: bool = False) -> Activation:
    """gather_scale for a strategy's input: rows of x in pair order (times weights), fp8
    quantized when ``quantize``; already quantized rows are gathered as they are."""
    if not isinstance(x, QuantizedRows):
        return gather_scale(x, token_ids, weights, num_valid=num_valid, quantize=quantize)
    if weights is not None or not quantize:
        raise ValueError("quantized rows feed fp8 experts only, and cannot be scaled again")
    return (gather_rows(x.q, token_ids, num_valid),
            gather_rows(x.scale.view(-1, 1), token_ids, num_valid).view(-1))


class Experts:
    name: ClassVar[str]
    graph_safe: ClassVar[bool] = True  # no host sync: works inside a captured CUDA graph
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


def expert_gemm(
    inp: Activation,
    w: Tensor,
    w_scale: Tensor | None,
    m_sizes: Tensor,
    out_dtype: torch.dtype,
    **epilogue,
) -> Tensor:
    """grouped_gemm on bf16 rows or on fp8 (q, scale) rows against (w, w_scale)."""
    if isinstance(inp, tuple):
        q, scale = inp
        return grouped_gemm(q, w, m_sizes, x_scale=scale, w_scale=w_scale, out_dtype=out_dtype,
                            **epilogue)
    return grouped_gemm(inp, w, m_sizes, **epilogue)


def pair_weights(routing: Routing, cfg: MoEConfig) -> tuple[Tensor | None, Tensor | None]:
    """(weights applied at the input, weights applied at the output): one of them is None."""
    if cfg.apply_router_weight_on_input:
        return routing.weights, None
    return None, routing.weights
