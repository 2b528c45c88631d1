"""Tensor-parallel dispatch: every rank of the tp group holds I / tp of every routed expert and of
the shared expert (the cut is in shard.py), and all ranks run the same tokens.

tp (all-reduce), the spec's TP:
    x [T, D] (the same on every rank)
     |- router (replicated): the same Routing on every rank
     |- shared expert slice: out = partial shared output            [T, D]
     |- expert strategy on the I / tp slice: out += partial routed  [T, D]
     `- all_reduce(out): the full output on every rank
  Received per rank: 2 (tp - 1) / tp * T * D * b (ring). No host sync: capturable.

tp_sp (reduce-scatter, the spec's TP with sequence parallelism): rank t holds the slice x_t
[T / tp, D] of the sequence (as after a sequence-parallel attention) and gets its slice of the
output back.
    x_t [Tl, D] -> router on the slice (the Neuron guide's sequence-parallel router): top-k ids
     |            and weights [Tl, k], gathered after selection instead of logits [Tl, E]
     |            (E / k times fewer bytes: 16x for Qwen3's 128 experts, top-8)
     |- all_gather(x_t) -> x [T, D];  all_gather(top-k) -> Routing of all T tokens
     |- shared expert slice and expert strategy on x: out [T, D] partial
     `- reduce_scatter(out) -> [Tl, D]
  Received per rank: (tp - 1) * Tl * (2 D b + 8 k). Every rank must hold Tl tokens (a sequence
  is padded to a multiple of tp, as Megatron's sequence parallelism does); capacity drops are
  counted over all T tokens, as one device would.
"""

from __future__ import annotations

import torch

from ..ops import sort_by_expert
from .base import DISPATCHERS, Collective
from .comm import all_gather, all_reduce, reduce_scatter
from .mesh import as_mesh
from .shard import (ParallelDispatch, dropless_topk, layer_weights, require_local, routing_error,
                    tp_config, tp_cut, tp_cut_error)


class _TensorParallel(ParallelDispatch):
    """Both forms: built by cutting every expert (and the shared expert) to I / tp on a tp mesh."""

    what: str  # the transform's name in error messages
    drops_on_arrival: bool = False  # routes dropless, applies the capacity after the all-gather

    @classmethod
    def _routing_error(cls, cfg) -> str | None:
        return routing_error(cfg) if cls.drops_on_arrival else None

    @classmethod
    def build(cls, layer, mesh=None, **options):
        if options:
            raise ValueError(f"dispatch {cls.name!r} takes no options, got {sorted(options)}")
        dispatch = cls(as_mesh(mesh, "tp"))
        m = dispatch.mesh
        require_local(layer, m, cls.what)
        if cls._routing_error(layer.config):
            raise ValueError(f"{cls.what}: {cls._routing_error(layer.config)}")
        weights = tp_cut(layer, layer_weights(layer), m.tp, m.tp_rank)
        return type(layer).from_weights(tp_config(layer.config, m.tp),
                                        experts=layer.experts.name, dispatch=dispatch, **weights)

    @classmethod
    def layouts(cls, cfg, ep, tp):
        ok = ep == 1 and tp > 1 and not tp_cut_error(cfg, tp) and not cls._routing_error(cfg)
        return [{}] if ok else []


@DISPATCHERS.register("tp")
class TensorParallelDispatch(_TensorParallel):
    name = "tp"
    what = "tensor_parallel"

    @classmethod
    def traffic(cls, cfg, ep, tp, tokens, counts, rank, **options):
        b = cfg.dtype.itemsize
        return [Collective("all_reduce", "tp", tp,
                           2 * (tp - 1) / tp * tokens[rank] * cfg.hidden_size * b)]

    def size_error(self, tokens):
        return self.replicated_rule(tokens)

    def run(self, experts, x, routing, weights, out, cfg, before_combine=lambda: None):
        experts.forward(x, routing, weights, out, cfg, before_combine)
        # A strategy may return before its first write (nothing routed) without joining the shared
        # expert's stream; out must be final before the all-reduce reads it.
        before_combine()
        m = self.mesh
        all_reduce(out, m.groups["tp"], m.tp)


@DISPATCHERS.register("tp_sp")
class SequenceParallelDispatch(_TensorParallel):
    name = "tp_sp"
    what = "tensor_parallel(sequence_parallel)"
    drops_on_arrival = True

    @classmethod
    def traffic(cls, cfg, ep, tp, tokens, counts, rank, **options):
        rows = (tp - 1) * tokens[rank] * cfg.hidden_size * cfg.dtype.itemsize
        return [Collective("all_gather", "tp", tp, rows),
                Collective("all_gather", "tp", tp, (tp - 1) * tokens[rank] * cfg.top_k * 8),
                Collective("reduce_scatter", "tp", tp, rows)]

    def size_error(self, tokens):
        if len(set(tokens)) > 1:
            return "sequence-parallel ranks must hold slices of equal length"
        return None

    def forward(self, layer, x, sizes):  # x [Tl, D] -> [Tl, D]
        cfg, m = layer.config, self.mesh
        g, tp = m.groups["tp"], m.tp
        Tl, D = x.shape
        T, k = tp * Tl, cfg.top_k
        ids, w = dropless_topk(layer, x)  # [Tl, k] each: selection on this rank's slice only
        meta = torch.cat([ids, w.view(torch.int32)], dim=1)  # [Tl, 2k]: one gather for both
        xs = torch.empty(T, D, dtype=x.dtype, device=x.device)
        all_gather(xs, x, g, tp)
        metas = torch.empty(T, 2 * k, dtype=torch.int32, device=x.device)
        all_gather(metas, meta, g, tp)
        routing = sort_by_expert(metas[:, :k], cfg.num_experts,
                                 metas[:, k:].contiguous().view(torch.float32),
                                 capacity=cfg.capacity(T))
        out, join = layer.start_shared(xs)
        layer.experts.forward(xs, routing, layer.expert_weights, out, cfg, join)
        join()
        mine = torch.empty(Tl, D, dtype=x.dtype, device=x.device)
        return reduce_scatter(mine, out, g, tp)
