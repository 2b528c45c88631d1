"""Tensor-parallel dispatch: every rank holds I / tp of every routed expert and of the shared
expert, and all ranks run the same tokens.

    x [T, D] (the same on every rank)
     |- router (replicated): the same Routing on every rank
     |- shared expert slice: out = partial shared output            [T, D]
     |- expert strategy on the I / tp slice: out += partial routed  [T, D]
     `- all_reduce(out) over the group: the full output on every rank

Nothing moves but the output: one all-reduce of T * D values per layer, 2 (tp - 1) / tp * T * D
elements sent and received per rank with a ring. No host sync, so the layer stays capturable when
its strategy is (NCCL collectives can be captured in a CUDA graph). The spec's sequence-parallel
variant (reduce-scatter, each rank keeping T / tp rows) needs the layer to return a [T / tp, D]
output, which MoE.forward does not offer; see parallel.tensor_parallel for how the weights are cut.
"""

from __future__ import annotations

import torch.distributed as dist

from .base import DISPATCHERS, Dispatch


@DISPATCHERS.register("tp")
class TensorParallelDispatch(Dispatch):
    name = "tp"

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self.group = group

    def supports(self, cfg, experts, device):
        if not dist.is_available() or not dist.is_initialized():
            return False, "torch.distributed is not initialized"
        return True, ""

    def run(self, experts, x, routing, weights, out, cfg, before_combine=lambda: None):
        experts.forward(x, routing, weights, out, cfg, before_combine)
        # A strategy may return before its first write (nothing routed) without joining the shared
        # expert's stream; out must be final before the all-reduce reads it.
        before_combine()
        dist.all_reduce(out, group=self.group)
