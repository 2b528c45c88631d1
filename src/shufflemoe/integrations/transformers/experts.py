"""shufflemoe as a transformers experts implementation:
``from_pretrained(..., experts_implementation="shufflemoe")`` after ``register_experts_implementation()``.

transformers 5.17 decorates the expert modules of most MoE models (Qwen2/3-MoE, Mixtral, OLMoE,
DeepSeek-V3, ...) with ``@use_experts_implementation``; their forward is looked up by name in
``ExpertsInterface`` and called as fn(experts_module, hidden [T, D], top_k_index [T, k],
top_k_weights [T, k]) -> [T, D]. transformers keeps routing; shufflemoe runs the experts
(sort_by_expert + the expert strategy: grouped GEMMs with sizes on the device, no host sync).
Llama 4's experts are not decorated: patch() its blocks instead.

Launched from Python the experts cost the host more than the GPU at decode sizes (a Triton
launch binds its ~30 arguments in 25-47 us on an H100 host), so a call replays a launch plan
(layer.run_planned): recorded at a T's first call, later calls launch the same compiled kernels
with the new pointers, as the patched layer's do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Callable

import torch
from torch import Tensor, nn
from transformers.integrations.moe import ExpertsInterface

from ...config import MoEConfig, traced_config
from ...dispatch import LocalDispatch
from ...experts import EXPERTS
from ...layer import run_planned
from ...ops import backend_for
from ...ops.silu_mul.reference import glu
from ...types import ExpertWeights
from .patch import TRAINING_ERROR
from .sources import canonical_experts

NAME = "shufflemoe"
STRATEGY = "shuffled"  # the sync-free expert strategy (graph-safe, like transformers' grouped_mm)
_RUN = LocalDispatch().run  # looked up once, not per call


@dataclass
class _Cached:
    key: tuple  # (data_ptr, version, dtype, device) of gate_up_proj and down_proj, top_k, x dtype
    config: MoEConfig
    weights: ExpertWeights
    plans: dict = field(default_factory=dict)  # run_planned's, for these weights


_GATE_ATTRS = ("limit", "swiglu_limit", "alpha", "swiglu_alpha")  # what custom gates read


def module_glu(module: nn.Module) -> tuple[str, float, float | None] | None:
    """The GLU ``module`` applies to its gate_up output, as MoEConfig's (activation,
    swiglu_alpha, swiglu_limit); None when shufflemoe runs none like it. transformers' experts
    backends call module._apply_gate (by default act_fn(gate) * up, with act_fn from any of
    hidden_act, hidden_activation, mlp_hidden_act; GLM-5-Next, HY-V4 and DeepSeek-V4 clamp
    gate and up first; MiniMax-M3-VL clamps after the activation; Gemma 4's act_fn is
    GELU-tanh), so the one sure way to know is to run it (_glu_of), on the constants it reads:
    its class's gate function, its activation (an activation module's class: they hold no
    state) and its limits and alpha."""
    act = getattr(module, "act_fn", None)
    numbers = [tuple((n, float(getattr(owner, n))) for n in _GATE_ATTRS
                     if isinstance(getattr(owner, n, None), (int, float)))
               for owner in (module, module.config)]
    return _glu_of(type(module)._apply_gate, type(act) if isinstance(act, nn.Module) else act,
                   *numbers)


@torch._dynamo.assume_constant_result
def _glu_of(gate_fn: Callable, act: Callable | None, attrs: tuple, config_attrs: tuple
            ) -> tuple[str, float, float | None] | None:
    """module_glu's verdict: gate_fn run on a stand-in module (act_fn, the attrs, a config of
    config_attrs) over a float64 probe reaching past every limit, against each GLU shufflemoe
    runs with the module's own limit (its limit, swiglu_limit or its config's) and alpha. A
    constant to torch.compile, computed once when the graph is traced (every argument is one:
    a module is not, to torch 2.11)."""
    own, config = dict(attrs), dict(config_attrs)
    limits = [None] + sorted({v for v in (own.get("limit"), own.get("swiglu_limit"),
                                          config.get("swiglu_limit")) if v is not None and v > 0})
    alpha = next((v for v in (own.get("alpha"), own.get("swiglu_alpha"),
                              config.get("swiglu_alpha")) if v is not None), 1.702)
    reach = 3.0 * max([8.0] + limits[1:])
    side = torch.linspace(-reach, reach, 97, dtype=torch.float64)
    gate, up = side.repeat_interleave(side.numel()), side.repeat(side.numel())
    try:
        stand_in = SimpleNamespace(act_fn=act() if isinstance(act, type) else act,
                                   config=SimpleNamespace(**config), **own)
        with torch.no_grad():
            got = gate_fn(stand_in, torch.stack([gate, up], dim=1)).reshape(-1)
    except Exception:  # a gate function that cannot take the probe is not one of ours
        return None
    for name in ("silu", "swiglu_oai"):
        for limit in limits:
            want = glu(gate, up, name, alpha, limit)
            if got.shape == want.shape and torch.allclose(got.to(want.dtype), want,
                                                          rtol=1e-6, atol=1e-9):
                return name, alpha, limit
    return None


def _check(module: nn.Module) -> tuple[str, float, float | None]:
    """module's GLU (module_glu); raises NotImplementedError naming all that shufflemoe's
    experts do not run."""
    act = module_glu(module)
    missing = [what for what, bad in (
        ("expert biases", module.has_bias),
        ("experts without a gate projection", not module.has_gate),
        ("interleaved gate/up columns", not module.is_concatenated),
    ) if bad]
    if act is None:
        missing.append(f"a gate function ({type(module).__name__}._apply_gate with its act_fn "
                       f"{type(getattr(module, 'act_fn', None)).__name__}) that is none of "
                       "shufflemoe's GLUs (silu(gate) * up or gpt-oss's, with or without a clamp "
                       "before them)")
    if missing:
        raise NotImplementedError(f"experts_implementation={NAME!r} cannot run "
                                  f"{type(module).__name__}: it has {', '.join(missing)}")
    return act


def _key(module: nn.Module, top_k: int, dtype: torch.dtype) -> tuple:
    return tuple((t.data_ptr(), t._version, t.dtype, t.device)
                 for t in (module.gate_up_proj, module.down_proj)) + (top_k, dtype)


def _config(module: nn.Module, w13: Tensor, w2: Tensor, top_k: int) -> MoEConfig:
    activation, alpha, limit = _check(module)
    E, D, I = w2.shape
    cfg = traced_config(hidden_size=D, intermediate_size=I, num_experts=E, top_k=top_k,
                        dtype=w13.dtype, activation=activation, swiglu_alpha=alpha,
                        swiglu_limit=limit)
    ok, why = EXPERTS.get(STRATEGY).supports(cfg, w13.device)
    if not ok:
        raise ValueError(f"experts_implementation={NAME!r}: {why}")
    return cfg


def _state(module: nn.Module, x: Tensor, top_k: int) -> _Cached:
    """Canonical weights and config of ``module``, cached until a weight changes. Under
    torch.compile they are derived in the graph instead (data pointers cannot be traced; the
    checks fold to constants and the canonical layout is a view of the parameters)."""
    if torch.compiler.is_compiling():
        p13, p2 = module.gate_up_proj, module.down_proj
        if module.is_transposed:  # HF [E, D, 2I] / [E, I, D]: a copy per step in the graph
            w13, w2 = p13.transpose(1, 2).contiguous(), p2.transpose(1, 2).contiguous()
        else:
            w13, w2 = p13.contiguous(), p2.contiguous()
        # every field passed (see traced_config)
        weights = ExpertWeights(w13, w2, w13_scale=None, w2_scale=None, w13_bias=None,
                                w2_bias=None, quantization="none")
        return _Cached((), _config(module, w13, w2, top_k), weights)
    cached = module.__dict__.get("_shufflemoe_experts")
    if cached is None or cached.key != _key(module, top_k, x.dtype):
        w13, w2 = canonical_experts(module.gate_up_proj, module.down_proj, module.is_transposed)
        cached = _Cached(_key(module, top_k, x.dtype), _config(module, w13, w2, top_k),
                         ExpertWeights(w13, w2))
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
        out = torch.zeros_like(x)  # [T, D]

        def region() -> None:
            routing = backend_for(x).sort_by_expert(top_k_index, s.config.num_experts,
                                                    top_k_weights, None)
            _RUN(EXPERTS.get(STRATEGY), x, routing, s.weights, out, s.config)

        if (torch.compiler.is_compiling() or not top_k_index.is_contiguous()
                or not top_k_weights.is_contiguous()):  # a plan keeps the strides it saw
            region()
        else:
            # modules of one config share a recording (with the key and every input's layout)
            run_planned(s.plans, (NAME, top_k_index.dtype, top_k_weights.dtype),
                        (NAME, STRATEGY, s.config), region,
                        (x, top_k_index, top_k_weights, out), (s.weights.w13, s.weights.w2))
    return out


def register_experts_implementation() -> None:
    """Register "shufflemoe" in transformers' ExpertsInterface (idempotent)."""
    ExpertsInterface.register(NAME, shufflemoe_experts_forward)
