"""shufflemoe as a transformers experts implementation:
``from_pretrained(..., experts_implementation="shufflemoe")`` after ``register_experts_implementation()``.

transformers 5.17 decorates the expert modules of most MoE models (Qwen2/3-MoE, Mixtral, OLMoE,
DeepSeek-V3, ...) with ``@use_experts_implementation``; their forward is looked up by name in
``ExpertsInterface`` and called as fn(experts_module, hidden [T, D], top_k_index [T, k],
top_k_weights [T, k]) -> [T, D]. transformers keeps routing; shufflemoe runs the experts
(sort_by_expert + the expert strategy: grouped GEMMs with sizes on the device, no host sync).
Llama 4's experts are not decorated: patch() its blocks instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from transformers.integrations.moe import ExpertsInterface

from ...config import MoEConfig
from ...dispatch import LocalDispatch
from ...experts import EXPERTS
from ...ops import sort_by_expert
from ...types import ExpertWeights
from .patch import TRAINING_ERROR
from .sources import canonical_experts

NAME = "shufflemoe"
STRATEGY = "shuffled"  # the sync-free expert strategy (graph-safe, like transformers' grouped_mm)
_ACTIVATIONS = ("silu", "swish")


@dataclass
class _Cached:
    key: tuple  # (data_ptr, version, dtype, device) of gate_up_proj and down_proj, top_k, x dtype
    config: MoEConfig
    weights: ExpertWeights


def _check(module: nn.Module) -> None:
    act = getattr(module.config, "hidden_act", "silu")
    missing = [what for what, bad in (
        ("expert biases", module.has_bias),
        ("experts without a gate projection", not module.has_gate),
        ("interleaved gate/up columns", not module.is_concatenated),
        (f"hidden_act={act!r} (SwiGLU only)", act not in _ACTIVATIONS),
    ) if bad]
    if missing:
        raise NotImplementedError(f"experts_implementation={NAME!r} cannot run "
                                  f"{type(module).__name__}: it has {', '.join(missing)}")


def _key(module: nn.Module, top_k: int, dtype: torch.dtype) -> tuple:
    return tuple((t.data_ptr(), t._version, t.dtype, t.device)
                 for t in (module.gate_up_proj, module.down_proj)) + (top_k, dtype)


def _state(module: nn.Module, x: Tensor, top_k: int) -> _Cached:
    """Canonical weights and config of ``module``, cached until a weight changes."""
    cached = module.__dict__.get("_shufflemoe_experts")
    if cached is None or cached.key != _key(module, top_k, x.dtype):
        _check(module)
        w13, w2 = canonical_experts(module.gate_up_proj, module.down_proj, module.is_transposed)
        E, D, I = w2.shape
        cfg = MoEConfig(hidden_size=D, intermediate_size=I, num_experts=E, top_k=top_k,
                        dtype=w13.dtype)
        ok, why = EXPERTS.get(STRATEGY).supports(cfg, w13.device)
        if not ok:
            raise ValueError(f"experts_implementation={NAME!r}: {why}")
        cached = _Cached(_key(module, top_k, x.dtype), cfg, ExpertWeights(w13, w2))
        module.__dict__["_shufflemoe_experts"] = cached
    return cached


def shufflemoe_experts_forward(module: nn.Module, hidden_states: Tensor, top_k_index: Tensor,
                               top_k_weights: Tensor) -> Tensor:
    """hidden_states [T, D], top_k_index [T, k] (ids >= E: not routed, as transformers' expert
    parallelism marks them), top_k_weights [T, k] -> [T, D] in hidden_states' dtype."""
    if module.training and torch.is_grad_enabled():
        raise RuntimeError(TRAINING_ERROR)
    s = _state(module, hidden_states, top_k_index.shape[-1])
    if hidden_states.dtype != s.config.dtype:
        raise TypeError(f"hidden_states must have the experts' dtype {s.config.dtype}, "
                        f"got {hidden_states.dtype}")
    with torch.no_grad():
        x = hidden_states.contiguous()
        routing = sort_by_expert(top_k_index, s.config.num_experts, top_k_weights)
        out = torch.zeros_like(x)  # [T, D]
        LocalDispatch().run(EXPERTS.get(STRATEGY), x, routing, s.weights, out, s.config)
    return out


def register_experts_implementation() -> None:
    """Register "shufflemoe" in transformers' ExpertsInterface (idempotent)."""
    ExpertsInterface.register(NAME, shufflemoe_experts_forward)
