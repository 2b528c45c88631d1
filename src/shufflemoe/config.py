"""One configuration object for an MoE layer.

Legend used across the package: T tokens, D hidden, I routed-expert intermediate, E experts,
k experts per token, A = T * k token-expert pairs.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from .ops.quantize.formats import FORMATS

ROUTERS = ("topk", "llama4", "group_limited")
SCORINGS = ("softmax", "sigmoid")
QUANTIZATIONS = tuple(FORMATS)  # none | fp8_rowwise | fp8_w8a16 | fp8_block | mxfp4
ACTIVATIONS = ("silu", "swiglu_oai")
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
    correction_bias: bool = False  # group_limited: a learned [E] bias added for selection only
    n_group: int = 1  # group_limited: experts are split into n_group equal groups
    topk_group: int = 1  # group_limited: groups kept per token
    routed_scaling_factor: float = 1.0  # multiplies the routed weights (DeepSeek-V3 uses 2.5)
    router_logits_dtype: torch.dtype | None = None  # None: x's dtype; DeepSeek-V3 in HF: float32
    capacity_factor: float | None = None  # None: dropless; else tokens past capacity are dropped
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
    shared_stream_max_tokens: int = 512  # shared expert on its own CUDA stream up to this T
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
            reachable = self.topk_group * (self.num_experts // self.n_group)
            if self.top_k > reachable:
                raise ValueError(
                    f"MoEConfig.top_k ({self.top_k}) exceeds the {reachable} experts in "
                    f"topk_group={self.topk_group} groups"
                )
        elif self.correction_bias:
            raise ValueError("MoEConfig.correction_bias is only used by router='group_limited'")
        if not (self.routed_scaling_factor > 0 and math.isfinite(self.routed_scaling_factor)):
            raise ValueError(
                f"MoEConfig.routed_scaling_factor must be positive, got {self.routed_scaling_factor}"
            )
        if self.capacity_factor is not None and not self.capacity_factor > 0:
            raise ValueError(
                f"MoEConfig.capacity_factor must be positive or None, got {self.capacity_factor}"
            )
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
        """Pairs each expert may take: ceil(capacity_factor * T * k / E), or None when dropless."""
        if self.capacity_factor is None:
            return None
        return math.ceil(self.capacity_factor * num_tokens * self.top_k / self.num_experts)

    @property
    def quantized(self) -> bool:
        return self.quantization != "none"

    def replace(self, **changes) -> MoEConfig:
        return dataclasses.replace(self, **changes)
