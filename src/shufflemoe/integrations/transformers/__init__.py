"""shufflemoe in HuggingFace transformers (>= 5.17): same weights, names and outputs, faster MoE.

    from shufflemoe.integrations.transformers import patch, patch_model_type
    model = AutoModelForCausalLM.from_pretrained(path)
    patch(model)                          # in place: every MoE block now runs shufflemoe.MoE

    patch_model_type("qwen3_moe")         # or before building: new models get shufflemoe blocks
    model = AutoModelForCausalLM.from_pretrained(path)

    patch_distributed(model, "ep_alltoall")  # under torchrun: MoE blocks across the ranks

    register_experts_implementation()     # or only the experts, transformers keeps routing:
    model = AutoModelForCausalLM.from_pretrained(path, experts_implementation="shufflemoe")

    with load_as_stored():                # quantized checkpoints keep their stored experts:
        model = AutoModelForCausalLM.from_pretrained(path)   # MXFP4 (gpt-oss), FP8 128 x 128
    patch(model)

Supported model types: llama4 / llama4_text, qwen3_moe, qwen2_moe, qwen3_next, mixtral, olmoe,
deepseek_v3, deepseek_v32, glm4_moe, glm4_moe_lite, dots1, gpt_oss (specs.SPECS). Routed experts
are read in the model dtype, or as transformers' FineGrainedFP8 experts (fp8_block), or as MXFP4
checkpoints store them (sources.py). Patched blocks are for inference: they run under no_grad.
state_dict keys and shapes are the HF ones; checkpoints load unchanged.
"""

from .distributed import patch_distributed
from .experts import register_experts_implementation, shufflemoe_experts_forward
from .patch import block_layer, patch, patch_model_type, unpatch, unpatch_model_type
from .quantized import Mxfp4Experts, load_as_stored
from .specs import SPECS, UNSUPPORTED, BlockSpec, spec_for, spec_for_config

__all__ = [
    "SPECS",
    "UNSUPPORTED",
    "BlockSpec",
    "Mxfp4Experts",
    "block_layer",
    "load_as_stored",
    "patch",
    "patch_distributed",
    "patch_model_type",
    "register_experts_implementation",
    "shufflemoe_experts_forward",
    "spec_for",
    "spec_for_config",
    "unpatch",
    "unpatch_model_type",
]
