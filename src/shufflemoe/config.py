"""One configuration object for an MoE layer.

Legend used across the package: T tokens, D hidden, I routed-expert intermediate, E experts,
k experts per token, A = T * k token-expert pairs.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from fractions import Fraction

import torch

from .ops.index_shuffle.reference import GROUP_BEST
from .ops.quantize.formats import FORMATS

ROUTERS = ("topk", "llama4", "group_limited")
SCORINGS = ("softmax", "sigmoid")
QUANTIZATIONS = tuple(FORMATS)  # none | fp8_rowwise | fp8_w8a16 | fp8_block | mxfp4
ACTIVATIONS = ("silu", "swiglu_oai")
RENORMALIZE_OVER = ("kept", "chosen")
GROUP_SCORES = tuple(GROUP_BEST)  # "top2" (DeepSeek-V3) | "max" (DeepSeek-V2)
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@dataclass(frozen=True)
class MoEConfig:
    hidden_size: int  # D
    intermediate_size: int  # I of one routed expert (of this rank's shard under tensor parallelism)
    num_experts: int  # E
    top_k: int = 1  # k
    # Router: "topk" (Mixtral, Qwen3, OLMoE), "llama4" (top-k on the logits, sigmoid of the chosen
    # logit, applied to the expert's input), "group_limited" (DeepSeek-V3: top groups, then top-k).
    router: str = "topk"
    scoring: str = "softmax"  # softmax | sigmoid: turns logits into affinities
    renormalize: bool = False  # divide the k selected affinities by their sum
    # With renormalize and a capacity factor, which affinities a token's weights are divided by:
    # "kept" (NxD, the Neuron guide's reference: the experts left after capacity dropping, so a
    # token that lost an expert still sums to 1) or "chosen" (GShard/Switch: the k chosen before
    # dropping; a dropped pair's share is lost).
    renormalize_over: str = "kept"
    correction_bias: bool = False  # group_limited: a learned [E] bias added for selection only
    n_group: int = 1  # group_limited: experts are split into n_group equal groups
    topk_group: int = 1  # group_limited: groups kept per token
    # group_limited: a group's score: "top2" (DeepSeek-V3: its two best choices summed) or "max"
    # (DeepSeek-V2's group_limited_greedy: its best choice)
    group_score: str = "top2"
    # group_limited: round the scores (softmax or sigmoid) to the logits' dtype before the bias
    # is added and experts are chosen, as a router computing them in bf16 does (LFM2-MoE)
    round_scores: bool = False
    routed_scaling_factor: float = 1.0  # multiplies the routed weights (DeepSeek-V3 uses 2.5)
    router_logits_dtype: torch.dtype | None = None  # None: x's dtype; DeepSeek-V3 in HF: float32
    # None: dropless; else each expert takes its first ceil(capacity_factor * T * k / E) pairs in
    # token order (exact: the factor is read as the decimal it prints as, 0.1 is 1/10)
    capacity_factor: float | None = None
    shared_intermediate_size: int = 0  # I of the shared expert; 0 = no shared expert
    shared_expert_gate: bool = False  # Qwen2-MoE: shared output times sigmoid(x @ gate)
    apply_router_weight_on_input: bool = False  # Llama 4: scale the expert input, not its output
    dtype: torch.dtype = torch.bfloat16  # activations and unquantized weights
    # Routed experts' weight format (ops/quantize/formats.py): none | fp8_rowwise (w8a8, the
    # spec's Maverick) | fp8_w8a16 (weight-only) | fp8_block (DeepSeek-V3 / Qwen3 FP8) | mxfp4
    # (gpt-oss). Router and shared expert stay in dtype.
    quantization: str = "none"
    # Strategy knobs (one config object, so every strategy reads its settings from here).
    block_size: int = 128  # blockwise: tokens per block (Neuron BWMM)
    decode_switch_alpha: float = 0.9  # selective while T * k <= alpha * E, else all_experts
    shared_stream_max_tokens: int = 512  # in a CUDA graph, shared expert on its own stream to this T
    # Each output row bit-identical whatever else is in the batch (batch_invariant.py): fixed
    # tile configurations, token-major combine in a fixed order, router and shared expert through
    # the same fixed-config GEMM. Needs the Triton kernels, the shuffled strategy and local
    # dispatch, and no capacity factor (dropping depends on the batch by definition).
    batch_invariant: bool = False
    # Same input, same bits (the default): each token's k rows summed in a fixed order, float32,
    # one rounding. False lets `shuffled` add k > 1 rows into the output with atomics in GEMM2's
    # epilogue instead (unfused, any order: outputs differ run to run in the last bits), which
    # saved 1-11% of the layer's GPU time at decode T = 1 on an H100
    # (benchmarks/results/probe_combine.md); the other strategies always combine in order.
    deterministic: bool = True
    # Routed experts' GLU (ops/silu_mul): "silu" (silu(gate) * up) or "swiglu_oai" (gpt-oss:
    # (up + 1) * gate * sigmoid(swiglu_alpha * gate)); swiglu_limit clamps gate above and up on
    # both sides first (gpt-oss: 7.0). The shared expert is plain SwiGLU.
    activation: str = "silu"
    swiglu_alpha: float = 1.702
    swiglu_limit: float | None = None
    expert_bias: bool = False  # routed experts add biases [E, 2I], [E, D] after both GEMMs (gpt-oss)
    router_logits_bias: bool = False  # the router adds a bias [E] to its logits (gpt-oss)

    def __post_init__(self) -> None:
        for name in ("hidden_size", "intermediate_size", "num_experts", "top_k", "block_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"MoEConfig.{name} must be a positive int, got {value!r}")
        if self.top_k > self.num_experts:
            raise ValueError(
                f"MoEConfig.top_k ({self.top_k}) must not exceed num_experts ({self.num_experts})"
            )
        if self.router not in ROUTERS:
            raise ValueError(f"MoEConfig.router must be one of {ROUTERS}, got {self.router!r}")
        if self.scoring not in SCORINGS:
            raise ValueError(f"MoEConfig.scoring must be one of {SCORINGS}, got {self.scoring!r}")
        if self.router == "llama4":
            if self.renormalize:
                raise ValueError(
                    "MoEConfig.renormalize is not used by router='llama4' (its weight is "
                    "sigmoid of the chosen logit, as in Llama 4); set renormalize=False"
                )
            if self.scoring != "sigmoid":
                raise ValueError("MoEConfig.scoring must be 'sigmoid' for router='llama4'")
            if not self.apply_router_weight_on_input:
                raise ValueError(
                    "MoEConfig.apply_router_weight_on_input must be True for router='llama4'"
                )
        if self.router == "group_limited":
            if self.n_group <= 0 or self.num_experts % self.n_group:
                raise ValueError(
                    f"MoEConfig.n_group ({self.n_group}) must divide num_experts ({self.num_experts})"
                )
            if not 0 < self.topk_group <= self.n_group:
                raise ValueError(
                    f"MoEConfig.topk_group ({self.topk_group}) must be in 1..n_group ({self.n_group})"
                )
            if self.group_score not in GROUP_SCORES:
                raise ValueError(
                    f"MoEConfig.group_score must be one of {GROUP_SCORES}, got {self.group_score!r}"
                )
            reachable = self.topk_group * (self.num_experts // self.n_group)
            if self.top_k > reachable:
                raise ValueError(
                    f"MoEConfig.top_k ({self.top_k}) exceeds the {reachable} experts in "
                    f"topk_group={self.topk_group} groups"
                )
        else:
            for name in ("correction_bias", "n_group", "topk_group", "group_score",
                         "round_scores"):
                if getattr(self, name) != _DEFAULTS[name]:
                    raise ValueError(
                        f"MoEConfig.{name} is only used by router='group_limited', got "
                        f"{getattr(self, name)!r} with router={self.router!r}"
                    )
        if not (self.routed_scaling_factor > 0 and math.isfinite(self.routed_scaling_factor)):
            raise ValueError(
                f"MoEConfig.routed_scaling_factor must be positive, got {self.routed_scaling_factor}"
            )
        if self.capacity_factor is not None and (
            isinstance(self.capacity_factor, bool)
            or not isinstance(self.capacity_factor, (int, float, Fraction))
            or not (self.capacity_factor > 0 and math.isfinite(self.capacity_factor))
        ):
            raise ValueError(
                f"MoEConfig.capacity_factor must be a positive number or None, "
                f"got {self.capacity_factor!r}"
            )
        if self.renormalize_over not in RENORMALIZE_OVER:
            raise ValueError(f"MoEConfig.renormalize_over must be one of {RENORMALIZE_OVER}, "
                             f"got {self.renormalize_over!r}")
        if self.renormalize_over != "kept" and not (self.renormalize and self.capacity_factor):
            raise ValueError("MoEConfig.renormalize_over only matters with renormalize=True and "
                             "a capacity_factor; leave it at 'kept' otherwise")
        if self.batch_invariant and not self.deterministic:
            raise ValueError("MoEConfig.batch_invariant needs deterministic=True")
        if self.batch_invariant and self.capacity_factor is not None:
            raise ValueError("MoEConfig.batch_invariant cannot hold with a capacity_factor: which "
                             "pairs are dropped depends on the rest of the batch")
        if not isinstance(self.shared_intermediate_size, int) or self.shared_intermediate_size < 0:
            raise ValueError(
                "MoEConfig.shared_intermediate_size must be an int >= 0, "
                f"got {self.shared_intermediate_size!r}"
            )
        if self.shared_expert_gate and self.shared_intermediate_size == 0:
            raise ValueError("MoEConfig.shared_expert_gate needs shared_intermediate_size > 0")
        if self.router_logits_dtype not in (None, *DTYPES):
            raise ValueError(f"MoEConfig.router_logits_dtype must be None or one of {DTYPES}")
        if self.dtype not in DTYPES:
            raise ValueError(f"MoEConfig.dtype must be one of {DTYPES}, got {self.dtype}")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(
                f"MoEConfig.quantization must be one of {QUANTIZATIONS}, got {self.quantization!r}"
            )
        fmt = FORMATS[self.quantization]
        for what, (n, k) in (("w13", (2 * self.intermediate_size, self.hidden_size)),
                             ("w2", (self.hidden_size, self.intermediate_size))):
            if fmt.why_not(n, k):
                raise ValueError(f"MoEConfig.quantization: {what}: {fmt.why_not(n, k)}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"MoEConfig.activation must be one of {ACTIVATIONS}, "
                             f"got {self.activation!r}")
        if self.swiglu_limit is not None and not self.swiglu_limit > 0:
            raise ValueError(f"MoEConfig.swiglu_limit must be None or positive, got {self.swiglu_limit}")
        if self.expert_bias and self.apply_router_weight_on_input:
            # strategies pad with zero rows weighted 0 at the input; a bias makes them non-zero
            raise ValueError("MoEConfig.expert_bias cannot be combined with "
                             "apply_router_weight_on_input")
        if not 0 < self.decode_switch_alpha:
            raise ValueError("MoEConfig.decode_switch_alpha must be positive")
        if self.shared_stream_max_tokens < 0:
            raise ValueError("MoEConfig.shared_stream_max_tokens must be >= 0")

    def capacity(self, num_tokens: int) -> int | None:
        """Pairs each expert may take: ceil(capacity_factor * T * k / E) in exact rational
        arithmetic (floating point gave 2 for 0.1 * 12 * 5 / 6), or None when dropless."""
        if self.capacity_factor is None:
            return None
        cf = self.capacity_factor
        exact = Fraction(repr(cf)) if isinstance(cf, float) else Fraction(cf)
        return math.ceil(exact * num_tokens * self.top_k / self.num_experts)

    @property
    def quantized(self) -> bool:
        return self.quantization != "none"

    @property
    def act(self) -> tuple[str, float, float | None]:
        """(activation, swiglu_alpha, swiglu_limit): what the GLU kernels take."""
        return self.activation, self.swiglu_alpha, self.swiglu_limit

    def replace(self, **changes) -> MoEConfig:
        return dataclasses.replace(self, **changes)


_DEFAULTS = {f.name: f.default for f in dataclasses.fields(MoEConfig)}
_OPTIONAL = {name: value for name, value in _DEFAULTS.items() if value is not dataclasses.MISSING}


def traced_config(**fields) -> MoEConfig:
    """MoEConfig(**fields) with every other field passed at its default, for a config built
    under torch.compile: torch 2.11's Dynamo guards each dataclass default a trace reads through
    dataclasses.fields(), a Python call at every check of the compiled entry (torch 2.13 reads
    them in C++). Passed explicitly, the defaults are guarded as this module's dict, in C++."""
    return MoEConfig(**{**_OPTIONAL, **fields})
