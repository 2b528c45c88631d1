"""Parallelism as a transform of a finished single-device layer (gpt-fast's apply_tp habit).

    full = MoE(cfg)                                        # the same weights on every rank
    mesh = parallel_mesh(ep=2, tp=4)                       # a DeviceMesh ("ep", "tp")
    layer = parallelize(full, "ep_allgather", mesh, dedup=True, max_tokens=64)

Every dispatcher of DISPATCHERS builds its own layer (``Dispatch.build``): "tp" and "tp_sp" on a
tp mesh, "ep_alltoall" and "ep_allgather" on any (ep >= 2, tp) mesh, crossed with tp when tp > 1
(``dedup`` chooses the spec's communication deduplication), with ``redundant`` experts (EPLB).
The full layer is not modified: the new layer shares its replicated tensors and owns copies of
its shards, so the full layer's expert weights can be freed. Building is collective: it checks
that every rank holds the same weights (a checksum) and raises the same error on every rank.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch import Tensor

from .dispatch import DISPATCHERS, Placement, balanced
from .dispatch.ep import ExpertParallelDispatch
from .dispatch.mesh import Mesh, as_mesh, parallel_mesh
from .layer import MoE

EP_MODES = ("alltoall", "allgather")


def parallelize(layer: MoE, dispatch: str, mesh=None, **options) -> MoE:
    """This rank's layer for the dispatcher named ``dispatch`` ("local" returns the layer itself).
    mesh: a shufflemoe Mesh, a DeviceMesh with dimensions "ep"/"tp", or None (every rank along
    the dispatcher's dimension). options go to the dispatcher (max_tokens, dedup, redundant,
    placement for the expert-parallel ones)."""
    return DISPATCHERS.get(dispatch).build(layer, mesh, **options)


def tensor_parallel(layer: MoE, mesh=None, *, sequence_parallel: bool = False) -> MoE:
    """The layer's tensor-parallel shard (w13 [E, 2I/tp, D], w2 [E, D, I/tp], shared likewise):
    every rank runs the same tokens and the output is all-reduced ("tp"), or, with
    sequence_parallel, every rank passes its slice of the tokens and gets its slice of the
    output back ("tp_sp": all-gather in, reduce-scatter out, the router on the slice)."""
    return parallelize(layer, "tp_sp" if sequence_parallel else "tp", mesh)


def expert_parallel(layer: MoE, mesh=None, mode: str = "alltoall", *,
                    max_tokens: int | None = None, dedup: bool = True, redundant: int = 0,
                    placement: Placement | None = None) -> MoE:
    """The layer's expert-parallel shard: E / ep whole experts per rank (cut by tp too on an
    (ep, tp) mesh), router and shared expert whole. Each ep rank routes its own tokens.

    mode "alltoall": "ep_alltoall" (eager, exact sizes, one host sync per layer); "allgather":
    "ep_allgather" (static padded shapes, no sync) with every rank padded to ``max_tokens`` (None:
    the largest T of each call, agreed on the host; graph.graphed() with several buckets needs
    max_tokens >= the largest, since ranks may replay different buckets)."""
    if mode not in EP_MODES:
        raise ValueError(f"mode must be one of {EP_MODES}, got {mode!r}")
    options = dict(dedup=dedup, redundant=redundant, placement=placement)
    if mode == "allgather":
        options["max_tokens"] = max_tokens
    elif max_tokens is not None:
        raise ValueError("max_tokens is only used by mode='allgather'")
    return parallelize(layer, f"ep_{mode}", mesh, **options)


def _ep_dispatch(layer: MoE) -> ExpertParallelDispatch:
    if not isinstance(layer.dispatch, ExpertParallelDispatch):
        raise ValueError(f"an expert-parallel layer is needed, got dispatch {layer.dispatch.name!r}")
    return layer.dispatch


def observed_load(layer: MoE) -> Tensor:
    """[E] int64 pairs routed to each logical expert by every rank's forwards so far (collective:
    summed over the mesh; each token counted once)."""
    d = _ep_dispatch(layer)
    m = d.mesh
    load = d.observed if d.observed is not None else torch.zeros(
        d.num_experts, dtype=torch.int64, device=layer.w13.device)
    total = load.clone()
    if m.size > 1:
        dist.all_reduce(total, group=m.groups["all"])
    return total if d.dedup else total // m.tp  # without dedup, a tp group routes the same tokens


def rebalance(full: MoE, layer: MoE, redundant: int | None = None) -> MoE:
    """The layer rebuilt from ``full`` with redundant experts placed for the load it observed
    (``redundant``: extra slots, default the layer's). Collective."""
    d = _ep_dispatch(layer)
    load = observed_load(layer).tolist()
    extra = d.num_physical - d.num_experts if redundant is None else redundant
    placement = balanced(load, d.num_experts, d.mesh.ep, extra)
    options = dict(dedup=d.dedup, placement=placement)
    if hasattr(d, "max_tokens"):
        options["max_tokens"] = d.max_tokens
    return parallelize(full, d.name, d.mesh, **options)


def exit_rank(code: int) -> None:
    """End a torchrun rank that used gloo without Python's interpreter shutdown: flush stdout and
    stderr, then os._exit(code). Call it last (files closed, process group destroyed).

    Why (torch 2.13, gloo on the CPU; about 1 rank exit in 5 in this repository's torchrun
    scripts): destroy_process_group() does not stop gloo's worker threads, which live as long as
    the group object, and parallel layers and the mesh cache keep it alive. A worker may release
    the last collective's work after wait() has returned; if that happens once the interpreter
    is finalizing, taking the GIL ends the thread inside a noexcept destructor: "terminate
    called without an active exception", SIGABRT, and torchrun reports the rank failed after
    its work was done."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


__all__ = ["EP_MODES", "Mesh", "Placement", "as_mesh", "balanced", "exit_rank", "expert_parallel",
           "observed_load", "parallel_mesh", "parallelize", "rebalance", "tensor_parallel"]
