"""Random transformers models for the tests, the demo and the end-to-end benchmark: tiny configs
per supported model_type (CPU, seconds), and a builder that initialises on the target device in
the target dtype (real widths on a GPU without a slow CPU init)."""

from __future__ import annotations

import itertools

import torch
from transformers import (AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText,
                          PretrainedConfig, PreTrainedModel)

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
    # Qwen3.5: Qwen3-Next's MoE block (always renormalized) in the same hybrid layers
    "qwen3_5_moe_text": dict(moe_intermediate_size=40, intermediate_size=96, num_experts=8,
                             num_experts_per_tok=2, shared_expert_intermediate_size=72,
                             layer_types=["linear_attention", "full_attention"],
                             linear_key_head_dim=16, linear_value_head_dim=16,
                             linear_num_key_heads=2, linear_num_value_heads=4),
    "minimax": dict(intermediate_size=40, num_local_experts=8, num_experts_per_tok=2,
                    layer_types=["full_attention", "linear_attention"]),
    "flex_olmo": dict(intermediate_size=40, num_experts=8, num_experts_per_tok=2,
                      norm_topk_prob=False, pad_token_id=None, eos_token_id=None),
    "granitemoe": dict(intermediate_size=40, num_local_experts=8, num_experts_per_tok=2),
    "granitemoeshared": dict(intermediate_size=40, num_local_experts=8, num_experts_per_tok=2,
                             shared_intermediate_size=48),
    "granitemoehybrid": dict(intermediate_size=40, num_local_experts=8, num_experts_per_tok=2,
                             shared_intermediate_size=48, layer_types=["mamba", "attention"],
                             mamba_n_heads=4, mamba_d_head=32, mamba_d_state=16,
                             mamba_n_groups=1, mamba_chunk_size=16),
    # DeepSeek-V3's block: one group and a shared expert (Solar Open), MLA and an indexer
    # (GLM-5), hybrid linear attention (Kimi Linear), clamped experts (HY-V4), no shared expert
    # (MiMo-V2-Flash)
    "solar_open": dict(moe_intermediate_size=40, n_routed_experts=8, num_experts_per_tok=2,
                       n_shared_experts=1, n_group=1, topk_group=1, routed_scaling_factor=2.5,
                       norm_topk_prob=True),
    # (GLM-5's indexer keeps 32 keys, so every one of these 12-token prompts: a bf16 rounding of
    # an MoE output would otherwise move its choice of keys, changing the logits well past
    # the bf16 table)
    "glm_moe_dsa": dict(moe_intermediate_size=40, intermediate_size=96, n_routed_experts=8,
                        num_experts_per_tok=2, n_group=4, topk_group=2, n_shared_experts=1,
                        routed_scaling_factor=2.5, norm_topk_prob=True, first_k_dense_replace=1,
                        num_hidden_layers=3, q_lora_rank=32, kv_lora_rank=16,
                        qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, head_dim=8,
                        num_key_value_heads=4, index_topk=32, index_head_dim=16, index_n_heads=2),
    "exaone_moe": dict(moe_intermediate_size=40, intermediate_size=96, num_experts=8,
                       num_experts_per_tok=2, n_group=4, topk_group=2, num_shared_experts=1,
                       routed_scaling_factor=2.5, norm_topk_prob=True, first_k_dense_replace=1,
                       num_hidden_layers=3),
    "kimi_linear": dict(moe_intermediate_size=40, intermediate_size=96, num_experts=8,
                        num_experts_per_token=2, num_shared_experts=1, num_expert_group=4,
                        topk_group=2, routed_scaling_factor=2.5, moe_renormalize=True,
                        first_k_dense_replace=0, q_lora_rank=None, kv_lora_rank=16,
                        qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
                        num_key_value_heads=4, bos_token_id=2,
                        linear_attn_config=dict(head_dim=16, num_heads=4, short_conv_kernel_size=4,
                                                full_attn_layers=[2], kda_layers=[1])),
    "hy_v4": dict(moe_intermediate_size=40, intermediate_size=96, n_routed_experts=8,
                  num_experts_per_tok=2, n_group=4, topk_group=2, n_shared_experts=1,
                  routed_scaling_factor=2.5, norm_topk_prob=True, swiglu_limit=0.05,
                  mlp_layer_types=["dense", "sparse", "sparse"], num_hidden_layers=3,
                  pad_token_id=None),
    "mimo_v2_flash": dict(moe_intermediate_size=40, intermediate_size=96, n_routed_experts=8,
                          num_experts_per_tok=2, n_group=4, topk_group=2,
                          routed_scaling_factor=2.5, norm_topk_prob=True, v_head_dim=16,
                          mlp_layer_types=["dense", "sparse", "sparse"], num_hidden_layers=3),
    # DeepSeek-V2-Lite: softmax of float32 logits, never renormalized, scaled
    "deepseek_v2": dict(moe_intermediate_size=40, intermediate_size=96, n_routed_experts=8,
                        num_experts_per_tok=2, n_shared_experts=1, routed_scaling_factor=2.5,
                        topk_method="greedy", first_k_dense_replace=1, num_hidden_layers=3,
                        q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=8,
                        qk_nope_head_dim=8, v_head_dim=16, num_key_value_heads=4),
    # a float32 router weight in a bf16 model (ERNIE 4.5: softmax scores + a [1, E] bias;
    # Hunyuan-A13B: a plain top-k softmax beside an ungated shared expert)
    "ernie4_5_moe": dict(moe_intermediate_size=40, intermediate_size=96, moe_num_experts=8,
                         moe_k=2, moe_num_shared_experts=1, moe_layer_start_index=0),
    "hunyuan_v1_moe": dict(intermediate_size=40, num_experts=8, moe_topk=2),
    # LFM2-MoE: rounded sigmoid scores + a bias, short-convolution and attention layers
    "lfm2_moe": dict(moe_intermediate_size=40, intermediate_size=96, num_experts=8,
                     num_experts_per_tok=2, num_dense_layers=1, num_hidden_layers=3,
                     layer_types=["conv", "full_attention", "conv"], num_key_value_heads=4),
    # Cohere2-MoE: a top-k of the logits (softmax of the k, or sigmoids), a dense first layer
    "cohere2_moe": dict(intermediate_size=40, num_experts=8, num_experts_per_tok=2,
                        prefix_dense_intermediate_size=96, first_k_dense_replace=1,
                        num_hidden_layers=3, num_key_value_heads=4),
    # one group, the bias on the block: MiniMax-M2 (no shared expert), HY-V3, AFMoE, Laguna
    "afmoe": dict(moe_intermediate_size=40, intermediate_size=96, num_experts=8,
                  num_experts_per_tok=2, num_shared_experts=1, route_scale=2.5,
                  num_dense_layers=1, num_hidden_layers=3),
    "minimax_m2": dict(intermediate_size=40, num_local_experts=8, num_experts_per_tok=2),
    "hy_v3": dict(moe_intermediate_size=40, intermediate_size=96, num_experts=8,
                  num_experts_per_tok=2, num_shared_experts=1, router_scaling_factor=2.5,
                  mlp_layer_types=["dense", "sparse", "sparse"], num_hidden_layers=3),
    "laguna": dict(moe_intermediate_size=40, intermediate_size=96, num_experts=8,
                   num_experts_per_tok=2, shared_expert_intermediate_size=48,
                   moe_routed_scaling_factor=2.5, mlp_layer_types=["dense", "sparse", "sparse"],
                   num_hidden_layers=3),
    # Vision-language models: the MoE fields go to text_config (as _COMMON's), the rest stays
    "qwen3_vl_moe": dict(text_config=dict(moe_intermediate_size=40, intermediate_size=96,
                                          num_experts=8, num_experts_per_tok=2),
                         vision_config=dict(depth=1, hidden_size=32, intermediate_size=32,
                                            num_heads=2, out_hidden_size=64,
                                            deepstack_visual_indexes=[0])),
    "qwen3_omni_moe_thinker": dict(
        text_config=dict(moe_intermediate_size=40, intermediate_size=96, num_experts=8,
                         num_experts_per_tok=2, norm_topk_prob=True),
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=32, num_heads=2,
                           out_hidden_size=64, deepstack_visual_indexes=[0]),
        audio_config=dict(d_model=32, encoder_layers=1, encoder_attention_heads=2,
                          encoder_ffn_dim=32, output_dim=64, num_mel_bins=16,
                          downsample_hidden_size=16),
        vision_start_token_id=151652),  # (read by generate, not set by the thinker's config)
    "glm4v_moe": dict(text_config=dict(moe_intermediate_size=40, intermediate_size=96,
                                       n_routed_experts=8, num_experts_per_tok=2, n_group=4,
                                       topk_group=2, n_shared_experts=1, routed_scaling_factor=2.5,
                                       norm_topk_prob=True, first_k_dense_replace=1,
                                       num_hidden_layers=3, pad_token_id=0,
                                       rope_parameters=dict(rope_type="default", rope_theta=1e4,
                                                            mrope_section=[1, 1, 2],
                                                            partial_rotary_factor=0.5)),
                      vision_config=dict(depth=1, hidden_size=32, num_heads=2,
                                         intermediate_size=64, out_hidden_size=64),
                      image_token_id=120, video_token_id=121, image_start_token_id=122,
                      image_end_token_id=123, video_start_token_id=124, video_end_token_id=125),
    # YaRN's original context set so that its factor (32) matches 256 positions; I = 64 so that
    # the same model can be stored in MXFP4 (K a multiple of 32 in both expert GEMMs).
    "gpt_oss": dict(intermediate_size=64, num_local_experts=8, num_experts_per_tok=2,
                    rope_parameters=dict(rope_type="yarn", factor=32.0, beta_fast=32.0,
                                         beta_slow=1.0, truncate=False, rope_theta=150000.0,
                                         original_max_position_embeddings=8)),
}


def tiny_config(model_type: str, **overrides) -> PretrainedConfig:
    """A tiny config of ``model_type`` (a key of TINY); ``overrides`` replace any field (of a
    multimodal model's text model: where its MoE fields are)."""
    if model_type not in TINY:
        raise ValueError(f"no tiny config for model_type {model_type!r}; choose one of {sorted(TINY)}")
    fields = TINY[model_type]
    if "text_config" in fields:  # a multimodal model: its text model is the tiny one
        return AutoConfig.for_model(model_type, **{
            **fields, "text_config": {**_COMMON, **fields["text_config"], **overrides}})
    return AutoConfig.for_model(model_type, **{**_COMMON, **fields, **overrides})


def build_model(config: PretrainedConfig, dtype: torch.dtype = torch.float32,
                device: torch.device | str = "cpu", seed: int = 0,
                experts_implementation: str | None = None) -> PreTrainedModel:
    """A causal LM of ``config`` with random weights, created on ``device`` in ``dtype``
    (transformers' own init: std initializer_range), in eval mode."""
    torch.manual_seed(seed)
    kwargs = {} if experts_implementation is None else dict(experts_implementation=experts_implementation)
    # vision-language models are not AutoModelForCausalLM's: their image-text class is a causal
    # LM of text too
    auto = (AutoModelForCausalLM if type(config) in AutoModelForCausalLM._model_mapping
            else AutoModelForImageTextToText)
    with torch.device(device):
        model = auto.from_config(config, dtype=dtype, **kwargs)
    _random_biases(model, config.get_text_config(decoder=True).initializer_range)
    return model.eval()


@torch.no_grad()
def _random_biases(model: PreTrainedModel, std: float) -> None:
    """transformers starts MoE biases at zero (gpt-oss's expert and router biases, the correction
    biases); random values of 5x the weights' std make them count in the parity checks, as
    trained ones do; most correction biases are buffers (DeepSeek-V3's, LFM2-MoE's). ERNIE 4.5
    starts its router weight at zero too (every expert tied): it gets the weights' std."""
    for name, p in itertools.chain(model.named_parameters(), model.named_buffers()):
        if ((".mlp." in name or ".feed_forward." in name) and p.is_floating_point()
                and not p.any()):
            if "bias" in name:
                p.normal_(0.0, 5 * std)
            elif name.endswith("gate.weight"):
                p.normal_(0.0, std)
