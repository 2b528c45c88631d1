"""ep_alltoall: expert parallelism in eager mode (dense tensors, dynamic shapes), the spec's
"Unpadded Communication with Dynamic Shapes In Eager Mode", with its dedup across tp (ep.py).

    1. all_to_all of the per-expert counts [ep, El] (1st shot; dedup: all_gather over tp too)
    2. shared expert, first half of its columns: the device stays busy through the host sync
    3. ONE host sync: send and receive sizes copied to the host together (the spec delays the
       send-size copy to share the receive-size one)
    4. all_to_all of the sorted pair rows, exact sizes (2nd shot; fp8_rowwise: fp8 rows + scales;
       dedup: then all_gather over tp, each rank's rows padded to the largest)
    5. CombineShuffling (dense starts) to expert-major, the strategy on the received rows
    6. SplitShuffling back to source order (dedup: reduce_scatter over tp with the shared partial)
    7. all_to_all back (3rd shot, asynchronous) while the shared expert's second half runs
    8. ScatterAdd with the routing weights (dedup: all_gather of the output slices over tp;
       tp > 1 without dedup: all_reduce)
Received bytes per rank (``traffic``): (ep - 1) * El * 4 for the counts, then exactly (pairs other
ranks send here + pairs of this rank's tokens served elsewhere) * D * b: 2 (ep - 1) / ep * T * k
* D * b with uniform routing. Nothing is padded; the host sync makes the layer uncapturable.
"""

from __future__ import annotations

import math

import torch

from ..experts.base import QuantizedRows, quantizes_rows
from ..ops import FP8_DTYPE, combine_shuffling, gather_scale, scatter_add, split_shuffling
from .base import DISPATCHERS, Collective
from .comm import all_gather, all_reduce, all_to_all
from .ep import ExpertParallelDispatch, alloc


@DISPATCHERS.register("ep_alltoall")
class AllToAllDispatch(ExpertParallelDispatch):
    name = "ep_alltoall"
    graph_safe = False  # one host sync per layer: the send and receive sizes

    def shared_split(self, cfg):
        return cfg.shared_intermediate_size // 2

    def forward(self, layer, x, tokens):
        cfg, m, dev = layer.config, self.mesh, x.device
        T, D = x.shape
        EP, El, TPd, S = m.ep, self.num_local, self.slices, self.num_sources
        lo, n = self.slice_of(T, m.tp_rank)
        r = self.routing_of(layer, x[lo : lo + n], self.source, observe=True)
        send_counts = r.counts.view(EP, El)
        recv_counts = alloc(EP, El, dtype=send_counts.dtype, device=dev)
        all_to_all(recv_counts, send_counts, m.groups["ep"], EP)
        all_counts = recv_counts[None]  # [TPd, EP, El]: source (t', e') -> my experts
        if self.dedup:
            all_counts = all_gather(alloc(TPd, EP, El, dtype=recv_counts.dtype, device=dev),
                                    recv_counts, m.groups["tp"], m.tp)
        shared = None
        if layer.shared_w13 is not None:  # (its first half when split)
            shared = layer.shared_expert(x, torch.empty_like(x), 0 if layer.shared_split else None)
        sizes = torch.cat([send_counts.sum(1), all_counts.sum(2).flatten()]).tolist()  # the sync
        send_sizes = sizes[:EP]
        n_recv = [sizes[EP + t * EP : EP + (t + 1) * EP] for t in range(TPd)]  # [t'][e']
        mine = n_recv[m.tp_rank if self.dedup else 0]
        n_send, M = sum(send_sizes), max(sum(v) for v in n_recv)
        ids = r.token_ids[:n_send]  # routed pairs only, rank-major because they are expert-major
        w_in = self.input_weights(r, cfg)
        fp8 = quantizes_rows(cfg.quantization)
        xs = gather_scale(x[lo : lo + n], ids, None if w_in is None else w_in[:n_send],
                          quantize=fp8)
        sent = (xs[0].view(torch.uint8), xs[1].view(-1, 1)) if fp8 else (xs,)
        parts = [self._dispatch(p, send_sizes, mine, M) for p in sent]
        starts = torch.tensor([t * M + sum(n_recv[t][:e]) for t in range(TPd) for e in range(EP)],
                              device=dev)  # source (t', e') at t' * M: dense within a tp block
        C = all_counts.view(S, El)
        N = sum(sizes[EP:])
        xe = [combine_shuffling(p, C, starts, out=alloc(N, *p.shape[1:], dtype=p.dtype,
                                                         device=dev))[0] for p in parts]
        xe = QuantizedRows(xe[0].view(FP8_DTYPE), xe[1].view(-1)) if fp8 else xe[0]
        ye = torch.zeros(N, D, dtype=x.dtype, device=dev)  # every row is data: N is exact
        local = self.local_routing(C, N, self.capacity(layer, tokens))
        layer.experts.forward(xe, local, layer.expert_weights, ye, self.recv_cfg)
        shared_rows = math.ceil(T / TPd) if self.dedup and shared is not None else 0
        chunk = M + shared_rows
        dest = starts + torch.arange(TPd, device=dev).repeat_interleave(EP) * shared_rows
        to_send = split_shuffling(ye, C, dest, out=alloc(TPd * chunk, D, dtype=x.dtype,
                                                          device=dev))
        second_half = (lambda: layer.shared_expert(x, shared, 1)) if layer.shared_split else None
        if self.dedup:
            if second_half:
                second_half()
            returned, own = self.reduce_over_tp(to_send, shared, chunk, M, shared_rows, T)
            returned = returned[: sum(mine)]
        else:
            returned = to_send
            own = shared if shared is not None else torch.zeros_like(x)
        back = alloc(r.num_pairs, D, dtype=x.dtype, device=dev)  # rows past n_send: not read
        work = all_to_all(back[:n_send], returned, m.groups["ep"], EP, send_sizes, mine,
                          async_op=True)
        if second_half and not self.dedup:
            second_half()  # overlaps the 3rd all-to-all
        if work is not None:
            work.wait()
        w_out = self.output_weights(r, cfg)
        # back's row p is pair p (routed pairs come first): each token's rows in a fixed order
        # own may hold padding rows past this slice's n tokens (dedup): the routing covers n
        scatter_add(own[:n], back, r.token_ids, w_out, num_valid=r.num_valid,
                    positions=r.positions)
        if self.dedup:
            full = alloc(TPd * own.shape[0], D, dtype=x.dtype, device=dev)
            return all_gather(full, own, m.groups["tp"], m.tp)[:T]
        return all_reduce(own, m.groups["tp"], m.tp)

    def _dispatch(self, rows, send_sizes, mine, M):
        """rows [n_send, ...] -> the rows every source sends my experts: [M] (dedup: [tp * M],
        tp rank t' at t' * M), each rank's rows first in its block."""
        m = self.mesh
        buf = alloc(M, *rows.shape[1:], dtype=rows.dtype, device=rows.device)
        all_to_all(buf[: sum(mine)], rows, m.groups["ep"], m.ep, mine, send_sizes)
        if not self.dedup:
            return buf
        every = alloc(m.tp * M, *rows.shape[1:], dtype=rows.dtype, device=rows.device)
        return all_gather(every, buf, m.groups["tp"], m.tp)

    @classmethod
    def traffic(cls, cfg, ep, tp, tokens, counts, rank, *, dedup=True, placement=None):
        slices = tp if dedup and tp > 1 else 1
        e, t = divmod(rank, tp)
        El = (placement.size if placement else cfg.num_experts) // ep
        row = cfg.hidden_size * cfg.dtype.itemsize
        # fp8_rowwise: rows, then their scales; the other formats' rows in the model dtype
        sent = [cfg.hidden_size, 4] if quantizes_rows(cfg.quantization) else [row]

        def pairs(source, d):  # pairs of a source (buffer index) for ep rank d's experts
            return sum(counts[source][d * El : (d + 1) * El])

        src = lambda tt, ee: tt * ep + ee if slices > 1 else ee  # noqa: E731
        me = src(t if slices > 1 else 0, e)
        received = [sum(pairs(src(tt, ee), e) for ee in range(ep)) for tt in range(slices)]
        M = max(received)
        from_others = sum(pairs(src(t if slices > 1 else 0, ee), e) for ee in range(ep) if ee != e)
        served_elsewhere = sum(pairs(me, d) for d in range(ep) if d != e)
        out = [Collective("all_to_all", "ep", ep, (ep - 1) * El * 4)]
        if slices > 1:
            out.append(Collective("all_gather", "tp", tp, (tp - 1) * ep * El * 4))
        out += [Collective("all_to_all", "ep", ep, from_others * b) for b in sent]
        T = tokens[rank]
        if slices > 1:
            shared = math.ceil(T / slices) if cfg.shared_intermediate_size else 0
            out += [Collective("all_gather", "tp", tp, (tp - 1) * M * b) for b in sent]
            out.append(Collective("reduce_scatter", "tp", tp, (tp - 1) * (M + shared) * row))
        out.append(Collective("all_to_all", "ep", ep, served_elsewhere * row))
        if slices > 1:
            out.append(Collective("all_gather", "tp", tp, (tp - 1) * math.ceil(T / slices) * row))
        elif tp > 1:
            out.append(Collective("all_reduce", "tp", tp, 2 * (tp - 1) / tp * T * row))
        return out
