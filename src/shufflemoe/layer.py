"""The MoE layer: router + shared expert + dispatcher x expert strategy.

    x [T, D]
     |- router:  logits = x @ Wr^T [T, E] -> Routing (pairs sorted by expert, on the device)
     |- shared expert (own CUDA stream for small T): out = SwiGLU(x) [T, D]
     `- dispatch.run(experts): out += routed experts' output (scatter-add into out)
    (prefill with top-1 routing: the routed experts write out, the shared expert adds into it;
    decode at T <= Switch.shared_max_tokens: the shared expert in the routed experts' two fused
    launches, _merged)

No step copies a size to the host with the ``shuffled`` strategy, so the layer can be captured in
one CUDA graph (see graph.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import batch_invariant
from ._checks import check_tensor
from .config import MoEConfig
from .dispatch import Dispatch, LocalDispatch
from .experts import EXPERTS, Experts
from .experts.base import pair_weights
from .ops import _launch, backend_for, moe_decode
from .ops._common import device_name
from .ops._impl import _default_impl, _is_compiling
from .ops.grouped_gemm import configs as gemm_configs
from .ops.quantize.formats import FORMATS, weight_format
from .ops.router import uses_kernel as router_uses_kernel
from .routing import ROUTERS, route, router_logits
from .types import ExpertWeights, Routing

_WEIGHT_NAMES = ("router_weight", "router_bias", "router_logits_bias", "w13", "w2", "w13_scale",
                 "w2_scale", "w13_bias", "w2_bias", "shared_w13", "shared_w2", "shared_gate")
# Read by the kernels, which need them contiguous (batch_invariant: every weight). Wrapped, never
# copied: a caller holding a view (transposed or sliced) passes .contiguous(), knowing it copies.
_EXPERT_TENSORS = ("w13", "w2", "w13_scale", "w2_scale", "w13_bias", "w2_bias")


def _frozen(t: Tensor | None) -> nn.Parameter | None:
    return None if t is None else nn.Parameter(t, requires_grad=False)


@dataclass(frozen=True)
class _Paths:
    """What a layer's forward reads that is not a tensor: its config, strategies and the choices
    made from them. Layers that make the same ones share one object (_shared), which a compiled
    forward reads from _PATHS by the number the layer holds (``_paths_key``): torch.compile then
    guards it once, at one place, and each layer's module holds only tensors and numbers, whose
    guards its recursive dict-tag check skips while the module's dicts are unchanged."""

    config: MoEConfig
    experts: Experts
    dispatch: Dispatch
    route: Callable[[Tensor, MoEConfig, Tensor | None], Routing]
    shared_fusable: bool  # a shared expert the fused decode kernels can run (_fuses_shared)
    shared_merges: bool  # ... in the routed experts' launches (_merges_shared)


_SHARED: dict = {}
_PATHS: dict[int, _Paths] = {}  # _paths_key -> a shared _Paths (local dispatch only)
_PATHS_KEYS: dict[int, int] = {}  # id of a shared _Paths (_SHARED keeps it) -> its _paths_key


def _shared(value):
    """The one object equal to ``value`` (a frozen MoEConfig, _Paths) and written the same (1.0
    and 1, or True and 1, are equal but not the same to every reader): see _Paths. Not while
    torch.compile traces (a layer first called compiled): torch 2.11's Dynamo fails hashing a
    dataclass it made in the trace."""
    if torch.compiler.is_compiling():
        return value
    return _SHARED.setdefault((value, repr(value)), value)


def _paths_key(paths: _Paths) -> int:
    """The number under which _PATHS holds ``paths`` (a shared one), registered at its first
    use: layers that share it share the number."""
    key = _PATHS_KEYS.setdefault(id(paths), len(_PATHS))
    _PATHS.setdefault(key, paths)
    return key


@dataclass(frozen=True)
class _Hot:
    """What forward reads, gathered once: a parameter read through nn.Module.__getattr__ costs
    ~0.4 us, a registry lookup more. Dropped on any attribute change and on .to()."""

    weights: ExpertWeights
    router_weight: Tensor
    router_bias: Tensor | None
    router_logits_bias: Tensor | None
    shared_w13: Tensor | None
    shared_w2: Tensor | None
    shared_gate: Tensor | None
    paths: _Paths
    # [T] = (counts [1] = T, token ids [T], positions [T] = 0..T-1) int32 for T up to
    # SHARED_FUSED_MAX_TOKENS: the fused shared expert's routing, made once (no kernel makes
    # them in a call, a compiled graph or a capture); () when not fusable. Separate tensors,
    # not views of one: compiled, aliased graph inputs that a kernel may write (Inductor's
    # analysis counts the decode kernels' index inputs as written) get a synthetic base, which
    # CUDA-graph trees refuse to capture
    one_expert: tuple[tuple[Tensor, Tensor, Tensor], ...]
    # (region, T, stream, impl, batch-invariant tiles) -> _launch.Plan | None, or _ONCE: a T
    # past PLAN_MAX_TOKENS seen once (recorded at its next call)
    plans: dict = field(default_factory=dict)


# Launch plans (run_planned): recorded at a T's first call up to PLAN_MAX_TOKENS (decode, the
# graph buckets' sizes); past it (prefill) at its second call, for at most PLAN_MAX_LARGE (region,
# T) a layer (_seen_once), kept only while the region's allocations fit PLAN_MAX_WORKSPACE (the
# workspace is held for good: Qwen3-30B-A3B at T = 2048 needs ~200 MiB). Without a plan an eager
# call past 256 tokens costs the host ~1.1-1.3 ms (Triton's JIT launches, allocations, Python;
# H100 host, benchmarks/profile_host.py --tokens 2048), more than the GPU's time at TP8 widths.
PLAN_MAX_TOKENS = 256
PLAN_MAX_LARGE = 16
PLAN_MAX_WORKSPACE = 256 << 20
# A shared expert (not split) runs through the fused decode kernels up to this T, in every mode
# (eager, CUDA graph, compiled: the same kernels, the same bits): one m-tile of rows (above it each
# m-tile would stream the shared weights again). Its kernels use their own split-K workspace,
# so that on a graph's side stream they never share arrival words with the routed experts'.
SHARED_FUSED_MAX_TOKENS = 16
SHARED_WORKSPACE = 1
# Attributes _Hot does not depend on: setting them keeps it (torch.compile(layer) sets the first
# two; a compiled call then reads the gathered _Hot, its tensors graph inputs, not made anew)
_NOT_GATHERED = frozenset({"training", "_is_torch_compile", "_side_stream"})
_LOCAL = LocalDispatch()  # stateless: one for every layer (see _Paths)
# Recorded regions, shared by callers of the same signature and layouts (see run_planned).
_TEMPLATES: dict[tuple, _launch.Template | None] = {}


def _layout(t: Tensor | None) -> tuple | None:
    return None if t is None else (t.dtype, t.device, tuple(t.shape), t.stride(),
                                   t.data_ptr() % 16 == 0)


class MoE(nn.Module):
    """One Mixture-of-Experts layer for inference, weights in the canonical layout:

    router_weight [E, D] (in config.dtype, or router_logits_dtype where set), router_bias [E]
    float32 (group_limited correction bias),
    router_logits_bias [E] (gpt-oss), w13 [E, 2I, D] (gate rows then up rows), w2 [E, D, I],
    w13_bias [E, 2I] and w2_bias [E, D] (expert_bias), shared_w13 [2Is, D], shared_w2 [D, Is],
    shared_gate [1, D]. Quantized, w13/w2 and w13_scale/w2_scale are stored as the format says
    (ops/quantize/formats.py; fp8_rowwise: float8_e4m3fn with w13_scale [E, 2I] and w2_scale
    [E, D]). Forward takes [T, D] or [B, S, D] in config.dtype and returns the same shape.
    """

    def __init__(
        self,
        config: MoEConfig,
        experts: str = "shuffled",
        dispatch: Dispatch | None = None,
        *,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        cfg = self.config = _shared(config)  # layers of one config share it (see _Paths)
        E, D, I, Is = (cfg.num_experts, cfg.hidden_size, cfg.intermediate_size,
                       cfg.shared_intermediate_size)

        def param(*shape: int) -> nn.Parameter:  # random N(0, 1/fan_in): outputs of order one
            t = torch.empty(*shape, device=device, dtype=cfg.dtype)
            if t.device.type != "meta":  # normal_ on meta imports torch._dynamo: ~2 s
                t.normal_(0.0, 1.0 / math.sqrt(shape[-1]))
            return _frozen(t)

        self.router_weight = param(E, D)
        self.router_bias = _frozen(torch.zeros(E, device=device)) if cfg.correction_bias else None
        self.router_logits_bias = param(E) if cfg.router_logits_bias else None
        self.w13 = param(E, 2 * I, D)
        self.w2 = param(E, D, I)
        self.w13_scale = self.w2_scale = None
        self.w13_bias = param(E, 2 * I) if cfg.expert_bias else None
        self.w2_bias = param(E, D) if cfg.expert_bias else None
        self.shared_w13 = param(2 * Is, D) if Is else None
        self.shared_w2 = param(D, Is) if Is else None
        self.shared_gate = param(1, D) if cfg.shared_expert_gate else None
        if cfg.quantized:
            self._quantize_experts()
        self.shared_split = 0  # > 0: shared weights in two parts (see shared_expert)
        self.dispatch = dispatch or _LOCAL
        self.set_experts(experts)
        self._side_stream: torch.cuda.Stream | None = None

    @classmethod
    def from_weights(
        cls,
        config: MoEConfig,
        *,
        router_weight: Tensor,
        w13: Tensor,
        w2: Tensor,
        router_bias: Tensor | None = None,
        router_logits_bias: Tensor | None = None,
        w13_scale: Tensor | None = None,
        w2_scale: Tensor | None = None,
        w13_bias: Tensor | None = None,
        w2_bias: Tensor | None = None,
        shared_w13: Tensor | None = None,
        shared_w2: Tensor | None = None,
        shared_gate: Tensor | None = None,
        num_local_experts: int | None = None,
        experts: str = "shuffled",
        dispatch: Dispatch | None = None,
    ) -> MoE:
        """Wrap existing tensors (not copied) in the canonical layout. Quantized, w13/w2 may be
        given in config.dtype (quantized here) or as the format stores them, with their scales
        (ops/quantize/formats.py: e.g. fp8_block's float8 weights with 128 x 128 block scales,
        mxfp4's uint8 [E, N, K/2] with e8m0 scales). Biases may be float32 or config.dtype.
        num_local_experts: w13/w2 (and scales, biases) hold this many experts, an
        expert-parallel shard, while the router still picks among config.num_experts."""
        layer = cls(config, experts, dispatch, device="meta")
        given = dict(router_weight=router_weight, router_bias=router_bias,
                     router_logits_bias=router_logits_bias, w13=w13, w2=w2, w13_scale=w13_scale,
                     w2_scale=w2_scale, w13_bias=w13_bias, w2_bias=w2_bias, shared_w13=shared_w13,
                     shared_w2=shared_w2, shared_gate=shared_gate)
        fmt = weight_format(config.quantization)
        stored = fmt.quantized and w13.dtype == fmt.weight_dtype
        if not stored and w13.dtype in {f.weight_dtype for f in FORMATS.values()} - {None}:
            raise ValueError(f"w13 is {w13.dtype}: quantized weights need the MoEConfig."
                             f"quantization that stores them (one of {list(FORMATS)[1:]})")
        for name in _WEIGHT_NAMES:
            want, t = getattr(layer, name), given[name]
            if name.endswith("_scale") and not stored:
                if t is not None:
                    raise ValueError(f"{name} is only used with w13/w2 already stored in "
                                     f"quantization={config.quantization!r}'s format")
                continue
            if (want is None) != (t is None):
                raise ValueError(f"{name} is {'required' if t is None else 'not used'} by this MoEConfig")
            if t is None:
                continue
            dtypes, shape = (want.dtype,), list(want.shape)
            if name in ("w13", "w2") and not stored:  # to be quantized here
                D, I = config.hidden_size, config.intermediate_size
                dtypes, shape = (config.dtype,), [config.num_experts] + (
                    [2 * I, D] if name == "w13" else [D, I])
            elif name in ("w13_bias", "w2_bias"):
                dtypes = (config.dtype, torch.float32)
            elif name == "router_weight" and config.router_logits_dtype is not None:
                dtypes = (config.dtype, config.router_logits_dtype)  # (ERNIE 4.5 keeps it fp32)
            if num_local_experts is not None and name in _EXPERT_TENSORS:
                shape[0] = num_local_experts
            check_tensor(name, t, shape=shape, dtypes=dtypes, device=w13.device)
            wrapped = stored or not fmt.quantized or name not in ("w13", "w2")
            if wrapped and not t.is_contiguous() and (name in _EXPERT_TENSORS
                                                      or config.batch_invariant):
                raise ValueError(f"{name} must be contiguous (got strides {t.stride()} for shape "
                                 f"{list(t.shape)}): MoE.from_weights wraps it without copying, "
                                 f"pass {name}.contiguous() to copy it once")
            setattr(layer, name, _frozen(t))
        if fmt.quantized and not stored:
            layer._quantize_experts()
        return layer

    def _quantize_experts(self) -> None:
        """Store w13/w2 in the config's format (once, at load). w13's fp8 blocks restart at its up
        half (scale_split = I), as in checkpoints that quantized gate and up separately. On the
        meta device (from_weights' template) only the shapes are made."""
        fmt = weight_format(self.config.quantization)
        for name, split in (("w13", self.config.intermediate_size), ("w2", None)):
            w = getattr(self, name).data
            if w.device.type == "meta":
                N, K = w.shape[1:]
                q = torch.empty(w.shape[0], *fmt.weight_shape(N, K), dtype=fmt.weight_dtype,
                                device="meta")
                s = torch.empty(w.shape[0], *fmt.scale_shape(N, K, split),
                                dtype=fmt.scale_dtype, device="meta")
            else:
                q, s = fmt.quantize(w, split)
            setattr(self, name, _frozen(q))
            setattr(self, f"{name}_scale", _frozen(s))

    def set_experts(self, name: str) -> None:
        """Choose the expert strategy by name (see experts.EXPERTS)."""
        strategy: Experts = EXPERTS.get(name)
        device = self.w13.device
        for part, (ok, why) in (("experts", strategy.supports(self.config, device)),
                                ("dispatch", self.dispatch.supports(self.config, strategy, device))):
            if not ok:
                raise ValueError(f"{part} {name!r} does not support this layer: {why}")
        ok, why = batch_invariant.supports(self.config, strategy, self.dispatch)
        if not ok:
            raise ValueError(why)
        if not self.config.deterministic and name != "shuffled":
            raise ValueError(f"MoEConfig.deterministic=False only changes experts='shuffled' "
                             f"(the atomic combine), got {name!r}")
        self.experts = strategy

    def __setattr__(self, name: str, value) -> None:
        super().__setattr__(name, value)
        if name not in _NOT_GATHERED:
            self.__dict__["_hot_parts"] = self.__dict__["_paths_key"] = None

    def __getstate__(self) -> dict:
        """A copy (copy.deepcopy, pickle) gathers anew: _Hot holds this layer's launch plans
        (replays of its own tensors' addresses), _paths_key a number of this process's _PATHS,
        _side_stream a CUDA stream."""
        state = dict(self.__dict__)
        state["_hot_parts"] = state["_paths_key"] = state["_side_stream"] = None
        return state

    def _apply(self, fn, recurse=True):
        # .to() / .cuda(): new devices and dtypes
        self.__dict__["_hot_parts"] = self.__dict__["_paths_key"] = None
        return super()._apply(fn, recurse)

    def _hot(self) -> _Hot:
        if _is_compiling() and self._paths_key is not None:
            return self._traced_hot()
        hot = self._hot_parts  # plain attribute lookup
        if hot is None:
            cfg = self.config
            fusable = (self.shared_w13 is not None and not self.shared_split
                       and not cfg.batch_invariant and self.shared_w13.is_contiguous()
                       and self.shared_w2.is_contiguous())
            one = _every_token_on_one_expert(self.shared_w13.device) if fusable else ()
            # (merged, the shared rows take the routed experts' GLU: only a plain SwiGLU is the
            # shared expert's)
            merges = (fusable and cfg.quantization in moe_decode.FORMATS and not cfg.expert_bias
                      and cfg.activation == "silu" and cfg.swiglu_limit is None
                      and cfg.shared_intermediate_size == cfg.intermediate_size
                      and isinstance(self.dispatch, LocalDispatch)
                      and self.experts.name == "shuffled"
                      and (cfg.top_k == 1 or cfg.deterministic))
            paths = _Paths(cfg, self.experts, self.dispatch, ROUTERS.get(cfg.router), fusable,
                           merges)
            local = isinstance(self.dispatch, LocalDispatch)  # (a parallel one is per layer)
            paths = _shared(paths) if local else paths
            hot = _Hot(self.expert_weights, self.router_weight, self.router_bias,
                       self.router_logits_bias, self.shared_w13, self.shared_w2, self.shared_gate,
                       paths, one)
            compiling = torch.compiler.is_compiling()
            if compiling or not (self.w13.is_cuda and torch.cuda.is_current_stream_capturing()):
                # (captured, its routing tensors would hold values only in the graph)
                self.__dict__["_hot_parts"] = hot
                if local and not compiling:
                    self.__dict__["_paths_key"] = _paths_key(paths)
            if not compiling:  # compiled: gathered for real by an eager call or patch() first
                moe_decode.reserve(self.w13, self.w2, quantization=cfg.quantization,
                                   shared_tokens=SHARED_FUSED_MAX_TOKENS if merges else 0)
                if fusable:
                    Is, D = cfg.shared_intermediate_size, cfg.hidden_size
                    moe_decode.reserve(self.shared_w13.view(1, 2 * Is, D),
                                       self.shared_w2.view(1, D, Is), SHARED_WORKSPACE)
        return hot

    def _traced_hot(self) -> _Hot:
        """_Hot as a compiled forward reads it (the layer gathered for real before): the layer's
        tensors through its module, the rest from _PATHS (see _Paths)."""
        paths = _PATHS[self._paths_key]
        one = _every_token_on_one_expert(self.shared_w13.device) if paths.shared_fusable else ()
        weights = ExpertWeights(self.w13, self.w2, self.w13_scale, self.w2_scale, self.w13_bias,
                                self.w2_bias, paths.config.quantization)
        # every field given: see index_shuffle.kernel.PLACE_PROGRAMS (no plans: compiled, the
        # launches are Inductor's)
        return _Hot(weights, self.router_weight, self.router_bias, self.router_logits_bias,
                    self.shared_w13, self.shared_w2, self.shared_gate, paths, one, {})

    @property
    def expert_weights(self) -> ExpertWeights:
        return ExpertWeights(self.w13, self.w2, self.w13_scale, self.w2_scale, self.w13_bias,
                             self.w2_bias, self.config.quantization)

    def route(self, x: Tensor) -> Routing:
        """x [T, D] -> Routing over all E experts."""
        cfg = self.config
        logits = router_logits(x, self.router_weight, cfg.router_logits_dtype,
                               self.router_logits_bias, cfg.batch_invariant)
        return route(logits, cfg, self.router_bias)

    def shared_expert(self, x: Tensor, out: Tensor, part: int | None = None,
                      accumulate: bool = False) -> Tensor:
        """out [T, D] = shared SwiGLU(x) (times sigmoid(x @ gate) for Qwen2-MoE). With
        ``shared_split`` = h > 0 the weights hold two parts (columns [0, h) and [h, Is), rows of
        shared_w13 part by part, each gate rows then up rows): ``part`` 0 writes the first part's
        output, part 1 adds the second's (eager expert parallelism runs them around its host sync
        and its combine); part None runs both. Batch-invariant (local dispatch only, never
        split): every product through batch_invariant.linear. At decode sizes, a shared expert
        not split runs in the fused decode kernels (_fused_shared). accumulate (a plain shared
        expert, not split): out += the output, in the down projection's epilogue."""
        hot, h = self._hot(), self.shared_split
        cfg = hot.paths.config
        Is = cfg.shared_intermediate_size
        if cfg.batch_invariant:
            return batch_invariant.shared_expert(x, hot.shared_w13, hot.shared_w2,
                                                 hot.shared_gate, out)
        if part is None and not accumulate and self._fuses_shared(x, hot):
            return self._fused_shared(hot, x, out)
        if part is None and h:
            self.shared_expert(x, out, 0)
            return self.shared_expert(x, out, 1)
        lo, hi = (0, h or Is) if part in (None, 0) else (h, Is)
        w13, w2 = hot.shared_w13, hot.shared_w2
        if (lo, hi) != (0, Is):
            w13, w2 = w13[2 * lo : 2 * hi], w2[:, lo:hi]
        h13 = F.linear(x, w13)  # [T, 2 * (hi - lo)]
        ops = backend_for(h13)
        if (lo, hi) == (0, Is) and not torch.compiler.is_compiling():  # eager: a launch plan
            a = torch.empty(x.shape[0], Is, dtype=x.dtype, device=x.device)
            self._planned(hot, "shared", lambda: ops.silu_mul(h13, None, False, a), (h13, a), ())
        else:
            a = ops.silu_mul(h13, None, False, None)
        gate = None if hot.shared_gate is None else torch.sigmoid(F.linear(x, hot.shared_gate))
        if accumulate:  # cuBLAS adds out in fp32 (beta = 1) and rounds once: no extra pass
            return out.addmm_(a, w2.t())
        if part == 1:
            y = torch.mm(a, w2.t())
            return out.add_(y if gate is None else y.mul_(gate))
        torch.mm(a, w2.t(), out=out)
        return out if gate is None else out.mul_(gate)

    def start_shared(self, x: Tensor, out: Tensor | None = None
                     ) -> tuple[Tensor, Callable[[], None]]:
        """(out [T, D] holding the shared expert's output, or zeros without one; join): for small
        T captured in a CUDA graph the shared expert runs on a side stream, overlapping routing
        and GEMM13, and join() makes the current stream wait for it (call it before anything adds
        into out). ``out``: written instead of a new tensor."""
        if self.shared_w13 is None:
            return (torch.zeros_like(x) if out is None else out.zero_()), _noop
        out = torch.empty_like(x) if out is None else out
        if not self._uses_side_stream(x):  # prefill: one stream, overlapping would only contend
            self.shared_expert(x, out)
            return out, _noop
        main = torch.cuda.current_stream(x.device)
        if self._side_stream is None:
            self._side_stream = torch.cuda.Stream(x.device)
        side = self._side_stream
        side.wait_stream(main)
        with torch.cuda.stream(side):
            self.shared_expert(x, out)
        return out, lambda: main.wait_stream(side)

    def _uses_side_stream(self, x: Tensor) -> bool:
        """Only while a CUDA graph captures the layer, where the fork and join are free at replay.
        Launched from Python a decode call is bound by the host (Llama 4 Scout TP8 at T = 1 on an
        H100: ~600 us of host time for ~185 us of GPU work, benchmarks/results/host_cost.md), so
        the overlap gains nothing there and the stream switch and its waits cost ~40 us a call.
        Compiled, the compiler schedules."""
        return (not torch.compiler.is_compiling() and x.is_cuda and self.shared_w13 is not None
                and x.shape[0] <= self.config.shared_stream_max_tokens
                and torch.cuda.is_current_stream_capturing())

    def input_error(self, x: object) -> Exception | None:
        """The error a bad input raises (None when x is a valid [T, D] or [B, S, D] input)."""
        cfg = self.config
        try:
            check_tensor("x", x, dtypes=(cfg.dtype,), device=self.w13.device)
            if x.dim() not in (2, 3) or x.shape[-1] != cfg.hidden_size:
                raise ValueError(f"x must be [T, {cfg.hidden_size}] or [B, S, {cfg.hidden_size}], "
                                 f"got {list(x.shape)}")
        except (TypeError, ValueError) as e:
            return e
        return None

    def forward(self, x: Tensor) -> Tensor:
        hot = self._hot()
        cfg, dispatch = hot.paths.config, hot.paths.dispatch
        if dispatch.mesh is not None:
            # A parallel dispatcher agrees on sizes with the other ranks before any collective,
            # and raises the same error on every rank when one of them got a bad input.
            sizes = dispatch.admit(self, x, self.input_error(x))
            with torch.no_grad(), batch_invariant.scope(cfg, x):
                flat = x.reshape(-1, cfg.hidden_size).contiguous()
                return dispatch.forward(self, flat, sizes).view(x.shape)
        w13 = hot.weights.w13
        if not (isinstance(x, Tensor) and x.dtype == cfg.dtype and x.device == w13.device
                and x.dim() in (2, 3) and x.shape[-1] == cfg.hidden_size):
            raise self.input_error(x)  # names what is wrong
        flat = x.reshape(-1, cfg.hidden_size).contiguous()  # [T, D]
        if cfg.batch_invariant:  # its scope (a context variable) breaks a compiled graph
            with torch.no_grad(), batch_invariant.scope(cfg, flat):
                return self._forward(flat, hot).view(x.shape)
        if torch.is_grad_enabled():  # inference only; no_grad costs a little even when off
            with torch.no_grad():
                return self._forward(flat, hot).view(x.shape)
        return self._forward(flat, hot).view(x.shape)

    def forward_into(self, x: Tensor, out: Tensor) -> Tensor:
        """x [T, D] contiguous in config.dtype -> out [T, D] (overwritten), unchecked: how graph.py
        captures the layer into static buffers shared with other layers' graphs."""
        with torch.no_grad(), batch_invariant.scope(self.config, x):
            if self.dispatch.mesh is not None:
                return out.copy_(self.dispatch.forward(self, x, self.dispatch.admit(self, x, None)))
            return self._forward(x, self._hot(), out)

    def _forward(self, x: Tensor, hot: _Hot | None = None,
                 out: Tensor | None = None) -> Tensor:  # x [T, D]: the single-device flow
        hot = hot or self._hot()
        given = out is not None  # graph.py's capture (and its warm-up) into static buffers
        if self._merges_shared(x, hot):
            return self._merged_forward(x, hot, out)
        if (not given and self._fuses_shared(x, hot) and not torch.compiler.is_compiling()
                and not (x.is_cuda and torch.cuda.is_current_stream_capturing())):
            return self._fused_shared_forward(x, hot)  # eager decode: one launch plan
        first = self._routed_first(x, hot)
        if first:  # the routed experts write every row of out, the shared expert adds after
            out, join = (torch.empty_like(x) if out is None else out), _noop
        else:  # decode: shared expert first, overlapping routing and GEMM13 on its own stream
            out, join = self.start_shared(x, out)
        if given or torch.compiler.is_compiling() or join is not _noop:
            # join: the shared expert runs on a side stream (captured): the routed combine must
            # wait for it before adding into out
            self._route_and_run(hot, x, self._logits(hot, x), out, join, first)
        else:  # eager, one stream: replayed from a launch plan when one can be made
            w = hot.weights
            self._planned_with_logits(
                hot, "routed", x, out,
                lambda logits: self._route_and_run(hot, x, logits(), out, _noop, first),
                (w.w13, w.w2, w.w13_scale, w.w2_scale, w.w13_bias, w.w2_bias, hot.router_bias))
        join()
        if first and self.shared_w13 is not None:
            self.shared_expert(x, out, accumulate=True)
        return out

    def _routed_first(self, x: Tensor, hot: _Hot | None = None) -> bool:
        """Whether the routed experts write every row of out (overwrite), every pair routed (no
        capacity) on one device through a strategy that can overwrite, and either
        - no shared expert: nothing else writes out, so it is not zero-filled first (one launch
          less a call, at decode a fill kernel less in the graph), any k combined in a fixed
          order (not the opt-in atomic combine, cfg.deterministic False); or
        - prefill (T past shared_stream_max_tokens, so graphs and eager calls agree) with top-1
          routing and a plain shared expert: GEMM2's epilogue stores each token's row into out
          without reading it, and the shared expert's down projection adds into it (cuBLAS,
          beta = 1), instead of the routed rows being read and added onto the shared output
          (Llama 4 Scout TP8 at T = 16384 on an H100: the read made GEMM2 1.28x slower in bf16,
          2.34x in fp8; benchmarks/results/probe_prefill.json).
        Out is rounded once either way, so every path of one T keeps the same bits."""
        paths = (hot or self._hot()).paths
        cfg = paths.config
        if not (cfg.capacity_factor is None and paths.experts.overwrites
                and isinstance(paths.dispatch, LocalDispatch)):
            return False
        if self.shared_w13 is None:
            return cfg.top_k == 1 or cfg.deterministic
        return (x.shape[0] > cfg.shared_stream_max_tokens and cfg.top_k == 1
                and not cfg.batch_invariant and self.shared_gate is None
                and not self.shared_split)

    def _fuses_shared(self, x: Tensor, hot: _Hot) -> bool:
        """A shared expert (gated or not; not split in parts, contiguous weights) at decode
        sizes on the Triton backend, in a layer whose routed experts take the fused decode
        kernels there too (configs.Switch: bf16 and the weight-only formats; fp8 rowwise top-1
        only on a GPU it names): _fused_shared runs it.
        Beside the unfused fp8 path on a graph's side stream its kernels, which occupy every SM,
        cost 4-5 us a call more than cuBLAS (Llama 4 Scout TP8 fp8 at T = 1 and 8, H100,
        benchmarks/probe_timeline.py); beside the fused bf16 path they cost the same."""
        cfg, T = hot.paths.config, x.shape[0]
        return (hot.paths.shared_fusable and 0 < T <= SHARED_FUSED_MAX_TOKENS
                and backend_for(x).name == "triton"
                and cfg.quantization in moe_decode.FORMATS
                and moe_decode.configs.use_fused(T * cfg.top_k, cfg.top_k, cfg.quantization,
                                                 cfg.num_experts, device=device_name(x.device)))

    def _merges_shared(self, x: Tensor, hot: _Hot) -> bool:
        """A shared expert (gated or not) of the routed experts' width, in a layer whose routed
        experts the fused decode kernels read (bf16, fp16, fp32, or stored fp8 rowwise,
        fp8_block, fp8_w8a16 or mxfp4; no expert bias) with the shuffled strategy on one device,
        on the Triton backend, where configs.merges_shared says (T <= Switch.shared_max_tokens,
        or for quantized routed experts shared_quantized_max_tokens): _merged runs both in two
        launches (in every mode: eager, CUDA graph, compiled)."""
        cfg, T = hot.paths.config, x.shape[0]
        return (hot.paths.shared_merges and 0 < T <= SHARED_FUSED_MAX_TOKENS
                and backend_for(x).name == "triton"
                and moe_decode.configs.merges_shared(T, cfg.top_k, cfg.quantization,
                                                     cfg.num_experts))

    def _merged_forward(self, x: Tensor, hot: _Hot, out: Tensor | None) -> Tensor:
        """out [T, D] = the shared expert's and the routed experts' output (_merged): eager, from
        one launch plan (the router's logits inside it at decode T)."""
        out = torch.empty_like(x) if out is None else out
        if (torch.compiler.is_compiling()
                or (x.is_cuda and torch.cuda.is_current_stream_capturing())):
            self._merged(hot, x, lambda: self._logits(hot, x), out)
            return out
        w = hot.weights
        self._planned_with_logits(hot, "merged", x, out,
                                  lambda logits: self._merged(hot, x, logits, out),
                                  (w.w13, w.w2, w.w13_scale, w.w2_scale, hot.router_bias,
                                   hot.shared_w13, hot.shared_w2, hot.shared_gate))
        return out

    def _merged(self, hot: _Hot, x: Tensor, logits: Callable[[], Tensor], out: Tensor) -> None:
        """out [T, D] = shared expert + routed experts through the fused decode kernels, the
        shared expert as an expert every token visits (ops.decode_gate_up's shared_w13): a [T +
        A, I] holds its rows first, decode_down adds each token's shared row and then its pairs'
        in fp32 and rounds once (routed experts stored w8a8, fp8 rowwise or fp8_block: the
        shared rows stay in x's dtype, in a third buffer; a gated one's rows are multiplied by
        sigmoid(x . gate) in down's epilogue). Its gate_up programs need no routing:
        launched with PDL they start while the router and index_shuffle run, so ``a`` is
        allocated before those launch (no later allocation can hand them memory those kernels
        still use)."""
        cfg, w, ops = hot.paths.config, hot.weights, backend_for(x)
        T, I, quant = x.shape[0], cfg.intermediate_size, cfg.quantization
        E, D = w.w2.shape[:2]
        fp32 = moe_decode.configs.down_quantizes(T * cfg.top_k + T, E, D, I, w.w2.dtype, x.device,
                                                 quant)
        a = moe_decode.gate_up_outputs(None, T * cfg.top_k, I, x.dtype, quant, x.device, T, fp32)
        r = hot.paths.route(logits(), cfg, hot.router_bias)
        w_in, w_out = pair_weights(r, cfg)
        ops.decode_gate_up(x, w.w13, w.w13_scale, r.counts, r.token_ids, w_in, a, 0, quant, None,
                           cfg.act, shared=hot.shared_w13, early=True)
        q, scale, sa = a if isinstance(a, tuple) else (a, None, None)
        ops.decode_down(q, scale, w.w2, w.w2_scale, r.counts, r.token_ids, r.positions, w_out,
                        out, False, 0, quant, None, shared=hot.shared_w2, early=True,
                        shared_a=sa, shared_gate=hot.shared_gate, gate_input=x)

    def _fused_shared(self, hot: _Hot, x: Tensor, out: Tensor) -> Tensor:
        """out [T, D] = the shared expert of x [T, D] (gated: times sigmoid(x . gate), in
        decode_down's epilogue), as a routing of every token to one expert
        through the fused decode kernels (decode_down writes out): two launches that spread its
        weights over every SM, instead of two cuBLAS GEMMs and a SwiGLU launch."""
        cfg, T = hot.paths.config, x.shape[0]
        D, Is = cfg.hidden_size, cfg.shared_intermediate_size
        counts, ids, positions = hot.one_expert[T]
        ops = backend_for(x)
        a = torch.empty(T, Is, dtype=x.dtype, device=x.device)
        ops.decode_gate_up(x, hot.shared_w13.view(1, 2 * Is, D), None, counts, ids, None, a,
                           SHARED_WORKSPACE)
        return ops.decode_down(a, None, hot.shared_w2.view(1, D, Is), None, counts, ids,
                               positions, None, out, False, SHARED_WORKSPACE,
                               shared_gate=hot.shared_gate, gate_input=x)

    def _fused_shared_forward(self, x: Tensor, hot: _Hot) -> Tensor:
        """Eager decode with a fused shared expert, in one launch plan with routing and the
        routed experts (which add into the out the shared expert wrote): one plan replay instead
        of two, and no zero fill."""
        out = torch.empty_like(x)
        counts, ids, positions = hot.one_expert[x.shape[0]]
        w = hot.weights

        def region(logits: Callable[[], Tensor]) -> None:
            self._fused_shared(hot, x, out)
            self._route_and_run(hot, x, logits(), out)

        self._planned_with_logits(
            hot, "shared+routed", x, out, region,
            (w.w13, w.w2, w.w13_scale, w.w2_scale, w.w13_bias, w.w2_bias, hot.router_bias,
             hot.shared_w13, hot.shared_w2, hot.shared_gate, counts, ids, positions))
        return out

    def _logits(self, hot: _Hot, x: Tensor) -> Tensor:
        """The router logits [T, E] of x [T, D]."""
        cfg = hot.paths.config
        return router_logits(x, hot.router_weight, cfg.router_logits_dtype,
                             hot.router_logits_bias, cfg.batch_invariant)

    def _planned_with_logits(self, hot: _Hot, name: str, x: Tensor, out: Tensor,
                             region: Callable[[Callable[[], Tensor]], None],
                             fixed: tuple[Tensor | None, ...]) -> None:
        """_planned(region(logits)), ``logits()`` giving the router's logits of x: computed
        inside the plan where _logits_in_plan (dynamic inputs (x, out), the router's weight and
        bias fixed ones), else once before it (dynamic inputs (x, logits, out))."""
        if self._logits_in_plan(x):
            self._planned(hot, name, lambda: region(lambda: self._logits(hot, x)), (x, out),
                          fixed + (hot.router_weight, hot.router_logits_bias))
        else:
            logits = self._logits(hot, x)
            self._planned(hot, name, lambda: region(lambda: logits), (x, logits, out), fixed)

    def _logits_in_plan(self, x: Tensor) -> bool:
        """Whether an eager call's launch plan computes the router logits too: at decode T on
        the kernels they are one Triton launch (ops/router), which the plan replays, instead of
        an aten GEMM before it (~8-10 us of host), float32 logits of a bf16 model too (the
        kernel reads x and the weight as stored). Not batch_invariant's GEMM, which a plan
        cannot hold."""
        cfg = self.config
        return router_uses_kernel(x.shape[0], cfg.num_experts) and not cfg.batch_invariant

    def _route_and_run(self, hot: _Hot, x: Tensor, logits: Tensor, out: Tensor,
                       join: Callable[[], None] = lambda: None, overwrite: bool = False) -> None:
        """out += the routed experts' output for router logits [T, E] (overwrite: out = it,
        local dispatch only, see _routed_first; x is the layer's input, written before the
        router's launch, which is not launched early: x_ready)."""
        paths = hot.paths
        routing = paths.route(logits, paths.config, hot.router_bias)
        if overwrite:
            paths.dispatch.run(paths.experts, x, routing, hot.weights, out, paths.config, join,
                               overwrite=True, x_ready=True)
        else:
            paths.dispatch.run(paths.experts, x, routing, hot.weights, out, paths.config, join)

    def _planned(self, hot: _Hot, name: str, region: Callable[[], None],
                 dynamic: tuple[Tensor, ...], fixed: tuple[Tensor | None, ...]) -> None:
        """run_planned for this layer: ``fixed`` are its tensors the region reads; layers of one
        config, router function and layout share what was recorded (the router too: a layer
        gathered while ROUTERS held another function for its name must not share a recording
        with one gathered after). Without a plan under a device mesh."""
        signature = ((self.config, hot.paths.route, self.experts.name, type(self.dispatch))
                     if self.dispatch.mesh is None else None)
        run_planned(hot.plans, name, signature, region, dynamic, fixed)

    def extra_repr(self) -> str:
        c = self.config
        return (f"E={c.num_experts}, k={c.top_k}, D={c.hidden_size}, I={c.intermediate_size}, "
                f"shared={c.shared_intermediate_size}, router={c.router}, "
                f"experts={self.experts.name}, dispatch={self.dispatch.name}, "
                f"quantization={c.quantization}")


def run_planned(plans: dict, name: str, signature: tuple | None, region: Callable[[], None],
                dynamic: tuple[Tensor, ...], fixed: tuple[Tensor | None, ...]) -> None:
    """Run region(), replayed from a launch plan (ops/_launch.py: its Triton launches with no
    argument binding and no allocation) where one can be made. ``plans``: the caller's
    (its dict of (name, T, stream, impl, batch-invariant tiles) -> plan); ``dynamic``: the
    tensors that change per call (the first's rows are the plan's T), whose layouts the name
    and T must fix; ``fixed``: the caller's own tensors the region reads; ``signature``: what
    else the region's launches depend on (callers with equal signatures and layouts share
    one recording, _TEMPLATES), None for a region never recorded. The first call at a key
    records the plan, or finds that it cannot be made, while running the region for real.
    Past PLAN_MAX_TOKENS a T is recorded at its second call (see PLAN_MAX_LARGE). Inside a
    CUDA-graph capture and under a tile override (decode or grouped-GEMM configs) the region
    runs."""
    x = dynamic[0]
    if ((x.is_cuda and torch.cuda.is_current_stream_capturing())
            or moe_decode.configs.overridden() or gemm_configs.overridden()):
        return region()
    stream = torch._C._cuda_getCurrentRawStream(x.get_device()) if x.is_cuda else 0
    key = (name, x.shape[0], stream, _default_impl(), gemm_configs.invariant())
    plan = plans.get(key, _UNSEEN)
    if plan is _UNSEEN or plan is _ONCE:
        large = x.shape[0] > PLAN_MAX_TOKENS
        if large and plan is _UNSEEN:  # a prompt length seen once is not worth a recording
            _seen_once(plans, key)
            return region()
        plan, ran = None, False
        if signature is not None and _launch.knobs and backend_for(x).name == "triton":
            inputs = dynamic + fixed
            layouts = signature + (key, tuple(_layout(t) for t in inputs))
            template = _TEMPLATES.get(layouts, _UNSEEN)
            if template is _UNSEEN:
                template = _launch.record(region, inputs, len(dynamic))
                if template is not None and template.nbytes > PLAN_MAX_WORKSPACE:
                    template = None
                _TEMPLATES[layouts] = template
                ran = True
            if template is not None:
                plan = _launch.Plan(template, inputs, len(dynamic), x.device, stream)
        plans[key] = plan
        if ran:
            return None
    if plan is None or not plan(*dynamic):
        region()
    return None


def _noop() -> None:
    pass


def _seen_once(plans: dict, key: tuple) -> None:
    """Mark ``key`` (a T past PLAN_MAX_TOKENS) as seen once, within PLAN_MAX_LARGE such keys a
    layer: when they are all taken, the oldest key seen only once gives its place (prompt
    lengths come and go; recorded plans stay), and when every one holds a plan, nothing."""
    large = [k for k in plans if k[1] > PLAN_MAX_TOKENS]
    if len(large) >= PLAN_MAX_LARGE:
        once = next((k for k in large if plans[k] is _ONCE), None)
        if once is None:
            return
        del plans[once]
    plans[key] = _ONCE


_ONE_EXPERT: dict[tuple[torch.device, int], tuple[tuple[Tensor, ...], ...]] = {}


def _every_token_on_one_expert(device: torch.device) -> tuple[tuple[Tensor, ...], ...]:
    """_Hot.one_expert for layers on ``device``: made once and shared (made afresh, not kept,
    while compiling or capturing: their values would exist only in that graph). Kept ones are
    static addresses: a compiled forward reads them from this module (_traced_hot), and
    CUDA-graph trees (compile's reduce-overhead) would otherwise copy them in, or, as inputs
    Inductor counts written by the decode kernels, skip the graph."""
    key = (device, SHARED_FUSED_MAX_TOKENS)  # (a test may lower the limit for a while)
    made = _ONE_EXPERT.get(key)
    if made is None:
        i32 = dict(dtype=torch.int32, device=device)
        made = tuple((torch.full((1,), T, **i32), torch.arange(T, **i32), torch.arange(T, **i32))
                     for T in range(SHARED_FUSED_MAX_TOKENS + 1))
        if not (torch.compiler.is_compiling()
                or (device.type == "cuda" and torch.cuda.is_current_stream_capturing())):
            if device.type == "cuda":
                for t in (t for per_T in made for t in per_T):
                    torch._dynamo.mark_static_address(t)
            _ONE_EXPERT[key] = made
    return made


_UNSEEN = object()
_ONCE = object()
