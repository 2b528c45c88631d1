"""CUDA-graph decode: capture a layer once per token bucket, replay it with any routing.

The layer's ``shuffled`` path reads every size on the device, so one captured graph serves every
routing: only the input changes. Inputs are padded with zero rows up to the smallest bucket that
fits (each token's output depends on its own row only, so padding never changes real rows; the
zero rows do route to experts 0..k-1, which may read one or two experts more than needed).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .layer import MoE

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class GraphedMoE:
    """Callable like the layer: x [T, D] or [B, S, D] -> same shape. Token counts above the
    largest bucket run eagerly."""

    def __init__(self, layer: MoE, token_buckets: Sequence[int] = DEFAULT_BUCKETS, warmup: int = 2):
        cfg = layer.config
        if not layer.w13.is_cuda:
            raise ValueError("graphed() needs a layer on a CUDA device")
        for part in (layer.experts, layer.dispatch):
            if not part.graph_safe:
                raise ValueError(f"{part.name} syncs with the host and cannot be captured")
        why = layer.dispatch.graph_error(token_buckets)
        if why:
            raise ValueError(f"{layer.dispatch.name}: {why}")
        if cfg.capacity_factor is not None:
            raise ValueError("graphed() pads the batch, which would change capacity-factor drops")
        if not token_buckets or any(b <= 0 for b in token_buckets):
            raise ValueError(f"token_buckets must be positive ints, got {token_buckets!r}")
        self.layer = layer
        self.buckets = sorted(set(token_buckets))
        dev = layer.w13.device
        self._inputs: dict[int, Tensor] = {}
        self._outputs: dict[int, Tensor] = {}
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        pool = None
        side = torch.cuda.Stream(dev)
        for b in reversed(self.buckets):  # largest first, so the rest fit in its memory pool
            x = torch.zeros(b, cfg.hidden_size, dtype=cfg.dtype, device=dev)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):  # warm up (compiles kernels) off the capture stream
                for _ in range(warmup):
                    layer(x)
            torch.cuda.current_stream(dev).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                y = layer(x)
            pool = graph.pool()
            self._inputs[b], self._outputs[b], self._graphs[b] = x, y, graph

    def __call__(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, x.shape[-1])
        T = flat.shape[0]
        bucket = next((b for b in self.buckets if b >= T), None)
        if bucket is None:
            return self.layer(x)
        static = self._inputs[bucket]
        static[:T].copy_(flat)
        static[T:].zero_()
        self._graphs[bucket].replay()
        return self._outputs[bucket][:T].clone().view(x.shape)


def graphed(layer: MoE, token_buckets: Sequence[int] = DEFAULT_BUCKETS, warmup: int = 2) -> GraphedMoE:
    """Capture ``layer`` in CUDA graphs, one per token-count bucket."""
    return GraphedMoE(layer, token_buckets, warmup)
