"""Expert strategies: how routed pairs meet the expert weights (vLLM's PermuteExpertsUnpermute).

A strategy adds the routed output into ``out`` [T, D] (which already holds the shared expert's
output, or zeros): out[t] += sum over t's pairs of w * expert(x[t]) (or expert(w * x[t]) when the
router weight is applied on the input). ``before_combine`` is called before the first write into
``out``, so the layer can join the shared expert's stream as late as possible.

Every strategy multiplies through ``ops.grouped_gemm``; they differ in grouping, padding and host
syncs, which is what the spec compares (padding / slicing / concatenation / shuffling). They call
the ops unchecked (``ops.backend_for``): the layer checked its weights once, and every other
tensor here is made by the layer.
"""

from __future__ import annotations

from typing import Callable, ClassVar

import torch
from torch import Tensor

from .._registry import Registry
from ..config import MoEConfig
from ..ops import Ops
from ..types import ExpertWeights, Routing

Activation = Tensor | tuple[Tensor, Tensor]  # bf16 rows, or fp8 (q, scale) rows


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
    ops: Ops,
    inp: Activation,
    w: Tensor,
    w_scale: Tensor | None,
    m_sizes: Tensor,
    out_dtype: torch.dtype,
    *,
    weight_ids: Tensor | None = None,
    row_weights: Tensor | None = None,
    scatter_ids: Tensor | None = None,
    out: Tensor | None = None,
    scatter_unique: bool = False,
    all_rows: bool = False,
) -> Tensor:
    """grouped_gemm on rows in out_dtype or on fp8 (q, scale) rows against (w, w_scale)."""
    x, x_scale = inp if isinstance(inp, tuple) else (inp, None)
    return ops.grouped_gemm(x, w, m_sizes, x_scale, w_scale, weight_ids, row_weights,
                            scatter_ids, out, out_dtype, scatter_unique, all_rows)


def pair_weights(routing: Routing, cfg: MoEConfig) -> tuple[Tensor | None, Tensor | None]:
    """(weights applied at the input, weights applied at the output): one of them is None."""
    if cfg.apply_router_weight_on_input:
        return routing.weights, None
    return None, routing.weights
