"""Dispatchers: where routed tokens go and how results come back (vLLM's PrepareAndFinalize).

A dispatcher owns one call of an expert strategy: it moves the layer's tokens to where the expert
weights live (prepare), runs the strategy there, and brings the results back into ``out``
(finalize). Local: nothing moves. Tensor parallel: every rank holds a slice of every expert and
the partial outputs are summed. Expert parallel: every rank holds whole experts and tokens travel.
"""

from __future__ import annotations

from typing import Callable, ClassVar

import torch
from torch import Tensor

from .._registry import Registry
from ..config import MoEConfig
from ..experts import Experts
from ..types import ExpertWeights, Routing


class Dispatch:
    name: ClassVar[str]
    graph_safe: ClassVar[bool] = True  # no host sync of its own

    def supports(self, cfg: MoEConfig, experts: Experts, device: torch.device) -> tuple[bool, str]:
        return True, ""

    def run(
        self,
        experts: Experts,
        x: Tensor,
        routing: Routing,
        weights: ExpertWeights,
        out: Tensor,
        cfg: MoEConfig,
        before_combine: Callable[[], None] = lambda: None,
    ) -> None:
        """out [T, D] += routed output of x [T, D] (routing over all cfg.num_experts experts)."""
        raise NotImplementedError


DISPATCHERS: Registry[type[Dispatch]] = Registry("dispatcher")
