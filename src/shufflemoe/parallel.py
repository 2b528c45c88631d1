"""Parallelism as a transform of a finished single-device layer (gpt-fast's apply_tp habit).

    full = MoE(cfg, experts="shuffled")                 # the same weights on every rank
    tp_layer = tensor_parallel(full, group)             # I / tp of every expert, same tokens
    ep_layer = expert_parallel(full, group, "allgather")  # E / ep whole experts, own tokens

The given layer is not modified; the new layer shares its replicated tensors (router, and under
expert parallelism the shared expert) and owns copies of its shards, so the full layer's expert
weights can be freed.

tensor_parallel: rank r keeps rows [r * Il, (r + 1) * Il) of the gate half and of the up half of
w13 (Il = I / tp; the halves are cut separately so SwiGLU pairs gate and up of the same columns),
the same columns of w2, and likewise for the shared expert (its sigmoid gate, [1, D], whole). Under
fp8_rowwise, w13_scale is cut with w13's rows; w2_scale (one scale per output row of w2) is kept
whole: a column slice of a row dequantizes with the row's scale, so the shard holds exactly the
full layer's values. One numerical difference remains: the SwiGLU output is quantized per row
over the rank's I / tp columns instead of all I (as vLLM does), so each rank rounds with its own
scale; measured on the 2-rank fp8 case of tests/dispatch: max error 0.045 rms, relative L2 0.013
against the full layer's float64 reference (single device: 0.015, 0.0042; tolerance 0.25, 0.05).
The new layer's config is the shard's (intermediate sizes / tp, as
presets.preset(tp=...) gives), with num_experts = E.

expert_parallel: rank r keeps experts [r * El, (r + 1) * El) (El = E / ep) and everything else
whole; its config stays the model's (num_experts = E: the router picks among all E experts) while
w13/w2 hold El experts (MoE.from_weights(num_local_experts=El)).
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist
from torch import Tensor

from .dispatch import AllGatherDispatch, AllToAllDispatch, TensorParallelDispatch
from .layer import MoE

_WEIGHTS = ("router_weight", "router_bias", "router_logits_bias", "w13", "w2", "w13_scale",
            "w2_scale", "w13_bias", "w2_bias", "shared_w13", "shared_w2", "shared_gate")
_EXPERT_SHARDED = ("w13", "w2", "w13_scale", "w2_scale", "w13_bias", "w2_bias")
# Formats whose scales are one per output row: a shard of rows (w13) or of columns (w2, whose
# scale is kept whole) holds exactly the full layer's values. Block and MXFP4 scales would have
# to be cut on their block boundaries.
_TP_FORMATS = ("none", "fp8_rowwise", "fp8_w8a16")
EP_MODES = ("alltoall", "allgather")


def _group_size_rank(layer: MoE, group: dist.ProcessGroup | None, what: str) -> tuple[int, int]:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(f"{what} needs torch.distributed to be initialized "
                           "(torch.distributed.init_process_group)")
    if layer.dispatch.name != "local":
        raise ValueError(f"{what} transforms a single-device layer (dispatch 'local'), got one "
                         f"with dispatch {layer.dispatch.name!r}")
    return dist.get_world_size(group), dist.get_rank(group)


def _own(t: Tensor) -> Tensor:
    """A contiguous copy that does not keep the full tensor's storage alive."""
    return t.clone(memory_format=torch.contiguous_format)


def _gate_up_rows(t: Tensor, n: int, rank: int, dim: int) -> Tensor:
    """Rows [rank * n, (rank + 1) * n) of the gate half and of the up half of t along dim (whose
    length is 2 * I: gate rows then up rows), as one new tensor."""
    gate, up = t.chunk(2, dim=dim)
    return torch.cat([gate.narrow(dim, rank * n, n), up.narrow(dim, rank * n, n)], dim=dim)


def tensor_parallel(layer: MoE, group: dist.ProcessGroup | None = None) -> MoE:
    """The layer's tensor-parallel shard for this rank of ``group`` (dispatch "tp"): w13 [E, 2I/tp,
    D], w2 [E, D, I/tp], shared_w13 [2Is/tp, D], shared_w2 [D, Is/tp]; every rank runs the same
    tokens and the outputs are all-reduced."""
    tp, rank = _group_size_rank(layer, group, "tensor_parallel")
    cfg = layer.config
    I, Is = cfg.intermediate_size, cfg.shared_intermediate_size
    if I % tp or Is % tp:
        raise ValueError(f"the group size ({tp}) must divide intermediate_size ({I}) and "
                         f"shared_intermediate_size ({Is})")
    if cfg.quantization not in _TP_FORMATS:
        raise ValueError(f"tensor_parallel shards quantization in {_TP_FORMATS}, got "
                         f"{cfg.quantization!r} (use expert_parallel, which keeps experts whole)")
    Il, Isl = I // tp, Is // tp

    def columns(t: Tensor, n: int) -> Tensor:  # [..., I] -> [..., rank's n columns]
        return _own(t.narrow(-1, rank * n, n))

    shard = dict(router_weight=layer.router_weight, router_bias=layer.router_bias,
                 w13=_gate_up_rows(layer.w13, Il, rank, dim=1), w2=columns(layer.w2, Il),
                 router_logits_bias=layer.router_logits_bias, shared_gate=layer.shared_gate)
    if layer.w13_bias is not None:  # w2's bias is added once: by rank 0, after the all-reduce's sum
        shard.update(w13_bias=_gate_up_rows(layer.w13_bias, Il, rank, dim=1),
                     w2_bias=_own(layer.w2_bias) if rank == 0 else torch.zeros_like(layer.w2_bias))
    if layer.w13_scale is not None:
        shard.update(w13_scale=_gate_up_rows(layer.w13_scale, Il, rank, dim=1),
                     w2_scale=layer.w2_scale)
    if layer.shared_w13 is not None:
        shard.update(shared_w13=_gate_up_rows(layer.shared_w13, Isl, rank, dim=0),
                     shared_w2=columns(layer.shared_w2, Isl))
    local = cfg.replace(intermediate_size=Il, shared_intermediate_size=Isl)
    return MoE.from_weights(local, experts=layer.experts.name,
                            dispatch=TensorParallelDispatch(group), **shard)


def expert_parallel(
    layer: MoE,
    group: dist.ProcessGroup | None = None,
    mode: str = "alltoall",
    *,
    max_tokens: int | None = None,
) -> MoE:
    """The layer's expert-parallel shard for this rank of ``group``: w13 [E/ep, 2I, D], w2 [E/ep,
    D, I] (experts [rank * E/ep, (rank + 1) * E/ep)), router and shared expert whole. Each rank
    routes its own tokens over all E experts.

    mode "alltoall": dispatch "ep_alltoall" (eager, exact sizes, one host sync per layer);
    "allgather": dispatch "ep_allgather" (static padded shapes, no sync) with every rank padded to
    ``max_tokens`` tokens (None: each call's T, which must then be equal on every rank). Under
    graph.graphed(), give max_tokens >= the largest bucket unless every rank always runs the
    same bucket: the captured collectives must have the same sizes on all ranks."""
    if mode not in EP_MODES:
        raise ValueError(f"mode must be one of {EP_MODES}, got {mode!r}")
    ep, rank = _group_size_rank(layer, group, "expert_parallel")
    cfg = layer.config
    E = cfg.num_experts
    if E % ep:
        raise ValueError(f"the group size ({ep}) must divide num_experts ({E})")
    if mode == "alltoall":
        if max_tokens is not None:
            raise ValueError("max_tokens is only used by mode='allgather'")
        dispatch = AllToAllDispatch(E, group)
    else:
        dispatch = AllGatherDispatch(E, group, max_tokens)
    El = E // ep
    weights = {name: getattr(layer, name) for name in _WEIGHTS}
    for name in _EXPERT_SHARDED:
        if weights[name] is not None:
            weights[name] = _own(weights[name][rank * El : (rank + 1) * El])
    return MoE.from_weights(cfg, **{n: None if t is None else t.data for n, t in weights.items()},
                            num_local_experts=El, experts=layer.experts.name, dispatch=dispatch)


def _identity(layer: MoE, group: dist.ProcessGroup | None = None) -> MoE:
    return layer


# Dispatcher name -> the transform that builds a layer using it (the combination test walks
# DISPATCHERS and fails on a dispatcher missing here).
TRANSFORMS = {
    "local": _identity,
    "tp": tensor_parallel,
    "ep_alltoall": functools.partial(expert_parallel, mode="alltoall"),
    "ep_allgather": functools.partial(expert_parallel, mode="allgather"),
}


def parallelize(layer: MoE, dispatch: str, group: dist.ProcessGroup | None = None,
                **options) -> MoE:
    """The layer transformed for the dispatcher named ``dispatch`` (a DISPATCHERS name; "local"
    returns the layer itself). options go to the transform (max_tokens for "ep_allgather")."""
    if dispatch not in TRANSFORMS:
        raise ValueError(f"no parallel transform for dispatcher {dispatch!r}; "
                         f"choose one of {sorted(TRANSFORMS)}")
    return TRANSFORMS[dispatch](layer, group, **options)
