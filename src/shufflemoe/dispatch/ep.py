"""Expert-parallel dispatch: rank r of EP holds the El = E / EP whole experts [r * El, (r + 1) * El)
and routes its own T tokens over all E experts; routed rows travel to the rank of their expert and
the results come back (the spec's "Expert Parallelism for Multi-Host Inference").

Both forms start from the sorted pairs of the rank's Routing: pairs are expert-major, so the pairs
for destination rank r are the contiguous block offsets[r * El] : offsets[(r + 1) * El]. Both end
with a ScatterAdd of the returned rows into ``out`` (which holds the shared expert's output of the
local tokens) with the original routing's weights.

ep_alltoall (eager, dynamic shapes, the spec's 3-shot all-to-all):
  1. a2a of the per-expert counts [E] -> recv_counts [EP, El] (what each source sends to my experts)
  2. ONE host sync: send sizes [EP] and recv sizes [EP] copied to the host together (the spec
     delays the send-size copy to share the recv-size one: one sync per layer)
  3. a2a of the gathered (for apply_router_weight_on_input: already scaled) rows, exact sizes
  4. CombineShuffling (dense starts): rank-major -> expert-major; the strategy runs on the
     N received rows with a local Routing (row i is "token" i, weight 1)
  5. SplitShuffling back to rank-major, a2a back, ScatterAdd with the routing weights.
  Bytes received per rank (sent: the same) with uniform routing: 2 (EP - 1) / EP * T * k * D * b
  (rows in, results back) + (EP - 1) * El * 4 for the counts; exactly, (pairs other ranks send here
  + pairs of this rank's tokens served elsewhere) * D * b. Nothing is padded; the host sync makes
  the layer uncapturable (graph_safe = False).

ep_allgather (graph mode: static shapes, padded, no host sync):
  Every rank pads to Tm tokens (``max_tokens``, or T when all ranks run the same T, as graph
  buckets do), so A = Tm * k pair rows. A group of El experts receives at most P = min(El, k) * Tm
  of one source rank's pairs (a token picks k distinct experts): the spec's bound, padding
  EP * P rows instead of EP * A.
  1. all_gather of the counts [E] -> [EP, E] and of the sorted pair rows [A, D] -> [EP * A, D]
  2. CombineShuffling with padded starts: source rank r's rows for my experts begin at
     r * A + offsets_r[rank * El]; only those are copied, expert-major, into [EP * P, D]
  3. the strategy runs on them (sizes on the device: padding rows cost no FLOPs)
  4. SplitShuffling into the padded send buffer [EP, P, D] (source r's rows at r * P + i)
  5. all_to_all_single with equal splits -> [EP, P, D]: my pair j sent to rank r is at
     r * P + (j - offsets[r * El])
  6. ScatterAdd (padded form: ``rows``) of the valid pairs into out.
  (The spec pads the returned rows to [EP, K * T, D]; P = min(El, K) * T is never larger.) Padding
  rows are allocated and travel, but no kernel reads them: sizes come from the counts on the device.
  Bytes received per rank: (EP - 1) * (A + P) * D * b + (EP - 1) * E * 4 (sent: the same; the
  tests check both volumes exactly with a spy on the collectives). Against
  alltoall's 2 (EP - 1) / EP * T * k * D * b that is EP * (k + min(El, k)) / (2 k) times more: EP
  times when El >= k. E.g. Llama 4 Maverick decode (EP 8, T 64, k 1, D 5120, bf16): 1.15 MB with
  alltoall, 9.2 MB with allgather; DeepSeek-V3 (EP 8, T 64, k 8): 12.8 MB vs 103 MB. The price of
  static shapes: no host sync, so the whole layer fits in one CUDA graph, which is what decode
  (small T, where bytes are few and launch gaps dominate) wants.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from ..ops import combine_shuffling, gather_scale, scatter_add, split_shuffling
from ..types import Routing
from .base import DISPATCHERS, Dispatch

# Every intermediate buffer is allocated here; rows it leaves unwritten must never be read, which
# the tests check by swapping in a NaN-filling allocator (shufflemoe.testing.poisoned).
_alloc = torch.empty
# torch 2.13 renamed all_gather_into_tensor (deprecated there); the GPU image has torch 2.11.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _noop() -> None:
    pass


def local_routing(counts: Tensor, num_rows: int) -> Routing:
    """Routing of num_rows expert-major rows, counts [El] of them per local expert (the first
    sum(counts) rows are valid): row i is its own token, weight 1, so positions is the identity."""
    dev = counts.device
    rows = torch.arange(num_rows, device=dev, dtype=torch.int32)
    ends = counts.long().cumsum(0)  # [El]
    expert_ids = torch.searchsorted(ends, rows.long(), right=True).int()  # El past the valid rows
    weights = torch.ones(num_rows, dtype=torch.float32, device=dev)
    return Routing(counts.int(), rows, expert_ids, weights, ends[-1:].int(), positions=rows)


class _ExpertParallel(Dispatch):
    def __init__(self, num_experts: int, group: dist.ProcessGroup | None = None) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(f"{self.name} needs torch.distributed to be initialized")
        self.group = group
        self.world = dist.get_world_size(group)  # EP
        self.rank = dist.get_rank(group)
        if num_experts % self.world:
            raise ValueError(f"num_experts ({num_experts}) must be a multiple of the group size "
                             f"({self.world})")
        self.num_experts = num_experts  # E
        self.num_local = num_experts // self.world  # El
        self.first = self.rank * self.num_local  # first local expert id

    def supports(self, cfg, experts, device):
        if cfg.num_experts != self.num_experts:
            return False, f"built for {self.num_experts} experts, the layer has {cfg.num_experts}"
        return True, ""

    def _check_weights(self, weights) -> None:
        if weights.num_experts != self.num_local:
            raise ValueError(f"{self.name}: expert weights must hold this rank's {self.num_local} "
                             f"experts, got {weights.num_experts}")

    def _input_weights(self, routing: Routing, cfg) -> Tensor | None:
        return routing.weights if cfg.apply_router_weight_on_input else None

    def _output_weights(self, routing: Routing, cfg) -> Tensor | None:
        return None if cfg.apply_router_weight_on_input else routing.weights


@DISPATCHERS.register("ep_alltoall")
class AllToAllDispatch(_ExpertParallel):
    name = "ep_alltoall"
    graph_safe = False  # one host sync per layer: the send and receive sizes

    def run(self, experts, x, routing, weights, out, cfg, before_combine=_noop):
        self._check_weights(weights)
        EP, El, g, r = self.world, self.num_local, self.group, routing
        D = x.shape[1]
        # 1st a2a: how many of my pairs go to each remote expert -> how many I receive per source.
        send_counts = r.counts.view(EP, El)
        recv_counts = _alloc(EP, El, dtype=send_counts.dtype, device=x.device)
        dist.all_to_all_single(recv_counts, send_counts, group=g)
        sizes = torch.cat([send_counts.sum(1), recv_counts.sum(1)]).tolist()  # the one host sync
        send_sizes, recv_sizes = sizes[:EP], sizes[EP:]
        n_send, n_recv = sum(send_sizes), sum(recv_sizes)
        tokens = r.token_ids[:n_send]  # routed pairs only: dropped ones never leave
        w_in = self._input_weights(r, cfg)
        # 2nd a2a: my sorted pair rows, rank-major because pairs are expert-major.
        xs = gather_scale(x, tokens, None if w_in is None else w_in[:n_send])  # [n_send, D]
        recv = _alloc(n_recv, D, dtype=x.dtype, device=x.device)
        dist.all_to_all_single(recv, xs, recv_sizes, send_sizes, group=g)
        per_source = recv_counts.sum(1).long()
        starts = per_source.cumsum(0) - per_source  # [EP] dense: exclusive prefix sum
        xe, local_counts = combine_shuffling(
            recv, recv_counts, starts, out=_alloc(n_recv, D, dtype=x.dtype, device=x.device))
        ye = torch.zeros_like(xe)  # strategies add into their output
        if n_recv:
            experts.forward(xe, local_routing(local_counts, n_recv), weights, ye, cfg)
        yr = split_shuffling(ye, recv_counts, starts,
                             out=_alloc(n_recv, D, dtype=x.dtype, device=x.device))
        # 3rd a2a: results back to the ranks that own the tokens, in their sorted pair order.
        back = _alloc(n_send, D, dtype=x.dtype, device=x.device)
        dist.all_to_all_single(back, yr, send_sizes, recv_sizes, group=g)
        before_combine()
        w_out = self._output_weights(r, cfg)
        scatter_add(out, back, tokens, None if w_out is None else w_out[:n_send])


@DISPATCHERS.register("ep_allgather")
class AllGatherDispatch(_ExpertParallel):
    name = "ep_allgather"
    graph_safe = True

    def __init__(self, num_experts: int, group: dist.ProcessGroup | None = None,
                 max_tokens: int | None = None) -> None:
        super().__init__(num_experts, group)
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 0):
            raise ValueError(f"max_tokens must be None or an int >= 0, got {max_tokens!r}")
        # Tokens every rank pads to (static); None: each call's T, which must then be the same
        # on every rank (all_gather needs equal sizes).
        self.max_tokens = max_tokens

    def run(self, experts, x, routing, weights, out, cfg, before_combine=_noop):
        self._check_weights(weights)
        EP, El, E, g, r = self.world, self.num_local, self.num_experts, self.group, routing
        T, D = x.shape
        k = cfg.top_k
        Tm = T if self.max_tokens is None else self.max_tokens
        if T > Tm:
            raise ValueError(f"{self.name}: {T} tokens exceed max_tokens={Tm}")
        A, P, dev = Tm * k, min(El, k) * Tm, x.device
        # all_gather of every rank's sorted pair rows and counts (rows past num_valid: padding).
        send = _alloc(A, D, dtype=x.dtype, device=dev)
        gather_scale(x, r.token_ids, self._input_weights(r, cfg), num_valid=r.num_valid,
                     out=send[: r.num_pairs])
        gathered = _alloc(EP * A, D, dtype=x.dtype, device=dev)
        _all_gather(gathered, send, group=g)
        all_counts = _alloc(EP * E, dtype=r.counts.dtype, device=dev)
        _all_gather(all_counts, r.counts, group=g)  # flat: gloo takes no stacked output
        all_counts = all_counts.view(EP, E)
        mine = all_counts[:, self.first : self.first + El].contiguous()  # [EP, El]
        ranks = torch.arange(EP, device=dev)
        starts = ranks * A + all_counts[:, : self.first].long().sum(1)  # [EP] padded starts
        xe, local_counts = combine_shuffling(
            gathered, mine, starts, out=_alloc(EP * P, D, dtype=x.dtype, device=dev))
        ye = torch.zeros_like(xe)  # strategies add into their output
        experts.forward(xe, local_routing(local_counts, EP * P), weights, ye, cfg)
        to_send = split_shuffling(ye, mine, ranks * P,
                                  out=_alloc(EP * P, D, dtype=x.dtype, device=dev))
        recv = _alloc(EP * P, D, dtype=x.dtype, device=dev)
        dist.all_to_all_single(recv, to_send, group=g)
        # Pair j went to rank d = its expert // El and came back at row d * P + (j - offsets[d*El]).
        valid = r.valid_mask()
        dest = r.expert_ids.long().clamp(0, E - 1) // El
        j = torch.arange(r.num_pairs, device=dev)
        rows = torch.where(valid, dest * P + j - r.offsets()[dest * El], 0)
        before_combine()
        scatter_add(out, recv, r.token_ids, self._output_weights(r, cfg), num_valid=r.num_valid,
                    rows=rows)
