"""shufflemoe in HuggingFace transformers (>= 5.17): same weights, names and outputs, faster MoE.

    from shufflemoe.integrations.transformers import patch, patch_model_type
    model = AutoModelForCausalLM.from_pretrained(path)
    patch(model)                          # in place: every MoE block now runs shufflemoe.MoE

    patch_model_type("qwen3_moe")         # or before building: new models get shufflemoe blocks
    model = AutoModelForCausalLM.from_pretrained(path)

    patch_distributed(model, "ep_alltoall")  # under torchrun: MoE blocks across the ranks

    register_experts_implementation()     # or only the experts, transformers keeps routing:
    model = AutoModelForCausalLM.from_pretrained(path, experts_implementation="shufflemoe")

Supported model types: llama4 / llama4_text, qwen3_moe, qwen2_moe, mixtral, olmoe, deepseek_v3
(specs.SPECS; gpt_oss is refused with the reason in specs.UNSUPPORTED). Patched blocks are for
inference: they run under no_grad. state_dict keys and shapes are the HF ones; checkpoints load
unchanged.
"""

from .distributed import patch_distributed
from .experts import register_experts_implementation, shufflemoe_experts_forward
from .patch import block_layer, patch, patch_model_type, unpatch, unpatch_model_type
from .specs import SPECS, UNSUPPORTED, BlockSpec, spec_for

__all__ = [
    "SPECS",
    "UNSUPPORTED",
    "BlockSpec",
    "block_layer",
    "patch",
    "patch_distributed",
    "patch_model_type",
    "register_experts_implementation",
    "shufflemoe_experts_forward",
    "spec_for",
    "unpatch",
    "unpatch_model_type",
]
