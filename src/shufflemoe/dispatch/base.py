"""Dispatchers: where routed tokens go and how results come back (vLLM's PrepareAndFinalize).

A dispatcher owns one layer's forward around an expert strategy: it moves the layer's tokens to
where the expert weights live (prepare), runs the strategy there, and brings the results back
(finalize). Local: nothing moves. Tensor parallel: every rank holds a slice of every expert and
the partial outputs are summed. Expert parallel: every rank holds whole experts and tokens
travel. Each parallel dispatcher also owns the transform that builds its layer from a finished
single-device layer (``build``), the layouts it can be built on (``layouts``) and the exact
traffic of its collectives (``traffic``), which is what the planner prices.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, ClassVar

import torch
from torch import Tensor

from .._registry import Registry
from ..config import MoEConfig
from ..experts import Experts
from ..types import ExpertWeights, Routing

if TYPE_CHECKING:
    from ..layer import MoE


@dataclass(frozen=True)
class Collective:
    """One collective of one forward, as seen by one rank."""

    op: str  # all_gather | reduce_scatter | all_reduce | all_to_all
    dim: str  # mesh dimension: "ep" | "tp"
    size: int  # ranks in the group
    nbytes: float  # bytes this rank receives from the other ranks (all-reduce: ring, 2 (n-1)/n)


class Dispatch:
    name: ClassVar[str]
    graph_safe: ClassVar[bool] = True  # no host sync of its own
    mesh = None  # the dispatch.mesh.Mesh of a parallel dispatcher

    @classmethod
    def build(cls, layer: MoE, mesh=None, **options) -> MoE:
        """This rank's layer, transformed from a finished single-device ``layer`` (collective on
        a parallel mesh)."""
        raise NotImplementedError

    @classmethod
    def layouts(cls, cfg: MoEConfig, ep: int, tp: int) -> list[dict]:
        """The option sets this dispatcher can be built with on an (ep, tp) mesh for ``cfg`` ([]
        if none): the planner ranks every buildable layout and nothing else."""
        return []

    @classmethod
    def traffic(cls, cfg: MoEConfig, ep: int, tp: int, tokens: list[int], counts: list[list[int]],
                rank: int, **options) -> list[Collective]:
        """The collectives of one forward on mesh rank ``rank``: ``tokens`` [ep * tp] tokens per
        rank, ``counts`` [sources][E] routed pairs per expert of each source (see the
        dispatcher's docstring for what a source is)."""
        return []

    def supports(self, cfg: MoEConfig, experts: Experts, device: torch.device) -> tuple[bool, str]:
        return True, ""

    def graph_error(self, buckets) -> str | None:
        """Why graphs of these token buckets cannot be replayed safely (None: they can)."""
        return None

    def admit(self, layer: MoE, x: Tensor, error: Exception | None) -> object:
        """Check x before any collective; returns what forward needs to know about every rank's
        sizes. A single device raises the input's own error."""
        if error is not None:
            raise error
        return None

    def forward(self, layer: MoE, x: Tensor, sizes: object) -> Tensor:
        """The layer's output for x [T, D] (the single-device flow calls ``run``)."""
        return layer._forward(x)

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
