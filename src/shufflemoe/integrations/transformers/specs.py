"""One declarative entry per transformers ``model_type``: which MoE block class to patch, where its
weights live, how they map onto the canonical layout, and which router options its config sets.
patch.py walks these entries with one generic function; nothing here is code per model.

Canonical layout (shufflemoe.MoE): router [E, D], w13 [E, 2I, D] (gate rows then up rows),
w2 [E, D, I], shared w13 [2Is, D], shared w2 [D, Is], shared gate [1, D], correction bias [E].

Routing as transformers 5.17 computes it (checked against its modeling files):

| model_type  | logits   | weights of the k chosen experts                          | cast     |
| ----------- | -------- | -------------------------------------------------------- | -------- |
| llama4      | model    | sigmoid(top-k logit) in fp32, applied to the input       | to model |
| qwen3_moe   | model    | softmax in fp32, top-k, renormalize if norm_topk_prob    | to model |
| qwen2_moe   | model    | as qwen3_moe; shared expert times sigmoid(x @ gate)      | to model |
| mixtral     | model    | softmax in fp32, top-k, always renormalized              | none     |
| olmoe       | model    | as qwen3_moe                                             | to model |
| deepseek_v3 | **fp32** | sigmoid; top-k of score + bias in the top groups (group  | none     |
|             |          | = sum of its 2 best; others masked with -inf, as in      |          |
|             |          | routing.py); renormalize (+1e-20); x routed_scaling      |          |
| gpt_oss     | model    | logits + bias; top-k; softmax of the k logits, in the    | to model |
|             |          | model dtype (= softmax over E, renormalized)             |          |
| deepseek_v2 | **fp32** | softmax; top-k (topk_method "greedy"), or top-k in the   | none     |
|             |          | groups whose best score is highest ("group_limited_      |          |
|             |          | greedy"); never renormalized; x routed_scaling_factor    |          |
| minimax_m2  | model    | sigmoid in fp32; top-k of score + the block's bias;      | none     |
|             |          | renormalize (no epsilon: the sum is > 0)                 |          |
| hy_v3       | **fp32** | as minimax_m2 (+1e-20), x router_scaling_factor          | none     |
| afmoe       | model    | as hy_v3, x route_scale                                  | none     |
| laguna      | model    | as minimax_m2, x moe_routed_scaling_factor (HF scales    | to model |
|             |          | the sum; the same to one rounding)                       |          |
| granitemoe  | model    | top-k of the logits; softmax of the k in fp32            | to model |
| ernie4_5_moe| **fp32** | softmax; top-k of score + bias ([1, E]); renormalize     | to model |
|             |          | (its clamp at 1e-12 never binds: the sum is >= k / E)    |          |
| hunyuan_v1_ | **fp32** | softmax in fp32, top-k, always renormalized              | none     |
| moe         |          |                                                          |          |
| lfm2_moe    | model    | sigmoid **in the model dtype**; top-k of it + the bias   | to model |
|             |          | (fp32); renormalize (+1e-6, not 1e-20: 1e-6 / k of a     |          |
|             |          | weight, inside float32's tolerance), x routed_scaling    |          |
| cohere2_moe | model    | top-k of the logits; softmax of the k in fp32, or their  | to model |
|             |          | sigmoids, renormalized if norm_topk_prob; shared experts |          |
|             |          | summed ("sum"; "average", which halves, is refused)      |          |

ernie4_5_moe and hunyuan_v1_moe keep their router weight in float32 in a bf16 model; the layer
takes it so (MoEConfig.router_logits_dtype) and the router kernel reads it as stored.

gpt_oss's experts add biases after both projections and run a clamped GLU ((clamp(up, -7, 7) + 1)
* g * sigmoid(1.702 g), g = min(gate, 7): MoEConfig activation="swiglu_oai") on gate/up columns
that alternate (gate0, up0, gate1, ...); they are converted once to gate rows then up rows.

deepseek_v32, glm4_moe, glm4_moe_lite, dots1, glm4v_moe_text, glm_moe_dsa, solar_open,
exaone_moe, kimi_linear, mimo_v2_flash (no shared expert) and hy_v4 (its experts clamp gate and
up at swiglu_limit) route as deepseek_v3 (their routers are its code under other names and
fields). qwen3_next's block is qwen2_moe's, qwen3_5_moe_text's too (always renormalized);
qwen3_vl_moe_text's is qwen3_moe's (always renormalized), and Qwen3-Omni's thinker's
(qwen3_omni_moe_text; its talker's blocks stay transformers'); minimax's is mixtral's,
flex_olmo's olmoe's. granitemoeshared's and granitemoehybrid's shared MLP belongs to the
decoder layer and stays transformers'. A multimodal model (qwen3_vl_moe, glm4v_moe, qwen3_5_moe, qwen3_omni_moe) is
patched by its text model's entry (spec_for_config).

"logits": dtype of F.linear(x, W) ("model": the model dtype; deepseek_v3 upcasts x and W).
"cast": transformers rounds the routing weights to the model dtype before the expert GEMMs.
No renormalization has an epsilon except DeepSeek-V3's 1e-20, the same as routing.py's.

shufflemoe keeps every routing weight in float32: where transformers rounds it first, bf16
results differ by one bf16 rounding of the weight (2^-9 relative), inside the bf16 tolerance;
float32 results are identical. DeepSeek-V3's float32 logits are reproduced with
MoEConfig.router_logits_dtype: bf16 logits would move near-tied experts and so change results.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch


@dataclass(frozen=True)
class BlockSpec:
    """How one transformers MoE block becomes a shufflemoe.MoE. Paths are attribute paths inside
    the block; every tensor they name stays a parameter (or buffer) of the block under its HF name."""

    module: str  # the transformers module that defines the block class
    block: str  # the block class (its forward is what we replace)
    moe_config: Callable[[Any], dict]  # HF (text) config -> MoEConfig fields, all but dtype
    router: str = "gate.weight"  # [E, D]
    w13: str = "experts.gate_up_proj"  # [E, 2I, D], or [E, D, 2I] when transposed
    w2: str = "experts.down_proj"  # [E, D, I], or [E, I, D] when transposed
    # Llama 4 stores experts as x @ W ([E, D, 2I] / [E, I, D]). They are converted once per layer
    # and the HF parameter becomes a transposed view of the canonical tensor: same name, same
    # shape, no second copy.
    transposed: bool = False
    # (gate, up, down) weights of the shared expert MLP: [Is, D], [Is, D], [D, Is]. gate and up
    # are stored as two rows of one [2Is, D] tensor; each HF parameter becomes a view of its rows.
    shared: tuple[str, str, str] | None = None
    shared_gate: str | None = None  # [1, D] (Qwen2-MoE)
    correction_bias: str | None = None  # [E] (DeepSeek-V3 e_score_correction_bias)
    # The router submodule: called only while transformers records router logits (its forward
    # hook captures them), since shufflemoe routes without it.
    router_module: str = "gate"
    # What the block returns: "out" [B, S, D]; "out_and_logits" (Llama 4: (out [T, D], router
    # logits [T, E] or None)); "out_and_scores" (gpt-oss: (out [B, S, D], router scores [T, k] or
    # None; its decoder layer drops them)).
    returns: str = "out"
    experts: str = "experts"  # the routed experts' submodule (quantized holders are read there)
    # gate/up columns alternate (gpt-oss: gate0, up0, gate1, ...). Converted once to gate rows
    # then up rows; that permutation cannot be a view, so the HF parameter keeps its own tensor.
    interleaved: bool = False
    w13_bias: str | None = None  # [E, 2I] (gpt-oss gate_up_proj_bias; interleaved like w13)
    w2_bias: str | None = None  # [E, D]
    router_bias: str | None = None  # [E] added to the router logits (gpt-oss)
    # Block tensors the HF router's forward takes after x (MiniMax-M2, HY-V3: the correction
    # bias, held by the block); called only while router logits are recorded.
    router_args: tuple[str, ...] = ()
    router_3d: bool = False  # the HF router's forward takes x as [1, T, D] (AFMoE)


def _topk_softmax(num_experts: str, intermediate: str, renormalize: str | None) -> Callable:
    """Config reader for the top-k softmax routers (Qwen, OLMoE, Mixtral)."""

    def read(c) -> dict:
        return dict(num_experts=getattr(c, num_experts), top_k=c.num_experts_per_tok,
                    intermediate_size=getattr(c, intermediate),
                    renormalize=True if renormalize is None else bool(getattr(c, renormalize)))

    return read


def _qwen2_moe(c) -> dict:
    return dict(_qwen2_moe_sizes(c), renormalize=bool(c.norm_topk_prob))


def _qwen2_moe_sizes(c) -> dict:
    return dict(_topk_softmax("num_experts", "moe_intermediate_size", None)(c),
                shared_intermediate_size=c.shared_expert_intermediate_size, shared_expert_gate=True)


def _llama4(c) -> dict:
    return dict(num_experts=c.num_local_experts, top_k=c.num_experts_per_tok,
                intermediate_size=c.intermediate_size, shared_intermediate_size=c.intermediate_size,
                router="llama4", scoring="sigmoid", apply_router_weight_on_input=True)


def _grouped(c, *, num_experts: int, shared: int, n_group: int = 1, topk_group: int = 1,
             renormalize: bool = True, scaling: float = 1.0,
             logits: torch.dtype | None = torch.float32, scoring: str = "sigmoid",
             correction_bias: bool = True, intermediate: int | None = None, **fields) -> dict:
    """MoEConfig fields of a group-limited router (DeepSeek-V3's and its relatives'; n_group 1:
    a plain top-k of scores + bias). logits: the dtype transformers computes them in (None: the
    model's)."""
    return dict(dict(num_experts=num_experts, top_k=c.num_experts_per_tok,
                     intermediate_size=intermediate or c.moe_intermediate_size,
                     shared_intermediate_size=shared,
                     router="group_limited", scoring=scoring, correction_bias=correction_bias,
                     n_group=n_group, topk_group=topk_group, routed_scaling_factor=float(scaling),
                     renormalize=bool(renormalize), router_logits_dtype=logits), **fields)


def _deepseek_v3(c) -> dict:  # F.linear(x.float(), W.float()) in HF
    return _grouped(c, num_experts=c.n_routed_experts,
                    shared=c.moe_intermediate_size * (c.n_shared_experts or 0), n_group=c.n_group,
                    topk_group=c.topk_group, renormalize=c.norm_topk_prob,
                    scaling=c.routed_scaling_factor)


def _exaone_moe(c) -> dict:
    return _grouped(c, num_experts=c.num_experts,
                    shared=c.moe_intermediate_size * (c.num_shared_experts or 0),
                    n_group=c.n_group, topk_group=c.topk_group, renormalize=c.norm_topk_prob,
                    scaling=c.routed_scaling_factor)


def _kimi_linear(c) -> dict:
    return _grouped(c, num_experts=c.num_experts,
                    shared=c.moe_intermediate_size * (c.num_shared_experts or 0),
                    n_group=c.num_expert_group, topk_group=c.topk_group,
                    renormalize=c.moe_renormalize, scaling=c.routed_scaling_factor)


def _mimo_v2_flash(c) -> dict:  # no shared expert
    return _grouped(c, num_experts=c.n_routed_experts, shared=0, n_group=c.n_group,
                    topk_group=c.topk_group, renormalize=c.norm_topk_prob,
                    scaling=c.routed_scaling_factor)


def _hy_v4(c) -> dict:  # DeepSeek-V3's block; its experts clamp gate and up (silu_mul's limit)
    return dict(_deepseek_v3(c), swiglu_limit=float(c.swiglu_limit))


def _hy_v3(c) -> dict:  # no groups; the correction bias on the block
    return _grouped(c, num_experts=c.num_experts,
                    shared=c.moe_intermediate_size * (c.num_shared_experts or 0),
                    scaling=c.router_scaling_factor)


def _afmoe(c) -> dict:  # model-dtype logits, no groups, the bias on the block
    return _grouped(c, num_experts=c.num_experts,
                    shared=c.moe_intermediate_size * (c.num_shared_experts or 0),
                    scaling=c.route_scale, logits=None)


def _minimax_m2(c) -> dict:  # logits in the model dtype, no groups, no shared expert
    return _grouped(c, num_experts=c.num_local_experts, shared=0, logits=None,
                    intermediate=c.intermediate_size)


def _laguna(c) -> dict:
    if getattr(c, "moe_router_logit_softcapping", 0.0):
        raise ValueError(f"moe_router_logit_softcapping={c.moe_router_logit_softcapping} (a "
                         "tanh cap on the router logits) is not supported")
    return _grouped(c, num_experts=c.num_experts, shared=c.shared_expert_intermediate_size,
                    scaling=c.moe_routed_scaling_factor, logits=None)


def _lfm2_moe(c) -> dict:  # sigmoid in the model dtype, then + the bias (fp32), no groups
    if not c.use_expert_bias:
        raise ValueError("use_expert_bias=False is not supported; LFM2-MoE's checkpoints use "
                         "the bias")
    return _grouped(c, num_experts=c.num_experts, shared=0, logits=None,
                    renormalize=c.norm_topk_prob, scaling=c.routed_scaling_factor,
                    round_scores=True)


def _deepseek_v2(c) -> dict:
    # softmax of float32 logits, never renormalized (norm_topk_prob is not read), scaled
    shared = c.moe_intermediate_size * (c.n_shared_experts or 0)
    if c.topk_method == "group_limited_greedy":  # DeepSeek-V2 / V2.5: groups by their best
        return _grouped(c, num_experts=c.n_routed_experts, shared=shared, n_group=c.n_group,
                        topk_group=c.topk_group, renormalize=False,
                        scaling=c.routed_scaling_factor, scoring="softmax",
                        correction_bias=False, group_score="max")
    if c.topk_method != "greedy":
        raise ValueError(f"topk_method={c.topk_method!r} is not supported; 'greedy' "
                         "(DeepSeek-V2-Lite) and 'group_limited_greedy' (DeepSeek-V2) are")
    return dict(num_experts=c.n_routed_experts, top_k=c.num_experts_per_tok,
                intermediate_size=c.moe_intermediate_size, shared_intermediate_size=shared,
                renormalize=False, routed_scaling_factor=float(c.routed_scaling_factor),
                router_logits_dtype=torch.float32)


def _ernie4_5_moe(c) -> dict:  # softmax scores + the bias, float32 logits and router weight
    if c.use_bias:
        raise ValueError("use_bias=True (biases in the shared expert's projections) is not "
                         "supported")
    return _grouped(c, num_experts=c.moe_num_experts,
                    shared=c.moe_intermediate_size * (c.moe_num_shared_experts or 0),
                    scoring="softmax")


def _hunyuan_v1_moe(c) -> dict:  # float32 logits (its router weight is float32)
    E, k = c.num_experts, c.moe_topk
    for name, value in (("num_experts", E), ("moe_topk", k)):
        if isinstance(value, (list, tuple)) and len(set(value)) > 1:
            raise ValueError(f"{name}={value} (a value per layer) is not supported")
    E, k = (v[0] if isinstance(v, (list, tuple)) else v for v in (E, k))
    return dict(num_experts=E, top_k=k, intermediate_size=c.intermediate_size,
                shared_intermediate_size=c.intermediate_size, renormalize=True,
                router_logits_dtype=torch.float32)


def _qwen3_5_moe(c) -> dict:  # Qwen2-MoE's block, always renormalized
    return dict(_qwen2_moe_sizes(c), renormalize=True)


def _cohere2_moe(c) -> dict:
    # top-k of the logits; softmax of the k (= over E, renormalized) or their sigmoids,
    # renormalized if norm_topk_prob; rounded to the model dtype
    if c.num_shared_experts and c.shared_expert_combination_strategy != "sum":
        raise ValueError(f"shared_expert_combination_strategy="
                         f"{c.shared_expert_combination_strategy!r} with shared experts (their "
                         "sum with the routed output halved) is not supported; 'sum' is")
    softmax = c.expert_selection_fn == "softmax"
    return dict(num_experts=c.num_experts, top_k=c.num_experts_per_tok,
                intermediate_size=c.intermediate_size,
                shared_intermediate_size=c.intermediate_size * c.num_shared_experts,
                scoring=c.expert_selection_fn, renormalize=softmax or bool(c.norm_topk_prob))


def _gpt_oss(c) -> dict:
    # GptOssExperts fixes alpha = 1.702 and limit = 7.0 (the MXFP4 experts read swiglu_limit)
    return dict(num_experts=c.num_local_experts, top_k=c.num_experts_per_tok,
                intermediate_size=c.intermediate_size, renormalize=True, router_logits_bias=True,
                expert_bias=True, activation="swiglu_oai", swiglu_alpha=1.702,
                swiglu_limit=float(getattr(c, "swiglu_limit", 7.0)))


_MLP = ("gate_proj.weight", "up_proj.weight", "down_proj.weight")


def _mlp(prefix: str) -> tuple[str, str, str]:
    return tuple(f"{prefix}.{name}" for name in _MLP)


def _models(module: str, block: str, moe_config: Callable, **fields) -> BlockSpec:
    """The BlockSpec of ``block`` in transformers.models.<module>.modeling_<module>."""
    return BlockSpec(module=f"transformers.models.{module}.modeling_{module}", block=block,
                     moe_config=moe_config, **fields)


_LLAMA4 = _models("llama4", "Llama4TextMoe", _llama4, router="router.weight", transposed=True,
                  shared=_mlp("shared_expert"), router_module="router", returns="out_and_logits")

SPECS: dict[str, BlockSpec] = {
    "llama4": _LLAMA4,  # the multimodal model: its text model holds the MoE blocks
    "llama4_text": _LLAMA4,
    "qwen3_moe": _models("qwen3_moe", "Qwen3MoeSparseMoeBlock",
                         _topk_softmax("num_experts", "moe_intermediate_size", "norm_topk_prob")),
    "qwen2_moe": _models("qwen2_moe", "Qwen2MoeSparseMoeBlock", _qwen2_moe,
                         shared=_mlp("shared_expert"), shared_gate="shared_expert_gate.weight"),
    "mixtral": _models("mixtral", "MixtralSparseMoeBlock",
                       _topk_softmax("num_local_experts", "intermediate_size", None)),
    "olmoe": _models("olmoe", "OlmoeSparseMoeBlock",
                     _topk_softmax("num_experts", "intermediate_size", "norm_topk_prob")),
    # DeepSeek-V3's block and router, also under other class names (the same config fields:
    # n_routed_experts, n_group, ...): DeepSeek-V3.2, GLM-4.5 / 4.6, GLM-4.7-Flash, dots.llm1,
    # GLM-4.5V's text model, GLM-5, Solar Open
    **{model_type: _models(module, block, _deepseek_v3, shared=_mlp("shared_experts"),
                           correction_bias="gate.e_score_correction_bias")
       for model_type, module, block in (
           ("deepseek_v3", "deepseek_v3", "DeepseekV3MoE"),
           ("deepseek_v32", "deepseek_v32", "DeepseekV32MoE"),
           ("glm4_moe", "glm4_moe", "Glm4MoeMoE"),
           ("glm4_moe_lite", "glm4_moe_lite", "Glm4MoeLiteMoE"),
           ("dots1", "dots1", "Dots1MoE"),
           ("glm4v_moe_text", "glm4v_moe", "Glm4vMoeTextMoE"),
           ("glm_moe_dsa", "glm_moe_dsa", "GlmMoeDsaMoE"),
           ("solar_open", "solar_open", "SolarOpenMoE"))},
    # ... and with their own field names, limits or no shared expert
    **{model_type: _models(model_type, block, read,
                           shared=_mlp("shared_experts") if shared else None,
                           correction_bias="gate.e_score_correction_bias")
       for model_type, block, read, shared in (
           ("exaone_moe", "ExaoneMoeSparseMoEBlock", _exaone_moe, True),
           ("kimi_linear", "KimiLinearMoE", _kimi_linear, True),
           ("hy_v4", "HYV4MoE", _hy_v4, True),
           ("mimo_v2_flash", "MiMoV2FlashMoE", _mimo_v2_flash, False))},
    # one group (a top-k of sigmoid + bias), the bias held by the block
    "hy_v3": _models("hy_v3", "HYV3MoE", _hy_v3, shared=_mlp("shared_experts"),
                     correction_bias="e_score_correction_bias",
                     router_args=("e_score_correction_bias",)),
    "minimax_m2": _models("minimax_m2", "MiniMaxM2SparseMoeBlock", _minimax_m2,
                          correction_bias="e_score_correction_bias",
                          router_args=("e_score_correction_bias",)),
    "afmoe": _models("afmoe", "AfmoeSparseMoeBlock", _afmoe, router="router.gate.weight",
                     router_module="router", shared=_mlp("shared_experts"),
                     correction_bias="expert_bias", router_args=("expert_bias",), router_3d=True),
    "laguna": _models("laguna", "LagunaSparseMoeBlock", _laguna, shared=_mlp("shared_experts"),
                      correction_bias="gate.e_score_correction_bias"),
    # rounded scores: the sigmoid in the model dtype (LFM2-MoE)
    "lfm2_moe": _models("lfm2_moe", "Lfm2MoeSparseMoeBlock", _lfm2_moe,
                        correction_bias="expert_bias", router_args=("expert_bias",)),
    "deepseek_v2": _models("deepseek_v2", "DeepseekV2Moe", _deepseek_v2,
                           shared=_mlp("shared_experts")),
    # a float32 router weight in a bf16 model
    "ernie4_5_moe": _models("ernie4_5_moe", "Ernie4_5_MoeSparseMoeBlock", _ernie4_5_moe,
                            shared=_mlp("shared_experts"),
                            correction_bias="gate.moe_statics.e_score_correction_bias"),
    "hunyuan_v1_moe": _models("hunyuan_v1_moe", "HunYuanMoEV1Moe", _hunyuan_v1_moe,
                              router="gate.wg.weight", shared=_mlp("shared_mlp")),
    # Qwen2-MoE's block (a gated shared expert) in a hybrid model
    "qwen3_next": _models("qwen3_next", "Qwen3NextSparseMoeBlock", _qwen2_moe,
                          shared=_mlp("shared_expert"), shared_gate="shared_expert_gate.weight"),
    "qwen3_5_moe_text": _models("qwen3_5_moe", "Qwen3_5MoeSparseMoeBlock", _qwen3_5_moe,
                                shared=_mlp("shared_expert"),
                                shared_gate="shared_expert_gate.weight"),
    "qwen3_vl_moe_text": _models("qwen3_vl_moe", "Qwen3VLMoeTextSparseMoeBlock",  # renormalized
                                 _topk_softmax("num_experts", "moe_intermediate_size", None)),
    # Qwen3-Omni's thinker (the talker's Qwen2-MoE-like blocks are left as they are)
    "qwen3_omni_moe_text": _models("qwen3_omni_moe", "Qwen3OmniMoeThinkerTextSparseMoeBlock",
                                   _topk_softmax("num_experts", "moe_intermediate_size",
                                                 "norm_topk_prob")),
    "minimax": _models("minimax", "MiniMaxSparseMoeBlock",
                       _topk_softmax("num_local_experts", "intermediate_size", None)),
    "flex_olmo": _models("flex_olmo", "FlexOlmoSparseMoeBlock",
                         _topk_softmax("num_experts", "intermediate_size", "norm_topk_prob")),
    # top-k of the logits, softmax over the k (= over E, renormalized); Granite's shared MLP
    # (granitemoeshared, granitemoehybrid) is the decoder layer's, not the block's
    **{model_type: _models(model_type, block,
                           _topk_softmax("num_local_experts", "intermediate_size", None),
                           router="router.weight", router_module="router")
       for model_type, block in (("granitemoe", "GraniteMoeMoE"),
                                 ("granitemoeshared", "GraniteMoeSharedMoE"),
                                 ("granitemoehybrid", "GraniteMoeHybridMoE"))},
    "cohere2_moe": _models("cohere2_moe", "Cohere2MoeSparseMoeBlock", _cohere2_moe,
                           shared=_mlp("shared_experts")),
    "gpt_oss": _models("gpt_oss", "GptOssMLP", _gpt_oss, router="router.weight",
                       router_bias="router.bias", transposed=True, interleaved=True,
                       w13_bias="experts.gate_up_proj_bias", w2_bias="experts.down_proj_bias",
                       router_module="router", returns="out_and_scores"),
}

# Model types that have MoE blocks shufflemoe cannot run without changing its core, and why.
UNSUPPORTED: dict[str, str] = {
    "mistral4": "its router takes the softmax of the logits in the model dtype, so bfloat16 "
                "scores choose its groups and experts; shufflemoe's float32 scores choose others "
                "where bfloat16 ties them (a tiny bfloat16 model: 9-13% relative L2 error in a "
                "block's output)",
}


def spec_for_config(config: Any) -> BlockSpec:
    """The BlockSpec of a model with transformers config ``config``: its model_type's, else (a
    multimodal wrapper: Qwen3-VL-MoE, GLM-4.5V, Qwen3.5) its decoder text config's; raises
    ValueError naming what is missing."""
    outer, text = config.model_type, config.get_text_config(decoder=True).model_type
    if outer in SPECS or outer in UNSUPPORTED or text == outer:
        return spec_for(outer)
    try:
        return spec_for(text)
    except ValueError as e:
        raise ValueError(f"{e} (the text model of a {outer!r} model)") from None


def spec_for(model_type: str) -> BlockSpec:
    """The BlockSpec of ``model_type``; raises ValueError naming what is missing."""
    if model_type in SPECS:
        return SPECS[model_type]
    if model_type in UNSUPPORTED:
        raise ValueError(f"shufflemoe cannot patch model_type {model_type!r}: {UNSUPPORTED[model_type]}")
    raise ValueError(f"shufflemoe has no transformers mapping for model_type {model_type!r}; "
                     f"supported: {sorted(SPECS)}")
