"""Random transformers models for the tests, the demo and the end-to-end benchmark: tiny configs
per supported model_type (CPU, seconds), and a builder that initialises on the target device in
the target dtype (real widths on a GPU without a slow CPU init)."""

from __future__ import annotations

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

# Shared by every tiny model: 64 wide, 4 heads of 16, 2 KV heads, 128-token vocabulary.
_COMMON = dict(vocab_size=128, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
               head_dim=16, max_position_embeddings=256, num_hidden_layers=2,
               bos_token_id=0, eos_token_id=1, pad_token_id=None, tie_word_embeddings=False)

# Per model_type: the MoE fields of a tiny model with the model's real routing options
# (odd expert widths on purpose; 8 experts so that top-2 leaves most of them unchosen).
TINY: dict[str, dict] = {
    "llama4_text": dict(intermediate_size=48, intermediate_size_mlp=96, num_local_experts=4,
                        num_experts_per_tok=1, interleave_moe_layer_step=1,
                        attention_chunk_size=64),
    "qwen3_moe": dict(moe_intermediate_size=40, intermediate_size=96, num_experts=8,
                      num_experts_per_tok=2, norm_topk_prob=True),
    "qwen2_moe": dict(moe_intermediate_size=40, intermediate_size=96, num_experts=8,
                      num_experts_per_tok=2, shared_expert_intermediate_size=72,
                      norm_topk_prob=False),
    "mixtral": dict(intermediate_size=40, num_local_experts=8, num_experts_per_tok=2),
    "olmoe": dict(intermediate_size=40, num_experts=8, num_experts_per_tok=2,
                  norm_topk_prob=False),
    # Layer 0 is dense (first_k_dense_replace=1), so three layers give two MoE blocks.
    "deepseek_v3": dict(moe_intermediate_size=40, intermediate_size=96, n_routed_experts=8,
                        num_experts_per_tok=2, n_group=4, topk_group=2, n_shared_experts=1,
                        routed_scaling_factor=2.5, norm_topk_prob=True, first_k_dense_replace=1,
                        num_hidden_layers=3, q_lora_rank=None, kv_lora_rank=16,
                        qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, head_dim=8,
                        num_key_value_heads=4),
    # DeepSeek-V3's block under other names: one group (GLM-4.5's real setting) or four, a
    # dense layer first
    "glm4_moe": dict(moe_intermediate_size=40, intermediate_size=96, n_routed_experts=8,
                     num_experts_per_tok=2, n_group=1, topk_group=1, n_shared_experts=1,
                     routed_scaling_factor=2.5, norm_topk_prob=True, first_k_dense_replace=1,
                     num_hidden_layers=3, use_qk_norm=True),
    "glm4_moe_lite": dict(moe_intermediate_size=40, intermediate_size=96, n_routed_experts=8,
                          num_experts_per_tok=2, n_group=1, topk_group=1, n_shared_experts=1,
                          routed_scaling_factor=1.8, norm_topk_prob=True, num_hidden_layers=3,
                          q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=8,
                          qk_nope_head_dim=8, v_head_dim=16, num_key_value_heads=4),
    "deepseek_v32": dict(moe_intermediate_size=40, intermediate_size=96, n_routed_experts=8,
                         num_experts_per_tok=2, n_group=4, topk_group=2, n_shared_experts=1,
                         routed_scaling_factor=2.5, norm_topk_prob=True, first_k_dense_replace=1,
                         num_hidden_layers=3, q_lora_rank=32, kv_lora_rank=16,
                         qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, head_dim=8,
                         num_key_value_heads=4, index_topk=8, index_head_dim=16,
                         index_n_heads=2),
    # Qwen3-Next: linear-attention layers (torch's fallback on the CPU) and one full one
    "qwen3_next": dict(moe_intermediate_size=40, intermediate_size=96, num_experts=8,
                       num_experts_per_tok=2, shared_expert_intermediate_size=72,
                       norm_topk_prob=True, num_hidden_layers=2,
                       layer_types=["linear_attention", "full_attention"],
                       linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
                       linear_num_value_heads=4),
    "dots1": dict(moe_intermediate_size=40, intermediate_size=96, n_routed_experts=8,
                  num_experts_per_tok=2, n_group=4, topk_group=2, n_shared_experts=2,
                  routed_scaling_factor=2.5, norm_topk_prob=True, first_k_dense_replace=1,
                  num_hidden_layers=3),
    # YaRN's original context set so that its factor (32) matches 256 positions; I = 64 so that
    # the same model can be stored in MXFP4 (K a multiple of 32 in both expert GEMMs).
    "gpt_oss": dict(intermediate_size=64, num_local_experts=8, num_experts_per_tok=2,
                    rope_parameters=dict(rope_type="yarn", factor=32.0, beta_fast=32.0,
                                         beta_slow=1.0, truncate=False, rope_theta=150000.0,
                                         original_max_position_embeddings=8)),
}


def tiny_config(model_type: str, **overrides) -> PretrainedConfig:
    """A tiny config of ``model_type`` (a key of TINY); ``overrides`` replace any field."""
    if model_type not in TINY:
        raise ValueError(f"no tiny config for model_type {model_type!r}; choose one of {sorted(TINY)}")
    return AutoConfig.for_model(model_type, **{**_COMMON, **TINY[model_type], **overrides})


def build_model(config: PretrainedConfig, dtype: torch.dtype = torch.float32,
                device: torch.device | str = "cpu", seed: int = 0,
                experts_implementation: str | None = None) -> PreTrainedModel:
    """A causal LM of ``config`` with random weights, created on ``device`` in ``dtype``
    (transformers' own init: std initializer_range), in eval mode."""
    torch.manual_seed(seed)
    kwargs = {} if experts_implementation is None else dict(experts_implementation=experts_implementation)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, **kwargs)
    _random_biases(model, config.initializer_range)
    return model.eval()


@torch.no_grad()
def _random_biases(model: PreTrainedModel, std: float) -> None:
    """transformers starts MoE biases at zero (gpt-oss's expert and router biases); random values
    of 5x the weights' std make them count in the parity checks, as trained ones do."""
    for name, p in model.named_parameters():
        if ".mlp." in name and "bias" in name and p.is_floating_point() and not p.any():
            p.normal_(0.0, 5 * std)
