"""Expert parallelism (the spec's "Expert Parallelism for Multi-Host Inference"), alone or crossed
with tensor parallelism, with its communication deduplication. This file holds what the eager
(ep_alltoall.py) and graph (ep_allgather.py) forms share.

Layout on the (ep, tp) mesh: rank (e, t) holds the El = E / ep experts [e * El, (e + 1) * El)
(physical slots under EPLB, eplb.py), each cut to the I / tp columns t (the TP cut of shard.py;
tp = 1 is plain EP), router and shared expert whole (shared: cut by tp too). Ranks of one tp group
run the same tokens x [T, D]; ep ranks run different tokens.

Sources: a source is a set of tokens routed by one rank and sent to the experts' ranks.
- Without deduplication a source is an ep rank's whole batch: the ep group of (e, t) is the ranks
  (*, t), so every rank of a tp group sends the same tokens over the ep dimension (tp times).
- With deduplication (tp > 1, the spec's DP2/TP8/EP2 scheme) rank (e, t) routes only slice t of
  its T tokens (ceil(T / tp) each), so each token crosses the ep dimension once; the received
  rows are all-gathered over tp (each tp rank needs every row for its I / tp columns), the
  results are reduce-scattered back over tp (fully summed, each rank keeping the rows it
  received), returned over ep, and the output slices all-gathered over tp. The shared expert's
  partial output rides in the same reduce-scatter. Sources are then (t', e') pairs.
Sources arrive in buffer order (slice, then ep rank: the order of the two all-gathers); capacity
drops follow the global order (ep rank, then slice), which is the order of the tokens if one
device held them all: an expert keeps its first capacity(T_total) pairs in that order, over all
ranks, as one process would.

On the receiving side a local Routing makes received row i its own token with weight 1 (the
routing weights stay with the source or were applied before sending), so every expert strategy
runs unchanged on what arrives, and fp8_rowwise rows arrive quantized (experts.base.QuantizedRows;
the other formats' rows travel in the model dtype and are quantized, if at all, by the strategy).
"""

from __future__ import annotations

import math
import zlib

import torch
from torch import Tensor

from ..config import MoEConfig
from ..experts.base import gather_rows
from ..ops import gather_scale
from ..types import Routing
from .comm import reduce_scatter
from .eplb import Placement, balanced, spread
from .mesh import Mesh, as_mesh
from .shard import (ParallelDispatch, dropless_routing, layer_weights, own, require_local,
                    routing_error, tp_config, tp_cut, tp_cut_error)

_EXPERT_SHARDED = ("w13", "w2", "w13_scale", "w2_scale", "w13_bias", "w2_bias")  # replicas too
# Every intermediate buffer is allocated here; rows it leaves unwritten must never be read, which
# the tests check by swapping in a NaN-filling allocator (shufflemoe.testing.poisoned).
alloc = torch.empty


class ExpertParallelDispatch(ParallelDispatch):
    def __init__(self, mesh: Mesh, cfg: MoEConfig, *, dedup: bool = True,
                 placement: Placement | None = None) -> None:
        super().__init__(mesh)
        self.num_experts = cfg.num_experts  # E, logical
        self.placement = placement
        self.num_physical = placement.size if placement else cfg.num_experts
        self.num_local = self.num_physical // mesh.ep  # El
        self.first = mesh.ep_rank * self.num_local
        self.dedup = dedup and mesh.tp > 1
        self.slices = mesh.tp if self.dedup else 1  # sources per ep rank
        self.num_sources = mesh.ep * self.slices  # S
        # Buffer order of sources is (slice, ep rank): all-gather over ep (inter-node, 1 / tp of
        # the tokens), then over tp. Global order is (ep rank, slice): order[g] = buffer index of
        # the g-th source in global order (capacity drops follow it).
        self.order = [(g % self.slices) * mesh.ep + g // self.slices
                      for g in range(self.num_sources)]
        self.source = mesh.tp_rank * mesh.ep + mesh.ep_rank if self.dedup else mesh.ep_rank
        self.recv_cfg = cfg.replace(
            num_experts=self.num_local, top_k=1, router="topk", scoring="softmax",
            renormalize=False, renormalize_over="kept", correction_bias=False, n_group=1,
            topk_group=1, routed_scaling_factor=1.0, capacity_factor=None,
            apply_router_weight_on_input=False, shared_intermediate_size=0,
            shared_expert_gate=False)
        self.observed: Tensor | None = None  # [E] int64 logical pairs routed here so far
        self._tables: dict = {}

    def describe(self) -> str:
        extra = (" dedup" if self.dedup else "") + (
            f" +{self.num_physical - self.num_experts} redundant" if self.placement else "")
        return f"{self.name} on {self.mesh.describe()}{extra}"

    # ---- construction ------------------------------------------------------------------------

    @classmethod
    def build(cls, layer, mesh=None, *, dedup: bool = True, redundant: int = 0,
              placement: Placement | None = None, **options):
        m = as_mesh(mesh, "ep")
        what = f"expert_parallel({cls.name})"
        require_local(layer, m, what)
        cfg = layer.config
        if routing_error(cfg):
            raise ValueError(f"{what}: {routing_error(cfg)}")
        E = cfg.num_experts
        if placement is None and redundant:
            placement = balanced(None, E, m.ep, redundant)
        elif placement is not None and (placement.num_logical != E or placement.ranks != m.ep):
            raise ValueError(f"{what}: the placement is for {placement.num_logical} experts on "
                             f"{placement.ranks} ranks, the layer has {E} on ep={m.ep}")
        if placement is not None and cfg.capacity_factor is not None:
            raise ValueError(f"{what}: capacity_factor cannot be used with redundant experts (a "
                             "replica cannot know how many pairs the others kept)")
        P = placement.size if placement else E
        if P % m.ep:
            raise ValueError(f"{what}: ep={m.ep} must divide num_experts ({P})")
        El = P // m.ep
        slots = range(m.ep_rank * El, (m.ep_rank + 1) * El)
        ids = torch.tensor([placement.experts[p] if placement else p for p in slots],
                           device=layer.w13.device)
        weights = layer_weights(layer)
        for name in _EXPERT_SHARDED:
            if weights[name] is not None:
                weights[name] = own(weights[name].index_select(0, ids))
        weights = tp_cut(layer, weights, m.tp, m.tp_rank)
        local = tp_config(cfg, m.tp)
        dispatch = cls(m, local, dedup=dedup, placement=placement, **options)
        split = dispatch.shared_split(local)
        if split:
            weights["shared_w13"] = _two_parts(weights["shared_w13"], split)
        new = type(layer).from_weights(local, num_local_experts=El,
                                       experts=layer.experts.name, dispatch=dispatch, **weights)
        new.shared_split = split
        return new

    def shared_split(self, cfg: MoEConfig) -> int:
        """Columns of the shared expert's first part (0: one part)."""
        return 0

    @classmethod
    def layouts(cls, cfg, ep, tp):
        if ep < 2 or cfg.num_experts % ep or tp_cut_error(cfg, tp) or routing_error(cfg):
            return []
        return [dict(dedup=False)] + ([dict(dedup=True)] if tp > 1 else [])

    def supports(self, cfg, experts, device):
        if cfg.num_experts != self.num_experts:
            return False, f"built for {self.num_experts} experts, the layer has {cfg.num_experts}"
        return True, ""

    # ---- sizes ---------------------------------------------------------------------------------

    def settings(self, layer):
        placement = str(self.placement.experts) if self.placement else ""
        return dict(super().settings(layer), placement=zlib.crc32(placement.encode()))

    def size_error(self, tokens):
        return self.replicated_rule(tokens) if self.mesh.tp > 1 else None

    def slice_of(self, T: int, t: int) -> tuple[int, int]:
        """(first token, tokens) of slice t of an ep rank's T tokens."""
        if not self.dedup:
            return 0, T
        Ts = math.ceil(T / self.slices)
        lo = min(T, t * Ts)
        return lo, min(T, lo + Ts) - lo

    def total_tokens(self, tokens: list[int]) -> int:
        """Tokens of the whole batch (a tp group's tokens counted once)."""
        return sum(tokens[e * self.mesh.tp] for e in range(self.mesh.ep))

    # ---- routing ---------------------------------------------------------------------------------

    def routing_of(self, layer, x: Tensor, source: int, observe: bool = False) -> Routing:
        """The Routing source ``source`` (buffer index) sends for its tokens x [Ts, D], over
        physical slots: dropless (receivers apply the capacity). ``observe``: add the logical
        counts to ``observed`` (one add on the device)."""
        r = dropless_routing(layer, x)
        if observe:
            if self.observed is None:
                self.observed = torch.zeros(self.num_experts, dtype=torch.int64, device=x.device)
            self.observed += r.counts
        if self.placement is None:
            return r
        dev = x.device
        if ("eplb", dev) not in self._tables:
            self._tables["eplb", dev] = self.placement.table(dev)
        table, n = self._tables["eplb", dev]
        return spread(r, table, n, self.num_physical, layer.config.top_k, salt=source)

    def local_routing(self, counts: Tensor, num_rows: int, capacity: int | None) -> Routing:
        """The receiving side's Routing of num_rows expert-major rows: counts [S, El] rows per
        (source, local expert), sources in buffer order inside each expert. Row i is its own
        token, weight 1. With a capacity, an expert keeps its first ``capacity`` pairs in global
        order (ep rank, then slice: one device's order); the result rows of the others stay
        zero."""
        dev = counts.device
        c = counts.long()
        per_expert = c.sum(0)  # [El]
        total = per_expert.sum().reshape(1)
        ones = torch.ones(num_rows, dtype=torch.float32, device=dev)
        e, s, o, valid = segments(c, num_rows)
        if capacity is None:
            rows = torch.arange(num_rows, device=dev, dtype=torch.int32)
            expert = torch.where(valid, e, c.shape[1]).int()
            return Routing(per_expert.int(), rows, expert, ones, total.int(), positions=rows)
        g = torch.tensor(self.order, device=dev)  # global position -> buffer index
        ahead = torch.empty_like(c)
        ahead[g] = c[g].cumsum(0) - c[g]  # [S, El] pairs of sources ahead in global order
        kept_counts = (capacity - ahead).clamp(min=0).minimum(c)  # [S, El]
        kept = valid & (o < kept_counts[s, e])
        order = torch.sort((~kept).to(torch.int8), stable=True).indices  # kept rows first
        positions = torch.empty_like(order)
        positions[order] = torch.arange(num_rows, device=dev)
        return Routing(kept_counts.sum(0).int(), order.int(), e[order].int(), ones,
                       kept.sum().reshape(1).int(), positions=positions.int())

    def reduce_over_tp(self, to_send: Tensor, shared: Tensor | None, chunk: int, results: int,
                       shared_rows: int, T: int) -> tuple[Tensor, Tensor]:
        """Dedup: to_send [tp * chunk, D] holds, per tp rank t', the partial results of the rows
        its sources sent ([results] rows) and room for slice t''s shared expert output
        ([shared_rows]). Sum over tp, keep this rank's chunk -> (its result rows [results, D],
        its slice's output [ceil(T / tp), D], holding the shared expert's output)."""
        m, D = self.mesh, to_send.shape[1]
        if shared_rows:
            for t in range(self.slices):  # slice t's shared partial into chunk t
                lo, cnt = self.slice_of(T, t)
                to_send[t * chunk + results : t * chunk + results + cnt].copy_(shared[lo : lo + cnt])
        mine = alloc(chunk, D, dtype=to_send.dtype, device=to_send.device)
        reduce_scatter(mine, to_send, m.groups["tp"], m.tp)
        own = mine[results:] if shared_rows else torch.zeros(
            math.ceil(T / self.slices), D, dtype=to_send.dtype, device=to_send.device)
        return mine[:results], own

    def capacity(self, layer, tokens: list[int]) -> int | None:
        return layer.config.capacity(self.total_tokens(tokens))

    def input_weights(self, routing: Routing, cfg: MoEConfig) -> Tensor | None:
        return routing.weights if cfg.apply_router_weight_on_input else None

    def output_weights(self, routing: Routing, cfg: MoEConfig) -> Tensor | None:
        return None if cfg.apply_router_weight_on_input else routing.weights


def _two_parts(w13: Tensor, h: int) -> Tensor:
    """[2Is, D] gate rows then up rows -> [gate[:h]; up[:h]; gate[h:]; up[h:]] (MoE.shared_split)."""
    gate, up = w13.chunk(2, dim=0)
    return torch.cat([gate[:h], up[:h], gate[h:], up[h:]])


def segments(counts: Tensor, num_rows: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Expert-major rows of counts [S, El] (segments (expert, source), source order inside an
    expert) -> for each of num_rows rows: (expert, source, offset in its segment, valid) [N]."""
    S, El = counts.shape
    seg_len = counts.long().t().reshape(-1)  # [El * S]
    ends = seg_len.cumsum(0)
    i = torch.arange(num_rows, device=counts.device)
    if seg_len.numel() == 0:
        zero = torch.zeros_like(i)
        return zero, zero, zero, torch.zeros_like(i, dtype=torch.bool)
    seg = torch.searchsorted(ends, i, right=True).clamp(max=El * S - 1)
    return seg // S, seg % S, i - (ends - seg_len)[seg], i < ends[-1]


def zero_rows(buf: Tensor, num_valid: Tensor) -> Tensor:
    """Zero the first num_valid [1] rows of buf [N, D] (device count: the rest, padding, is never
    written): a gather from one zero row."""
    zero = torch.zeros(1, buf.shape[1], dtype=buf.dtype, device=buf.device)
    index = torch.zeros(buf.shape[0], dtype=torch.int32, device=buf.device)
    return gather_scale(zero, index, num_valid=num_valid, out=buf)


__all__ = ["ExpertParallelDispatch", "alloc", "gather_rows", "zero_rows"]
