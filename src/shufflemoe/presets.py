"""MoE layer shapes of real models (from their HF configs), optionally sharded for tensor
parallelism (each rank holds I / tp of every expert and of the shared expert)."""

from __future__ import annotations

from .config import MoEConfig

_LLAMA4 = dict(router="llama4", scoring="sigmoid", apply_router_weight_on_input=True, top_k=1)
# gpt-oss: router bias, softmax over the chosen 4, expert biases, clamped GLU (checkpoints: mxfp4)
_GPT_OSS = dict(hidden_size=2880, intermediate_size=2880, top_k=4, renormalize=True,
                router_logits_bias=True, expert_bias=True, activation="swiglu_oai",
                swiglu_limit=7.0)

MODELS: dict[str, dict] = {
    "llama4-scout": dict(hidden_size=5120, intermediate_size=8192, num_experts=16,
                         shared_intermediate_size=8192, **_LLAMA4),
    "llama4-maverick": dict(hidden_size=5120, intermediate_size=8192, num_experts=128,
                            shared_intermediate_size=8192, **_LLAMA4),
    "qwen3-30b-a3b": dict(hidden_size=2048, intermediate_size=768, num_experts=128, top_k=8,
                          renormalize=True),
    "qwen3-235b-a22b": dict(hidden_size=4096, intermediate_size=1536, num_experts=128, top_k=8,
                            renormalize=True),
    "qwen2-57b-a14b": dict(hidden_size=3584, intermediate_size=2560, num_experts=64, top_k=8,
                           shared_intermediate_size=20480, shared_expert_gate=True),
    "mixtral-8x7b": dict(hidden_size=4096, intermediate_size=14336, num_experts=8, top_k=2,
                         renormalize=True),
    "olmoe-1b-7b": dict(hidden_size=2048, intermediate_size=1024, num_experts=64, top_k=8),
    "deepseek-v3": dict(hidden_size=7168, intermediate_size=2048, num_experts=256, top_k=8,
                        router="group_limited", scoring="sigmoid", correction_bias=True,
                        n_group=8, topk_group=4, routed_scaling_factor=2.5, renormalize=True,
                        shared_intermediate_size=2048),
    "glm-4.5": dict(hidden_size=5120, intermediate_size=1536, num_experts=160, top_k=8,
                    router="group_limited", scoring="sigmoid", correction_bias=True, n_group=1,
                    topk_group=1, routed_scaling_factor=2.5, renormalize=True,
                    shared_intermediate_size=1536),
    "kimi-k2": dict(hidden_size=7168, intermediate_size=2048, num_experts=384, top_k=8,
                    router="group_limited", scoring="sigmoid", correction_bias=True, n_group=1,
                    topk_group=1, routed_scaling_factor=2.827, renormalize=True,
                    shared_intermediate_size=2048),
    "qwen3-next-80b-a3b": dict(hidden_size=2048, intermediate_size=512, num_experts=512,
                               top_k=10, renormalize=True, shared_intermediate_size=512,
                               shared_expert_gate=True),
    "gpt-oss-20b": dict(num_experts=32, **_GPT_OSS),
    "gpt-oss-120b": dict(num_experts=128, **_GPT_OSS),
}


def preset(name: str, tp: int = 1, **overrides) -> MoEConfig:
    """The MoE layer of model ``name``; with tp > 1, one tensor-parallel rank's shard."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {sorted(MODELS)}")
    fields = dict(MODELS[name])
    for key in ("intermediate_size", "shared_intermediate_size"):
        if fields.get(key, 0) % tp:
            raise ValueError(f"tp={tp} does not divide {name}'s {key} ({fields[key]})")
        fields[key] = fields.get(key, 0) // tp
    fields.update(overrides)
    return MoEConfig(**fields)
