"""The one generic function that turns a transformers MoE block into a shufflemoe.MoE, driven by
the BlockSpec of its model_type (specs.py).

A patched block keeps its class's identity (it becomes an instance of a subclass, so transformers'
output recorders and ``isinstance`` checks still match), its submodules and its parameters under
their HF names; only ``forward`` changes. The shufflemoe layer is built from the block's own
tensors (``MoE.from_weights``, storage shared) by ``patch`` (or on the first forward of a block
built by a ``patch_model_type``'d class) and kept outside the module tree, so ``state_dict``
keys, ``load_state_dict`` and ``save_pretrained`` are untouched. It is rebuilt when a source
tensor is replaced or modified in place (``.to()``, ``load_state_dict``, ``from_pretrained``
filling a meta model): a check of data pointers and version counters per eager forward, on the
host. Under torch.compile that check runs when the graph is traced (``_prepare_all``), and the
block traces into the graph: nothing in it syncs or branches on data.

Three ways a patched model runs (README, "Three paths"):
- eager: on CUDA each block replays per-layer CUDA graphs for decode-sized token counts
  (``graph_buckets="auto"``; all blocks of a model share one memory pool, graph.GraphPool),
  ``graph_buckets=None`` opts out;
- ``torch.compile(model)``: no graph break; the blocks never capture graphs of their own there
  (mode="reduce-overhead" captures the whole step);
- transformers' compiled generate (``cache_implementation="static"``), the same as compile.
"""

from __future__ import annotations

import functools
import importlib
import logging
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import AutoConfig
# transformers' record of which outputs the running forward collects (private, stable in 5.x):
# read so that router logits are computed only when someone asked for them.
from transformers.utils.output_capturing import _active_collector

from ...config import MoEConfig
from ...experts import EXPERTS
from ...graph import DEFAULT_BUCKETS, GraphedMoE, GraphPool
from ...layer import MoE
from .sources import contiguous, get, source_for
from .specs import SPECS, UNSUPPORTED, BlockSpec, spec_for, spec_for_config

log = logging.getLogger("shufflemoe.integrations.transformers")

DEFAULT_EXPERTS = "shuffled"
GraphBuckets = Union[str, tuple[int, ...], None]  # "auto" | token buckets | None (no graphs)
_ACTIVATIONS = ("silu", "swish")  # SwiGLU is the only expert activation shufflemoe runs


def moe_options(spec: BlockSpec, hf_config: Any) -> dict:
    """MoEConfig fields (all but dtype) of a block built from ``hf_config``; raises ValueError
    naming the model option shufflemoe does not implement."""
    act = getattr(hf_config, "hidden_act", "silu")
    if act not in _ACTIVATIONS:
        raise ValueError(f"{spec.block}: hidden_act={act!r} is not supported (shufflemoe runs "
                         f"SwiGLU experts, hidden_act in {_ACTIVATIONS})")
    try:  # validate now, not at the first forward (dtype is read from the weights later)
        options = dict(spec.moe_config(hf_config), hidden_size=hf_config.hidden_size)
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
    graph_buckets: GraphBuckets  # per-layer CUDA graphs (see patch)
    pools: dict  # device -> GraphPool, shared by every block patched together
    experts_at: tuple[dict, str]  # (the owner's module dict, name) of the routed experts
    experts_module: nn.Module | None = None  # the one ``sources`` were resolved in
    sources: list[tuple[dict, str]] = ()  # (the owner's parameter or buffer dict, name) per tensor
    transform: Callable[[MoE], MoE] | None = None  # e.g. parallelize, applied after each build
    layer: MoE | None = None
    run: Callable[[Tensor], Tensor] | None = None  # the layer, or its CUDA graphs
    key: list = ()  # data_ptr, version, data_ptr, ... of the source tensors when it was built


def _source_paths(spec: BlockSpec, options: dict) -> list[str]:
    """The block's tensors outside its routed experts that the layer wraps."""
    paths = [spec.router]
    if options.get("shared_intermediate_size"):
        paths += list(spec.shared)
    return paths + [p for p in (spec.shared_gate, spec.correction_bias, spec.router_bias) if p]


def _source(block: nn.Module, path: str) -> tuple[dict, str]:
    """(dict, name) holding the tensor (or module) at ``path``: the owner's parameter, buffer or
    module dict, read directly per call (nn.Module.__getattr__ costs ~0.4 us; setattr replaces
    the entry)."""
    *modules, name = path.split(".")
    owner = functools.reduce(getattr, modules, block)
    for d in (owner._parameters, owner._buffers, owner._modules):
        if name in d:
            return d, name
    raise AttributeError(f"{type(block).__name__} has no parameter, buffer or module {path!r}")


def _sources(block: nn.Module, state: _State) -> list[tuple[dict, str]]:
    """state.sources: every tensor the layer wraps, the routed experts' as their source holds
    them (sources.py). Re-resolved when the experts module was replaced (a quantizer swaps its
    own in while from_pretrained loads a block built by a patch_model_type'd class)."""
    d, n = state.experts_at
    if d[n] is not state.experts_module:
        state.experts_module = d[n]
        paths = (_source_paths(state.spec, state.options)
                 + source_for(block, state.spec).paths(block, state.spec))
        state.sources = [_source(block, p) for p in paths]
    return state.sources


def _key(block: nn.Module, state: _State) -> list:
    return [v for d, n in _sources(block, state) for v in (d[n].data_ptr(), d[n]._version)]


def _stale(block: nn.Module, state: _State) -> bool:
    """Whether a source tensor was replaced or modified in place (or the experts module
    replaced) since the layer was built: per eager call, so a plain loop (~1 us) rather than a
    new key to compare."""
    d, n = state.experts_at
    if d[n] is not state.experts_module:
        return True
    key, i = state.key, 0
    for d, n in state.sources:
        t = d[n]
        if t.data_ptr() != key[i] or t._version != key[i + 1]:
            return True
        i += 2
    return False


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
    if spec.correction_bias:  # [E] (ERNIE 4.5 holds [1, E]), float32 in shufflemoe (a copy of E
        # values if HF holds bf16)
        weights["router_bias"] = get(block, spec.correction_bias).detach().float().reshape(-1)
    if spec.router_bias:
        weights["router_logits_bias"] = get(block, spec.router_bias).detach()
    return weights


def _build(block: nn.Module, state: _State) -> MoE:
    weights = _canonical_weights(block, state.spec, state.options)
    # the model's: the experts' (unless quantized), else the shared expert's or the router's (a
    # float32 router in a bf16 model: ERNIE 4.5, Hunyuan-A13B)
    dtype = next(t.dtype for t in (weights["w13"], weights.get("shared_w13"),
                                   weights["router_weight"])
                 if t is not None and t.dtype in (torch.bfloat16, torch.float16, torch.float32))
    quantization = source_for(block, state.spec).quantization
    try:
        cfg = MoEConfig(**state.options, dtype=dtype, quantization=quantization)
    except ValueError as e:
        raise ValueError(f"{state.spec.block}: weights in {dtype} ({quantization}): {e}") from None
    layer = MoE.from_weights(cfg, experts=state.experts, **weights)
    return layer if state.transform is None else state.transform(layer)


def drop_layer(block: nn.Module) -> None:
    """Drop a patched block's layer: rebuilt at its next forward (or trace)."""
    state: _State = block.__dict__["_shufflemoe"]
    state.layer = state.run = block.__dict__["_shufflemoe_layer"] = None


def _graph_buckets(state: _State, layer: MoE) -> tuple[int, ...] | None:
    """The token buckets to capture per layer: given ones on CUDA; "auto": DEFAULT_BUCKETS
    (decode sizes) on CUDA when the layer can be captured; else none."""
    if not layer.w13.is_cuda or state.graph_buckets is None:
        return None
    if state.graph_buckets != "auto":
        return state.graph_buckets
    safe = (layer.experts.graph_safe and layer.dispatch.graph_safe
            and layer.config.capacity_factor is None)
    return DEFAULT_BUCKETS if safe else None


def _built(block: nn.Module) -> _State:
    """The state of a patched block with its layer (re)built if a source tensor changed."""
    state: _State = block.__dict__["_shufflemoe"]
    if state.layer is None or _stale(block, state):
        try:
            state.layer = layer = _build(block, state)
        except Exception:
            # left out of _prepare_all, whose builds while another model compiles must not fail
            # for this one (its own eager call raises again, naming the problem)
            _BLOCKS.discard(block)
            raise
        _BLOCKS.add(block)
        state.key = _key(block, state)  # after the build, which may have re-pointed parameters
        layer._hot()  # gathered now, not while torch.compile traces the first call
        # what a compiled forward reads: a module in the block's dict (not a submodule), whose
        # guards Dynamo's dict-tag check can skip, unlike those of an object holding it
        block.__dict__["_shufflemoe_layer"] = layer
        buckets = _graph_buckets(state, layer)
        if buckets is None:
            state.run = layer.forward  # an internal module: no hooks to run
        else:
            dev = layer.w13.device
            pool = state.pools.get(dev) or state.pools.setdefault(dev, GraphPool(dev))
            state.run = GraphedMoE(layer, buckets, pool=pool, lazy=True,
                                   flat=state.spec.returns == "out_and_logits")
    return state


# Every patched block, so that a trace can prepare them all (see _prepare_all).
_BLOCKS: weakref.WeakSet = weakref.WeakSet()


@torch._dynamo.assume_constant_result
def _prepare_all() -> int:
    """Build (or rebuild) every patched block's layer. torch.compile runs this once, for real, when
    it traces a patched block (the constant result is what it records), since building reads
    data pointers and converts weights, which it cannot trace; eager calls check per block."""
    for block in list(_BLOCKS):
        if _on_device(block):
            _built(block)
    return len(_BLOCKS)


def _on_device(block: nn.Module) -> bool:
    """True when the block's weights are materialized (not on the meta device)."""
    state: _State = block.__dict__["_shufflemoe"]
    return all(not d[n].is_meta for d, n in _sources(block, state))


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
        attach(self, moe_options(self._shufflemoe_spec, config), self._shufflemoe_experts,
               self._shufflemoe_graph_buckets, _CLASS_POOLS)

    # Inference only: the layer runs under no_grad.
    def forward(self, hidden_states: Tensor):  # [B, S, D] (or [T, D]) -> what the HF block returns
        if self.training and torch.is_grad_enabled():
            raise RuntimeError(TRAINING_ERROR)
        spec: BlockSpec = self._shufflemoe_spec
        if torch.compiler.is_compiling():
            _prepare_all()
            layer: MoE = self._shufflemoe_layer
            out = layer(hidden_states)  # traced: no graphs of its own inside a compile
        else:
            state = _built(self)
            layer = state.layer
            out = state.run(hidden_states)  # same shape as hidden_states
        extra = None  # Llama 4: router logits [T, E]; gpt-oss: router scores [T, k]
        if _recording_router_logits():
            x = hidden_states.reshape(-1, hidden_states.shape[-1])  # [T, D]
            if spec.returns == "out_and_logits":
                extra = F.linear(x, layer.router_weight)  # [T, E], as the HF router does
            else:  # the HF router's forward hook records its logits
                routed = get(self, spec.router_module)(x[None] if spec.router_3d else x,
                                                       *(get(self, p) for p in spec.router_args))
                if spec.returns == "out_and_scores":
                    extra = routed[1]
        if spec.returns == "out_and_logits":  # Llama 4: (out [T, D], logits [T, E] or None)
            return (out if out.dim() == 2 else out.reshape(-1, out.shape[-1])), extra
        if spec.returns == "out_and_scores":  # gpt-oss: (out, scores [T, k] or None)
            return out, extra
        return out

    def _apply(self, fn, recurse=True):
        # .to() / .cuda() replace the parameters; drop the layer's views of the old ones now so
        # that their memory is freed (the next forward rebuilds from the new ones).
        if "_shufflemoe" in self.__dict__:
            drop_layer(self)
        return super()._apply(fn, recurse)


@functools.cache
def patched_class(base: type, spec: BlockSpec, experts: str,
                  graph_buckets: GraphBuckets = "auto") -> type:
    """The subclass of HF block class ``base`` that runs shufflemoe (one per base, strategy and
    graph buckets; graph_buckets apply to blocks the class builds, see patch_model_type)."""
    return type(f"ShuffleMoE{base.__name__}", (ShuffleMoEBlock, base), dict(
        __module__=__name__, _shufflemoe_spec=spec, _shufflemoe_base=base,
        _shufflemoe_experts=experts, _shufflemoe_graph_buckets=graph_buckets,
        __doc__=f"{base.__name__} whose forward runs shufflemoe.MoE (experts={experts!r})."))


def base_class(spec: BlockSpec) -> type:
    """The original HF block class of ``spec`` (also after patch_model_type replaced it)."""
    cls = getattr(importlib.import_module(spec.module), spec.block)
    return cls._shufflemoe_base if issubclass(cls, ShuffleMoEBlock) else cls


def _check_buckets(graph_buckets: GraphBuckets) -> GraphBuckets:
    if graph_buckets is None or graph_buckets == "auto":
        return graph_buckets
    buckets = tuple(graph_buckets)
    if not buckets or any(not isinstance(b, int) or b <= 0 for b in buckets):
        raise ValueError(f"graph_buckets must be 'auto', None or positive ints, got {graph_buckets!r}")
    return buckets


# Graph pools of blocks built by a patch_model_type'd class (patch() makes one per model).
_CLASS_POOLS: dict = {}


_STATE = ("_shufflemoe", "_shufflemoe_layer")  # a patched block's entries in its __dict__


def attach(block: ShuffleMoEBlock, options: dict, experts: str, graph_buckets: GraphBuckets,
           pools: dict) -> None:
    """Give a block of a patched class its (not yet built) shufflemoe state."""
    EXPERTS.get(experts)  # raises on an unknown strategy name, listing the valid ones
    spec = block._shufflemoe_spec
    block.__dict__["_shufflemoe"] = _State(spec, options, experts, graph_buckets, pools,
                                           _source(block, spec.experts))
    block.__dict__["_shufflemoe_layer"] = None
    _BLOCKS.add(block)


def patch(model: nn.Module, experts: str = DEFAULT_EXPERTS,
          graph_buckets: GraphBuckets = "auto") -> nn.Module:
    """Replace, in place, every MoE block of a loaded transformers model by shufflemoe.MoE.

    experts: the expert strategy (shufflemoe.EXPERTS). graph_buckets: eager calls on CUDA
    replay each block's layer from CUDA graphs, captured on first use per token bucket, all
    blocks sharing one memory pool and one static input and output per bucket (graph.GraphPool).
    "auto" (the default): buckets 1, 2, 4, ..., 256 when the layer can be captured; a tuple:
    those buckets; None: plain eager (also the choice when something else captures the whole
    step: a block called during a capture runs eagerly anyway). Never inside torch.compile.
    Raises ValueError for a model_type without a mapping, or a config option shufflemoe does not
    implement, before changing anything. Returns ``model``."""
    spec = spec_for_config(model.config)
    options = moe_options(spec, model.config.get_text_config(decoder=True))
    EXPERTS.get(experts)
    graph_buckets = _check_buckets(graph_buckets)
    base = base_class(spec)
    cls = patched_class(base, spec, experts)
    pools: dict = {}
    done, skipped = [], []  # done: (block, its class and shufflemoe state before)
    try:
        for name, module in model.named_modules():
            if type(module) is base or (isinstance(module, ShuffleMoEBlock)
                                        and isinstance(module, base)):
                done.append((module, module.__class__, {k: module.__dict__[k] for k in _STATE
                                                        if k in module.__dict__}))
                module.__class__ = cls
                attach(module, options, experts, graph_buckets, pools)
                if _on_device(module):
                    _built(module)  # now, so that a compiled first call finds it built
            elif isinstance(module, base):
                skipped.append(f"{name} ({type(module).__name__})")
    except BaseException:  # a block that cannot be built (a tensor its spec names is missing)
        for module, before, state in done:  # leaves every block as it was
            module.__class__ = before
            for k in _STATE:
                module.__dict__.pop(k, None)
            module.__dict__.update(state)
            (_BLOCKS.add if state else _BLOCKS.discard)(module)
        raise
    patched = len(done)
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
            for k in _STATE:
                del module.__dict__[k]
            _BLOCKS.discard(module)
    return model


def _spec_of_type(model_type: str) -> BlockSpec:
    """spec_for(model_type), or for a multimodal wrapper's type (qwen3_vl_moe) its text model's
    spec (spec_for_config of the type's default config)."""
    if model_type in SPECS or model_type in UNSUPPORTED:
        return spec_for(model_type)
    try:
        config = AutoConfig.for_model(model_type)
    except ValueError:  # not a transformers model_type
        return spec_for(model_type)
    return spec_for_config(config)


def patch_model_type(model_type: str, experts: str = DEFAULT_EXPERTS,
                     graph_buckets: GraphBuckets = "auto") -> type:
    """Make transformers build shufflemoe blocks for ``model_type`` (call before the model is
    built, e.g. before ``from_pretrained``; graph_buckets as in patch). Returns the patched
    class."""
    spec = _spec_of_type(model_type)
    EXPERTS.get(experts)
    cls = patched_class(base_class(spec), spec, experts, _check_buckets(graph_buckets))
    setattr(importlib.import_module(spec.module), spec.block, cls)
    log.info("shufflemoe: %s now builds %s (experts=%s)", model_type, cls.__name__, experts)
    return cls


def unpatch_model_type(model_type: str) -> None:
    spec = _spec_of_type(model_type)
    setattr(importlib.import_module(spec.module), spec.block, base_class(spec))
