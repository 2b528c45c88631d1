"""Expert-parallel load balancing (EPLB): redundant experts.

With skewed routing one EP rank receives several times its share of pairs (the Neuron guide: 3-4x
the average in the worst case), and the layer runs at the pace of that rank. EPLB gives the
hottest experts more than one physical slot ("replica") on different ranks and spreads each
expert's pairs evenly over its replicas:

    Placement.experts [P]: the logical expert held by physical slot p (P = E + redundant slots,
                           P / ep slots per rank, rank r holds slots [r * P / ep, (r+1) * P / ep))
    balanced(load, ep, redundant): the rebalancer. Replicas go one at a time to the expert with
                           the most load per replica; then replicas, heaviest first, go to the
                           least-loaded rank that has a free slot and no replica of that expert.
    spread(routing): pair i of logical expert e (its o-th pair, in the sorted order) goes to
                           replica (o + salt) mod n_e of e, salt = the source's index, so every
                           replica gets the same share within one pair; the routing is re-sorted
                           by physical slot. On the device, no host sync.

Dispatchers record the logical counts they route (``observed_load``); ``rebalance`` in
parallel.py turns them into a new placement. Capacity factors are refused with EPLB: a replica
cannot know how many pairs the other replicas of its expert kept.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..ops import sort_by_expert
from ..types import Routing


@dataclass(frozen=True)
class Placement:
    experts: tuple[int, ...]  # [P] logical expert of each physical slot, rank-major
    num_logical: int  # E
    ranks: int  # ep

    def __post_init__(self) -> None:
        P, E = len(self.experts), self.num_logical
        if P % self.ranks:
            raise ValueError(f"{P} physical experts do not split over {self.ranks} ranks")
        if sorted(set(self.experts)) != list(range(E)):
            raise ValueError(f"a placement must hold every one of the {E} experts at least once")

    @property
    def size(self) -> int:
        return len(self.experts)

    @property
    def per_rank(self) -> int:
        return self.size // self.ranks

    def replicas(self) -> list[list[int]]:
        """Physical slots of each logical expert."""
        slots: list[list[int]] = [[] for _ in range(self.num_logical)]
        for p, e in enumerate(self.experts):
            slots[e].append(p)
        return slots

    def rank_loads(self, load: list[float]) -> list[float]:
        """Pairs each rank receives when logical expert e receives load[e] pairs, spread evenly
        over its replicas."""
        n = [len(s) for s in self.replicas()]
        per = self.per_rank
        return [sum(load[e] / n[e] for e in self.experts[r * per : (r + 1) * per])
                for r in range(self.ranks)]

    def table(self, device: torch.device) -> tuple[Tensor, Tensor]:
        """(replica table [E, max replicas] int64, replica counts [E] int64) on ``device``."""
        slots = self.replicas()
        width = max(len(s) for s in slots)
        table = torch.tensor([s + s[:1] * (width - len(s)) for s in slots], dtype=torch.int64)
        return table.to(device), torch.tensor([len(s) for s in slots], device=device)


def balanced(load: list[float] | None, num_experts: int, ranks: int, redundant: int) -> Placement:
    """The placement for observed per-expert ``load`` (None: uniform) with ``redundant`` extra
    slots; deterministic (ties go to the lower expert id and rank)."""
    E = num_experts
    load = [1.0] * E if load is None else [float(v) for v in load]
    if len(load) != E:
        raise ValueError(f"load must have one value per expert ({E}), got {len(load)}")
    if redundant < 0 or (E + redundant) % ranks:
        raise ValueError(f"E + redundant ({E} + {redundant}) must be a multiple of ep ({ranks})")
    n = [1] * E
    for _ in range(redundant):
        e = max((e for e in range(E) if n[e] < ranks), key=lambda e: (load[e] / n[e], -e))
        n[e] += 1
    items = sorted(((load[e] / n[e], e) for e in range(E) for _ in range(n[e])),
                   key=lambda it: (-it[0], it[1]))
    per = (E + redundant) // ranks
    held: list[list[int]] = [[] for _ in range(ranks)]
    total = [0.0] * ranks
    for w, e in items:
        free = [r for r in range(ranks) if len(held[r]) < per]
        fresh = [r for r in free if e not in held[r]] or free
        r = min(fresh, key=lambda r: (total[r], r))
        held[r].append(e)
        total[r] += w
    return Placement(tuple(e for r in range(ranks) for e in sorted(held[r])), E, ranks)


def spread(routing: Routing, table: Tensor, n_replicas: Tensor, num_physical: int, top_k: int,
           salt: int) -> Routing:
    """A dropless Routing over logical experts -> the same pairs over physical slots."""
    A = routing.num_pairs
    if A == 0:
        return sort_by_expert(routing.token_ids.view(0, top_k), num_physical)
    e = routing.expert_ids.long().clamp(0, routing.num_experts - 1)  # [A] sorted order
    o = torch.arange(A, device=e.device) - routing.offsets()[e]  # rank inside its expert
    slot = table[e, (o + salt) % n_replicas[e]]  # [A]
    pos = routing.positions.long()  # token t's j-th choice sits at pos[t * k + j]
    return sort_by_expert(slot[pos].view(-1, top_k), num_physical,
                          routing.weights[pos].view(-1, top_k))
