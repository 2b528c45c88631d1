"""The collectives the dispatchers use, and the safety rules around them.

Every data collective of a dispatcher goes through the four wrappers below (tests count their
bytes with a spy, and the planner predicts the same numbers). A group of one rank moves nothing.

Safety, because a collective that one rank skips hangs the others (NCCL) or aborts them (gloo):
- ``agree``: before its first collective, a parallel layer shares every rank's token count and
  the verdict of its local input checks through one small all-reduce on the gloo twin of the
  mesh (host memory: no device sync, nothing captured in a CUDA graph). Every rank then applies
  the same rules to the same numbers, so a bad size raises the same ValueError on every rank.
- ``check_replicated``: at construction, a checksum of the weights every rank must hold
  identically (different seeds or checkpoints otherwise give silently wrong outputs).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from .mesh import Mesh

# torch 2.13 renamed these (the old names warn there); the GPU image has torch 2.11.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _wire(t: Tensor) -> Tensor:
    """fp8 travels as bytes: gloo and NCCL move uint8 on every torch version."""
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def _flat(t: Tensor) -> Tensor:
    """1-D: gloo checks that every rank's part has the input's shape, so no stacked outputs."""
    return _wire(t).view(-1)


def all_gather(out: Tensor, inp: Tensor, group: dist.ProcessGroup, size: int) -> Tensor:
    """out [size * n, ...] = every rank's inp [n, ...], in group rank order."""
    if size == 1:
        return out.copy_(inp)
    _all_gather(_flat(out), _flat(inp), group=group)
    return out


def reduce_scatter(out: Tensor, inp: Tensor, group: dist.ProcessGroup, size: int) -> Tensor:
    """out [n, ...] = sum over ranks of their inp [size * n, ...] chunk of this rank."""
    if size == 1:
        return out.copy_(inp)
    _reduce_scatter(_flat(out), _flat(inp), group=group)
    return out


def all_reduce(t: Tensor, group: dist.ProcessGroup, size: int) -> Tensor:
    if size > 1:
        dist.all_reduce(t, group=group)
    return t


def all_to_all(out: Tensor, inp: Tensor, group: dist.ProcessGroup, size: int,
               out_splits: list[int] | None = None, in_splits: list[int] | None = None,
               async_op: bool = False):
    """all_to_all_single; returns the work handle when async_op (None when nothing moves)."""
    if size == 1:
        out.copy_(inp)
        return None
    return dist.all_to_all_single(_wire(out), _wire(inp), out_splits, in_splits, group=group,
                                  async_op=async_op)


def agree(mesh: Mesh, values: list[int], error: str | None, what: str) -> list[list[int]]:
    """Every rank's ``values`` (ints, the same count on every rank), in mesh rank order. If any
    rank passes an ``error``, every rank raises the same ValueError naming it."""
    n = len(values)
    table = torch.zeros(mesh.size, n + 1, dtype=torch.int64)  # host memory, gloo
    table[mesh.rank, 0] = error is not None
    table[mesh.rank, 1:] = torch.tensor(values, dtype=torch.int64)
    if mesh.size > 1:
        dist.all_reduce(table, group=mesh.cpu["all"])
    rows = table.tolist()
    if any(row[0] for row in rows):
        messages = [None] * mesh.size
        if mesh.size > 1:
            dist.all_gather_object(messages, error, group=mesh.cpu["all"])
        else:
            messages = [error]
        bad = [(r, m) for r, m in enumerate(messages) if m is not None]
        raise ValueError(f"{what}: " + "; ".join(f"rank {r}: {m}" for r, m in bad))
    return [row[1:] for row in rows]


def _checksum(t: Tensor) -> list[float]:
    """Three float64 sums of t's values: plain, weighted by row and by column index, so a
    different seed and a permutation of rows or columns both change it. One pass, no copy."""
    v = t.detach()
    if v.dtype == torch.float8_e4m3fn:
        v = v.view(torch.uint8)
    v = v.reshape(v.shape[0], -1) if v.dim() > 1 else v.reshape(1, -1)
    rows = v.sum(1, dtype=torch.float64)  # [R]
    cols = v.sum(0, dtype=torch.float64)  # [C]
    r = torch.arange(rows.numel(), device=v.device, dtype=torch.float64)
    c = torch.arange(cols.numel(), device=v.device, dtype=torch.float64)
    return torch.stack([rows.sum(), (rows * r).sum(), (cols * c).sum()]).tolist()


def check_replicated(mesh: Mesh, tensors: dict[str, Tensor | None], what: str) -> None:
    """Raise the same ValueError on every rank unless every rank holds the same ``tensors``."""
    names = [n for n, t in tensors.items() if t is not None]
    local = torch.tensor([_checksum(tensors[n]) for n in names], dtype=torch.float64)
    every = [torch.empty_like(local) for _ in range(mesh.size)]
    if mesh.size > 1:
        dist.all_gather(every, local, group=mesh.cpu["all"])
    else:
        every = [local]
    differ = [n for i, n in enumerate(names)
              if any(not torch.equal(e[i], every[0][i]) for e in every[1:])]
    if differ:
        raise ValueError(f"{what}: the layer's weights differ across ranks ({', '.join(differ)}); "
                         "build the full layer from the same checkpoint or seed on every rank")
