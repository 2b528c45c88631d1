"""Expert strategies: how routed pairs meet the expert weights (vLLM's PermuteExpertsUnpermute).

A strategy adds the routed output into ``out`` [T, D] (which already holds the shared expert's
output, or zeros): out[t] += sum over t's pairs of w * expert(x[t]) (or expert(w * x[t]) when the
router weight is applied on the input). ``before_combine`` is called before the first write into
``out``, so the layer can join the shared expert's stream as late as possible.

Every strategy multiplies through ``ops.grouped_gemm``; they differ in grouping, padding and host
syncs, which is what the spec compares (padding / slicing / concatenation / shuffling).
"""

from __future__ import annotations

from typing import Callable, ClassVar

import torch
from torch import Tensor

from .._registry import Registry
from ..config import MoEConfig
from ..ops import grouped_gemm
from ..types import ExpertWeights, Routing

Activation = Tensor | tuple[Tensor, Tensor]  # bf16 rows, or fp8 (q, scale) rows


class Experts:
    name: ClassVar[str]
    graph_safe: ClassVar[bool] = True  # no host sync: works inside a captured CUDA graph
    batch_invariant: ClassVar[bool] = False  # honours MoEConfig.batch_invariant
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
