"""The one generic function that turns a transformers MoE block into a shufflemoe.MoE, driven by
the BlockSpec of its model_type (specs.py).

A patched block keeps its class's identity (it becomes an instance of a subclass, so transformers'
output recorders and ``isinstance`` checks still match), its submodules and its parameters under
their HF names; only ``forward`` changes. The shufflemoe layer is built from the block's own
tensors on the first forward (``MoE.from_weights``, storage shared) and kept outside the module
tree, so ``state_dict`` keys, ``load_state_dict`` and ``save_pretrained`` are untouched. It is
rebuilt when a source tensor is replaced or modified in place (``.to()``, ``load_state_dict``,
``from_pretrained`` filling a meta model): a check of data pointers and version counters per
forward, host-side only, so CUDA-graph replays are unaffected.
"""

from __future__ import annotations

import functools
import importlib
import logging
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
# transformers' record of which outputs the running forward collects (private, stable in 5.x):
# read so that router logits are computed only when someone asked for them.
from transformers.utils.output_capturing import _active_collector

from ...config import MoEConfig
from ...experts import EXPERTS
from ...graph import GraphedMoE, graphed
from ...layer import MoE
from .sources import contiguous, get, source_for
from .specs import BlockSpec, spec_for

log = logging.getLogger("shufflemoe.integrations.transformers")

DEFAULT_EXPERTS = "shuffled"
_ACTIVATIONS = ("silu", "swish")  # SwiGLU is the only expert activation shufflemoe runs


def moe_options(spec: BlockSpec, hf_config: Any) -> dict:
    """MoEConfig fields (all but dtype) of a block built from ``hf_config``; raises ValueError
    naming the model option shufflemoe does not implement."""
    act = getattr(hf_config, "hidden_act", "silu")
    if act not in _ACTIVATIONS:
        raise ValueError(f"{spec.block}: hidden_act={act!r} is not supported (shufflemoe runs "
                         f"SwiGLU experts, hidden_act in {_ACTIVATIONS})")
    options = dict(spec.moe_config(hf_config), hidden_size=hf_config.hidden_size)
    try:  # validate now, not at the first forward (dtype is read from the weights later)
        MoEConfig(**options, dtype=torch.bfloat16)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{spec.block}: its config maps to an invalid MoEConfig: {e}") from None
    return options


@dataclass
class _State:
    """Per patched block, held in the block's __dict__: not a submodule, so no state_dict keys
    and no second copy moved by ``.to()``."""

    spec: BlockSpec
    options: dict  # MoEConfig fields but dtype
    experts: str  # expert strategy name (shufflemoe.EXPERTS)
    graph_buckets: tuple[int, ...] | None = None  # capture the layer per token bucket (CUDA)
    transform: Callable[[MoE], MoE] | None = None  # e.g. parallelize, applied after each build
    layer: MoE | None = None
    run: MoE | GraphedMoE | None = None  # the layer, or its CUDA graphs
    key: tuple = ()  # (data_ptr, version, dtype, device) of each source tensor the layer wraps


def _source_paths(spec: BlockSpec, options: dict) -> list[str]:
    """The block's tensors outside its routed experts that the layer wraps."""
    paths = [spec.router]
    if options.get("shared_intermediate_size"):
        paths += list(spec.shared)
    return paths + [p for p in (spec.shared_gate, spec.correction_bias, spec.router_bias) if p]


def _key(block: nn.Module, state: _State) -> tuple:
    source = source_for(block, state.spec)
    tensors = [get(block, p) for p in _source_paths(state.spec, state.options)]
    return (source.name,) + tuple((t.data_ptr(), t._version, t.dtype, t.device)
                                  for t in tensors + source.tensors(block, state.spec))


def _fused_rows(*parts: Tensor) -> Tensor:
    """parts [n_i, D] -> one contiguous [sum n_i, D] tensor. Fused once: each HF parameter then
    holds a view of its rows, so later calls find them adjacent and copy nothing."""
    first = parts[0].detach()
    offset, storage = first.storage_offset(), first.untyped_storage().data_ptr()
    adjacent = True
    for p in parts:
        adjacent &= (p.is_contiguous() and p.dtype == first.dtype and p.device == first.device
                     and p.untyped_storage().data_ptr() == storage and p.storage_offset() == offset)
        offset += p.numel()
    rows = sum(p.shape[0] for p in parts)
    if adjacent:
        return first.as_strided((rows, first.shape[1]), (first.shape[1], 1))
    fused = torch.cat([p.detach() for p in parts])
    start = 0
    for p in parts:
        p.data = fused[start:start + p.shape[0]]
        start += p.shape[0]
    return fused


def _canonical_weights(block: nn.Module, spec: BlockSpec, options: dict) -> dict[str, Tensor]:
    """MoE.from_weights arguments, sharing the block's storage (the routed experts as their
    source holds them: sources.py)."""
    weights = dict(router_weight=get(block, spec.router).detach(),
                   **source_for(block, spec).read(block, spec))
    if options.get("shared_intermediate_size"):
        gate, up, down = (get(block, p) for p in spec.shared)
        weights.update(shared_w13=_fused_rows(gate, up), shared_w2=contiguous(down))
    if spec.shared_gate:
        weights["shared_gate"] = get(block, spec.shared_gate).detach()
    if spec.correction_bias:  # [E], float32 in shufflemoe (a copy of E values if HF holds bf16)
        weights["router_bias"] = get(block, spec.correction_bias).detach().float()
    if spec.router_bias:
        weights["router_logits_bias"] = get(block, spec.router_bias).detach()
    return weights


def _build(block: nn.Module, state: _State) -> MoE:
    weights = _canonical_weights(block, state.spec, state.options)
    dtype = weights["router_weight"].dtype  # the model's (the experts' may be quantized)
    quantization = source_for(block, state.spec).quantization
    try:
        cfg = MoEConfig(**state.options, dtype=dtype, quantization=quantization)
    except ValueError as e:
        raise ValueError(f"{state.spec.block}: weights in {dtype} ({quantization}): {e}") from None
    layer = MoE.from_weights(cfg, experts=state.experts, **weights)
    return layer if state.transform is None else state.transform(layer)


def _built(block: nn.Module) -> _State:
    """The state of a patched block with its layer (re)built if a source tensor changed."""
    state: _State = block.__dict__["_shufflemoe"]
    if state.layer is None or _key(block, state) != state.key:
        state.layer = _build(block, state)
        state.key = _key(block, state)  # after the build, which may have re-pointed parameters
        use_graphs = state.graph_buckets and state.layer.w13.is_cuda
        state.run = graphed(state.layer, state.graph_buckets) if use_graphs else state.layer
    return state


def block_layer(block: nn.Module) -> MoE:
    """The shufflemoe.MoE of a patched block (built on first use)."""
    return _built(block).layer


def _recording_router_logits() -> bool:
    """True while transformers collects router logits (output_router_logits=True)."""
    collected = _active_collector.get()
    return collected is not None and "router_logits" in collected


TRAINING_ERROR = ("shufflemoe runs MoE blocks for inference only: in train mode with gradients on, its "
             "experts and router would get no gradients. Call model.eval() or run under "
             "torch.no_grad() / torch.inference_mode(); to train, unpatch(model) first.")


class ShuffleMoEBlock(nn.Module):
    """Mixin placed before the HF block class: ``forward`` runs shufflemoe.MoE."""

    _shufflemoe_spec: BlockSpec
    _shufflemoe_base: type
    _shufflemoe_experts: str

    def __init__(self, config, *args, **kwargs) -> None:  # built by a patch_model_type'd model
        super().__init__(config, *args, **kwargs)
        attach(self, moe_options(self._shufflemoe_spec, config), self._shufflemoe_experts)

    # Inference only: the layer runs under no_grad; torch.compile sees an opaque call.
    @torch.compiler.disable
    def forward(self, hidden_states: Tensor):  # [B, S, D] (or [T, D]) -> what the HF block returns
        if self.training and torch.is_grad_enabled():
            raise RuntimeError(TRAINING_ERROR)
        spec: BlockSpec = self._shufflemoe_spec
        state = _built(self)
        out = state.run(hidden_states)  # same shape as hidden_states
        extra = None  # Llama 4: router logits [T, E]; gpt-oss: router scores [T, k]
        if _recording_router_logits():
            x = hidden_states.reshape(-1, hidden_states.shape[-1])  # [T, D]
            if spec.returns == "out_and_logits":
                extra = F.linear(x, state.layer.router_weight)  # [T, E], as the HF router does
            else:  # the HF router's forward hook records its logits
                routed = get(self, spec.router_module)(x)
                if spec.returns == "out_and_scores":
                    extra = routed[1]
        if spec.returns == "out_and_logits":  # Llama 4: (out [T, D], logits [T, E] or None)
            return out.reshape(-1, out.shape[-1]), extra
        if spec.returns == "out_and_scores":  # gpt-oss: (out, scores [T, k] or None)
            return out, extra
        return out

    def _apply(self, fn, recurse=True):
        # .to() / .cuda() replace the parameters; drop the layer's views of the old ones now so
        # that their memory is freed (the next forward rebuilds from the new ones).
        state = self.__dict__.get("_shufflemoe")
        if state is not None:
            state.layer = state.run = None
        return super()._apply(fn, recurse)


@functools.cache
def patched_class(base: type, spec: BlockSpec, experts: str) -> type:
    """The subclass of HF block class ``base`` that runs shufflemoe (one per base and strategy)."""
    return type(f"ShuffleMoE{base.__name__}", (ShuffleMoEBlock, base), dict(
        __module__=__name__, _shufflemoe_spec=spec, _shufflemoe_base=base,
        _shufflemoe_experts=experts,
        __doc__=f"{base.__name__} whose forward runs shufflemoe.MoE (experts={experts!r})."))


def base_class(spec: BlockSpec) -> type:
    """The original HF block class of ``spec`` (also after patch_model_type replaced it)."""
    cls = getattr(importlib.import_module(spec.module), spec.block)
    return cls._shufflemoe_base if issubclass(cls, ShuffleMoEBlock) else cls


def attach(block: ShuffleMoEBlock, options: dict, experts: str,
           graph_buckets: tuple[int, ...] | None = None) -> None:
    """Give a block of a patched class its (not yet built) shufflemoe state."""
    EXPERTS.get(experts)  # raises on an unknown strategy name, listing the valid ones
    block.__dict__["_shufflemoe"] = _State(block._shufflemoe_spec, options, experts,
                                           None if graph_buckets is None else tuple(graph_buckets))


def patch(model: nn.Module, experts: str = DEFAULT_EXPERTS,
          graph_buckets: tuple[int, ...] | None = None) -> nn.Module:
    """Replace, in place, every MoE block of a loaded transformers model by shufflemoe.MoE.

    experts: the expert strategy (shufflemoe.EXPERTS). graph_buckets: on CUDA, capture each
    block's layer in CUDA graphs for these token counts (shufflemoe.graphed), for callers that do
    not capture the whole model. Raises ValueError for a model_type without a mapping, or a config
    option shufflemoe does not implement, before changing anything. Returns ``model``."""
    spec = spec_for(model.config.model_type)
    options = moe_options(spec, model.config.get_text_config(decoder=True))
    EXPERTS.get(experts)
    base = base_class(spec)
    cls = patched_class(base, spec, experts)
    patched, skipped = 0, []
    for name, module in model.named_modules():
        if type(module) is base or (isinstance(module, ShuffleMoEBlock) and isinstance(module, base)):
            module.__class__ = cls
            attach(module, options, experts, graph_buckets)
            patched += 1
        elif isinstance(module, base):
            skipped.append(f"{name} ({type(module).__name__})")
    if skipped:
        log.warning("shufflemoe: left unpatched (subclasses of %s): %s", base.__name__, ", ".join(skipped))
    if patched == 0:
        log.warning("shufflemoe: found no %s block in this %s model: nothing patched",
                    base.__name__, model.config.model_type)
    else:
        log.info("shufflemoe: patched %d %s blocks (%s, experts=%s)", patched, base.__name__,
                 model.config.model_type, experts)
    return model


def unpatch(model: nn.Module) -> nn.Module:
    """Give every patched block its HF forward back (weights stay where they are: HF-valid
    views of the canonical tensors). Returns ``model``."""
    for module in model.modules():
        if isinstance(module, ShuffleMoEBlock):
            module.__class__ = module._shufflemoe_base
            del module.__dict__["_shufflemoe"]
    return model


def patch_model_type(model_type: str, experts: str = DEFAULT_EXPERTS) -> type:
    """Make transformers build shufflemoe blocks for ``model_type`` (call before the model is
    built, e.g. before ``from_pretrained``). Returns the patched class."""
    spec = spec_for(model_type)
    EXPERTS.get(experts)
    cls = patched_class(base_class(spec), spec, experts)
    setattr(importlib.import_module(spec.module), spec.block, cls)
    log.info("shufflemoe: %s now builds %s (experts=%s)", model_type, cls.__name__, experts)
    return cls


def unpatch_model_type(model_type: str) -> None:
    spec = spec_for(model_type)
    setattr(importlib.import_module(spec.module), spec.block, base_class(spec))
