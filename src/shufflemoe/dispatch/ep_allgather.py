"""ep_allgather: expert parallelism in graph mode (static shapes, padded, no host sync), the spec's
"Padded Communication with Static Shapes In Graph Mode", with its dedup across tp (see ep.py).

Every source pads to Ts tokens: Tm = ``max_tokens``, or the largest T any rank runs in this call
(agreed on the host before the first collective, so ranks may run different T), divided over
the slices. A = Ts * k pairs. One all-gather moves each source's message, a byte block:

    [counts E * 4 | token ids A * 4 (token mode) | fp8 scales R * 4 | rows R x D]

with R = Ts token rows (token mode: k > 1 sends each token once, not once per pair; used when
the router weight applies to the expert's output) or R = A sorted pair rows (pair mode: Llama 4
scales the input before quantizing; it has k = 1). fp8_rowwise layers send rows already quantized
(1 byte per value); the other formats send rows in the model dtype. Counts ride in the same
block: two collectives per layer, not three.

    1. all_gather(block) over ep (and over tp with dedup): [S, block]
    2. the rows for my El experts, expert-major: one index gather of only
       the valid rows (gather_scale, sizes from the counts on the device)
    3. zero the valid rows of the result buffer (padding is never written), run the strategy
    4. SplitShuffling into the padded send buffer: source s's rows at s * P + i, P = min(El, k) * Ts
       (a group of El experts takes at most min(El, k) pairs of a token: the spec's bound)
    5. (dedup: reduce_scatter over tp of [results | shared expert partial])
    6. all_to_all over ep: my pair j sent to rank d comes back at d * P + (j - offsets[d * El])
    7. ScatterAdd (padded form: ``rows``) of the valid pairs into the output
    8. (dedup: all_gather of the output slices over tp; tp > 1 without dedup: all_reduce)

Received bytes per rank (``traffic``): (ep - 1) * block + (ep - 1) * P * D * b (+ the tp terms);
e.g. DeepSeek-V3 EP8 decode, T = 64, bf16: 6.5 MB gathered (1 + 64 rows of 14 KB from each of 7
ranks; pair rows would be 51.4 MB) and 51.4 MB returned (P = 512 rows each): 57.9 MB, against
102.8 MB sending pairs (44% fewer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ..experts.base import QuantizedRows, quantizes_rows
from ..ops import FP8_DTYPE, gather_scale, scatter_add, split_shuffling
from .base import DISPATCHERS, Collective
from .comm import all_gather, all_reduce, all_to_all
from .ep import ExpertParallelDispatch, alloc, gather_rows, segments, zero_rows


@dataclass(frozen=True)
class Block:
    """One source's all-gathered message: metadata in whole rows first, then R rows."""

    experts: int  # E (physical)
    pairs: int  # A = Ts * k
    rows: int  # R
    hidden: int  # D
    row_dtype: torch.dtype  # the layer's dtype, or float8_e4m3fn
    token_mode: bool  # rows are tokens (with token ids) rather than sorted pairs

    @property
    def row_bytes(self) -> int:
        return self.hidden * self.row_dtype.itemsize

    @property
    def fp8(self) -> bool:
        return self.row_dtype == FP8_DTYPE

    @property
    def _ids_at(self) -> int:
        return 4 * self.experts

    @property
    def _scales_at(self) -> int:
        return self._ids_at + (4 * self.pairs if self.token_mode else 0)

    @property
    def meta_rows(self) -> int:
        meta = self._scales_at + (4 * self.rows if self.fp8 else 0)
        return math.ceil(meta / self.row_bytes)

    @property
    def total_rows(self) -> int:
        n = self.meta_rows + self.rows
        while n * self.row_bytes % 4:  # int32 views of every block stay aligned
            n += 1
        return n

    @property
    def nbytes(self) -> int:
        return self.total_rows * self.row_bytes

    def counts(self, buf: Tensor) -> Tensor:  # buf [S, nbytes] uint8 -> [S, E] int32
        return buf[:, : self._ids_at].view(torch.int32)

    def token_ids(self, buf: Tensor) -> Tensor:  # -> [S, A] int32
        return buf[:, self._ids_at : self._ids_at + 4 * self.pairs].view(torch.int32)

    def scales(self, buf: Tensor) -> Tensor:  # -> [S, R] float32
        return buf[:, self._scales_at : self._scales_at + 4 * self.rows].view(torch.float32)

    def all_rows(self, buf: Tensor) -> Tensor:  # -> [S * total_rows, D]: row i of source s at
        return buf.view(-1).view(self.row_dtype).view(-1, self.hidden)  # s * total + meta + i

    def all_scales(self, buf: Tensor) -> Tensor:  # -> [S * nbytes / 4, 1] float32
        return buf.view(-1).view(torch.float32).view(-1, 1)


@DISPATCHERS.register("ep_allgather")
class AllGatherDispatch(ExpertParallelDispatch):
    name = "ep_allgather"
    graph_safe = True

    def __init__(self, mesh, cfg, *, dedup=True, placement=None, max_tokens: int | None = None):
        super().__init__(mesh, cfg, dedup=dedup, placement=placement)
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 0):
            raise ValueError(f"max_tokens must be None or an int >= 0, got {max_tokens!r}")
        # Tokens every rank pads to (static, as CUDA graphs want); None: the largest T of the call.
        self.max_tokens = max_tokens

    def graph_error(self, buckets):
        # Each rank replays the bucket of its own T: the captured collectives must have the same
        # sizes in every bucket, which a static max_tokens gives.
        if self.max_tokens is None and len(set(buckets)) > 1:
            return "several token buckets need max_tokens (ranks may replay different buckets)"
        if self.max_tokens is not None and max(buckets) > self.max_tokens:
            return f"token buckets {sorted(buckets)} exceed max_tokens={self.max_tokens}"
        return None

    def settings(self, layer):
        return dict(super().settings(layer),
                    max_tokens=-1 if self.max_tokens is None else self.max_tokens)

    def size_error(self, tokens):
        if self.max_tokens is not None and max(tokens) > self.max_tokens:
            over = [r for r, t in enumerate(tokens) if t > self.max_tokens]
            return f"ranks {over} have more tokens than max_tokens={self.max_tokens}"
        return super().size_error(tokens)

    @staticmethod
    def block(cfg, num_physical: int, Ts: int) -> Block:
        token_mode = not cfg.apply_router_weight_on_input
        A = Ts * cfg.top_k
        return Block(num_physical, A, Ts if token_mode else A, cfg.hidden_size,
                     FP8_DTYPE if quantizes_rows(cfg.quantization) else cfg.dtype, token_mode)

    def padded_tokens(self, tokens: list[int]) -> int:
        """Ts: tokens every source pads to."""
        Tm = max(tokens) if self.max_tokens is None else self.max_tokens
        return math.ceil(Tm / self.slices)

    def forward(self, layer, x, tokens):
        cfg, m = layer.config, self.mesh
        T, D = x.shape
        Ts = self.padded_tokens(tokens)
        blk = self.block(cfg, self.num_physical, Ts)
        El, S, k = self.num_local, self.num_sources, cfg.top_k
        P = min(El, k) * Ts
        lo, n = self.slice_of(T, m.tp_rank)
        x_loc = x[lo : lo + n]
        r = self.routing_of(layer, x_loc, self.source, observe=True)
        out, join = layer.start_shared(x)  # dedup: the partial for all T tokens, sliced below
        gathered = self._exchange(layer, x_loc, r, blk)  # [S, nbytes]
        xe, C, total = self._receive(blk, gathered, P)
        ye = zero_rows(alloc(S * P, D, dtype=x.dtype, device=x.device), total)
        local = self.local_routing(C, S * P, self.capacity(layer, tokens))
        layer.experts.forward(xe, local, layer.expert_weights, ye, self.recv_cfg)
        shared_rows = math.ceil(T / self.slices) if self.dedup and layer.shared_w13 is not None else 0
        chunk = m.ep * P + shared_rows  # one tp rank's part of the reduce-scatter
        s = torch.arange(S, device=x.device)
        dest = (s // m.ep) * chunk + (s % m.ep) * P  # where source s's results go
        to_send = alloc(self.slices * chunk, D, dtype=x.dtype, device=x.device)
        split_shuffling(ye, C.int(), dest, out=to_send)
        join()
        if self.dedup:
            back, own = self.reduce_over_tp(to_send, out, chunk, m.ep * P, shared_rows, T)
        else:
            back, own = to_send, out
        recv = alloc(m.ep * P, D, dtype=x.dtype, device=x.device)
        all_to_all(recv, back, m.groups["ep"], m.ep)
        dest_rank = r.expert_ids.long().clamp(0, self.num_physical - 1) // El
        j = torch.arange(r.num_pairs, device=x.device)
        rows = torch.where(r.valid_mask(), dest_rank * P + j - r.offsets()[dest_rank * El], 0)
        # each token's rows in a fixed order; own may hold padding rows past the slice's n tokens
        scatter_add(own[:n], recv, r.token_ids, self.output_weights(r, cfg),
                    num_valid=r.num_valid, rows=rows, positions=r.positions)
        if self.dedup:
            full = alloc(self.slices * own.shape[0], D, dtype=x.dtype, device=x.device)
            return all_gather(full, own, m.groups["tp"], m.tp)[:T]
        return all_reduce(out, m.groups["tp"], m.tp)

    def _exchange(self, layer, x_loc: Tensor, r, blk: Block) -> Tensor:
        """This source's block, all-gathered: [S, nbytes] in buffer order."""
        m, cfg, dev = self.mesh, layer.config, x_loc.device
        send = alloc(1, blk.nbytes, dtype=torch.uint8, device=dev)
        blk.counts(send)[0].copy_(r.counts)
        rows = blk.all_rows(send)[blk.meta_rows : blk.meta_rows + blk.rows]  # [R, D]
        scales = blk.scales(send)[0]  # [R] (fp8)
        if blk.token_mode:
            blk.token_ids(send)[0, : r.num_pairs].copy_(r.token_ids)
            n = x_loc.shape[0]
            ids, w, valid = torch.arange(n, device=dev), None, None
        else:
            n, ids, w, valid = r.num_pairs, r.token_ids, self.input_weights(r, cfg), r.num_valid
        out = (rows[:n], scales[:n]) if blk.fp8 else rows[:n]
        gather_scale(x_loc, ids, w, num_valid=valid, quantize=blk.fp8, out=out)
        gathered = alloc(m.ep, blk.nbytes, dtype=torch.uint8, device=dev)
        all_gather(gathered, send, m.groups["ep"], m.ep)
        if not self.dedup:
            return gathered
        both = alloc(self.num_sources, blk.nbytes, dtype=torch.uint8, device=dev)
        return all_gather(both, gathered, m.groups["tp"], m.tp)

    def _receive(self, blk: Block, gathered: Tensor, P: int):
        """(rows for my experts [S * P, D], expert-major, sources in buffer order inside an
        expert; counts [S, El]; valid rows [1])."""
        dev, S, El = gathered.device, self.num_sources, self.num_local
        counts = blk.counts(gathered).long()  # [S, E]
        C = counts[:, self.first : self.first + El]  # [S, El]
        before = counts[:, : self.first].sum(1)  # [S] pairs ahead of my experts
        N = S * P
        e, s, o, valid = segments(C, N)
        total = C.sum().reshape(1)
        j = torch.where(valid, before[s] + (C.cumsum(1) - C)[s, e] + o, 0)  # pair in source s
        j = j.clamp(max=max(blk.pairs - 1, 0))
        row = blk.token_ids(gathered)[s, j].long() if blk.token_mode else j
        src = torch.where(valid, s * blk.total_rows + blk.meta_rows + row, 0)
        xe = gather_rows(blk.all_rows(gathered), src, total,
                         out=alloc(N, blk.hidden, dtype=blk.row_dtype, device=dev))
        if blk.fp8:
            at = (blk._scales_at // 4) + s * (blk.nbytes // 4) + row
            scale = gather_rows(blk.all_scales(gathered), torch.where(valid, at, 0), total,
                                out=alloc(N, 1, dtype=torch.float32, device=dev))
            xe = QuantizedRows(xe, scale.view(-1))
        return xe, C, total

    @classmethod
    def traffic(cls, cfg, ep, tp, tokens, counts, rank, *, dedup=True, placement=None,
                max_tokens=None):
        slices = tp if dedup and tp > 1 else 1
        P_E = placement.size if placement else cfg.num_experts
        Tm = max(tokens) if max_tokens is None else max_tokens
        Ts = math.ceil(Tm / slices)
        blk = cls.block(cfg, P_E, Ts)
        P = min(P_E // ep, cfg.top_k) * Ts
        row = cfg.hidden_size * cfg.dtype.itemsize
        T = tokens[rank]
        out = [Collective("all_gather", "ep", ep, (ep - 1) * blk.nbytes)]
        if slices > 1:
            Tsl = math.ceil(T / slices)
            shared = Tsl if cfg.shared_intermediate_size else 0
            out += [Collective("all_gather", "tp", tp, (tp - 1) * ep * blk.nbytes),
                    Collective("reduce_scatter", "tp", tp, (tp - 1) * (ep * P + shared) * row)]
        out.append(Collective("all_to_all", "ep", ep, (ep - 1) * P * row))
        if slices > 1:
            out.append(Collective("all_gather", "tp", tp, (tp - 1) * Tsl * row))
        elif tp > 1:
            out.append(Collective("all_reduce", "tp", tp, 2 * (tp - 1) / tp * T * row))
        return out
