"""Quantized checkpoints loaded as they are stored, for patched blocks: no bf16 copy of the experts.

    with load_as_stored():                      # MXFP4 (gpt-oss), FineGrainedFP8 128 x 128
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    patch(model)                                # the experts run from the stored tensors

transformers 5.17 holds neither as stored without its hub kernels: an MXFP4 checkpoint becomes
bf16 (dequantized) unless the ``kernels`` package can fetch triton_kernels, which then swizzles
the weights into its own layout; an FP8 one is dequantized on machines without a GPU of compute
capability 8.9. Inside ``load_as_stored`` from_pretrained uses the quantizers below instead:

- MXFP4: gpt-oss's experts become ``Mxfp4Experts``, which hold the checkpoint's tensors under
  its names (``gate_up_proj_blocks`` [E, 2I, D/32, 16] uint8, ``gate_up_proj_scales`` [E, 2I,
  D/32] e8m0, ``gate_up_proj_bias`` [E, 2I], and the same for ``down_proj`` [E, D, I/32, 16]).
- FineGrainedFP8: transformers' own quantizer (its FP8Experts: e4m3 ``gate_up_proj`` [E, 2I, D]
  and ``gate_up_proj_scale_inv`` [E, 2I/128, D/128]), without the requirement of a GPU; the
  experts are read in place by the patch. Other linears it quantizes stay transformers'
  FP8Linear, which runs transformers' own fp8 kernel.

gpt-oss checkpoints alternate gate and up rows. Mxfp4Experts keeps them gate rows then up rows
in memory (the canonical layout, permuted once at load, in place: one expert's rows of
temporary memory); state_dict() and load_state_dict() convert from and to the checkpoint's order,
so saved checkpoints keep the stored layout.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Iterator

import torch
from torch import Tensor, nn
from transformers.quantizers.auto import AUTO_QUANTIZER_MAPPING
from transformers.quantizers.base import HfQuantizer
from transformers.quantizers.quantizer_finegrained_fp8 import FineGrainedFP8HfQuantizer

from ...ops.quantize import MX_GROUP, quantize_mxfp4


def alternate(t: Tensor, dim: int) -> Tensor:
    """Gate entries then up entries along ``dim`` -> alternating (gate0, up0, gate1, ...)."""
    shape = list(t.shape)
    halves = t.unflatten(dim, (2, shape[dim] // 2))  # [..., 2, I, ...]
    return halves.movedim(dim, dim + 1).reshape(shape)


def split_halves(t: Tensor, dim: int) -> Tensor:
    """Alternating gate/up entries along ``dim`` (gate0, up0, gate1, ...) -> gate entries then up
    entries (a new tensor: no view can express that order)."""
    shape = list(t.shape)
    return t.unflatten(dim, (shape[dim] // 2, 2)).movedim(dim + 1, dim).reshape(shape)


class Mxfp4Experts(nn.Module):
    """gpt-oss's routed experts as its MXFP4 checkpoints store them (names and shapes as on disk),
    gate rows then up rows in memory. Only a patched block can run them (forward raises)."""

    TENSORS = ("gate_up_proj_blocks", "gate_up_proj_scales", "gate_up_proj_bias",
               "down_proj_blocks", "down_proj_scales", "down_proj_bias")
    _GATE_UP = {"gate_up_proj_blocks": 1, "gate_up_proj_scales": 1, "gate_up_proj_bias": 1}

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, *,
                 bias_dtype: torch.dtype = torch.bfloat16, interleaved: bool = True,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        E, D, I = num_experts, hidden_size, intermediate_size
        if D % MX_GROUP or I % MX_GROUP:
            raise ValueError(f"mxfp4 needs hidden_size ({D}) and intermediate_size ({I}) to be "
                             f"multiples of {MX_GROUP}")
        self.num_experts, self.hidden_size, self.intermediate_size = E, D, I
        self.interleaved = interleaved  # the checkpoint alternates gate and up rows
        shapes = dict(gate_up_proj_blocks=((E, 2 * I, D // MX_GROUP, 16), torch.uint8),
                      gate_up_proj_scales=((E, 2 * I, D // MX_GROUP), torch.uint8),
                      gate_up_proj_bias=((E, 2 * I), bias_dtype),
                      down_proj_blocks=((E, D, I // MX_GROUP, 16), torch.uint8),
                      down_proj_scales=((E, D, I // MX_GROUP), torch.uint8),
                      down_proj_bias=((E, D), bias_dtype))
        for name, (shape, dtype) in shapes.items():
            self.register_parameter(name, nn.Parameter(
                torch.empty(shape, dtype=dtype, device=device), requires_grad=False))
        self.register_state_dict_post_hook(Mxfp4Experts._to_checkpoint_order)
        self.register_load_state_dict_pre_hook(Mxfp4Experts._from_checkpoint_order)

    @classmethod
    def for_config(cls, config, device: torch.device | str | None = None,
                   bias_dtype: torch.dtype = torch.bfloat16) -> Mxfp4Experts:
        return cls(config.num_local_experts, config.hidden_size, config.intermediate_size,
                   bias_dtype=bias_dtype, device=device)

    def canonical(self) -> dict[str, Tensor]:
        """MoE.from_weights arguments: views of the held tensors (w13 [E, 2I, D/2] and w2 [E, D,
        I/2] bytes, e8m0 scales [E, N, K/32], biases)."""
        E, D, I = self.num_experts, self.hidden_size, self.intermediate_size
        return dict(w13=self.gate_up_proj_blocks.detach().view(E, 2 * I, D // 2),
                    w13_scale=self.gate_up_proj_scales.detach(),
                    w13_bias=self.gate_up_proj_bias.detach(),
                    w2=self.down_proj_blocks.detach().view(E, D, I // 2),
                    w2_scale=self.down_proj_scales.detach(),
                    w2_bias=self.down_proj_bias.detach())

    @torch.no_grad()
    def from_checkpoint_order_(self) -> None:
        """Permute tensors loaded in the checkpoint's order (alternating gate/up rows) into gate
        rows then up rows, in place, one expert at a time."""
        if not self.interleaved:
            return
        for name, dim in self._GATE_UP.items():
            p = getattr(self, name)
            for e in range(p.shape[0]):
                p[e].copy_(split_halves(p[e], dim - 1))

    @staticmethod
    def _to_checkpoint_order(module: Mxfp4Experts, state_dict: dict, prefix: str,
                             local_metadata: dict) -> None:
        if module.interleaved:
            for name, dim in module._GATE_UP.items():
                state_dict[prefix + name] = alternate(state_dict[prefix + name], dim)

    @staticmethod
    def _from_checkpoint_order(module: Mxfp4Experts, state_dict: dict, prefix: str, *args) -> None:
        if module.interleaved:
            for name, dim in module._GATE_UP.items():
                if prefix + name in state_dict:
                    state_dict[prefix + name] = split_halves(state_dict[prefix + name], dim)

    def forward(self, *args, **kwargs):
        raise RuntimeError("Mxfp4Experts holds gpt-oss's MXFP4 experts for shufflemoe: run its "
                           "block patched (shufflemoe.integrations.transformers.patch)")

    def extra_repr(self) -> str:
        return (f"E={self.num_experts}, D={self.hidden_size}, I={self.intermediate_size}, mxfp4 "
                f"as stored")


class Mxfp4AsStored(HfQuantizer):
    """Loads an MXFP4 (gpt-oss) checkpoint's experts as stored, into Mxfp4Experts."""

    requires_calibration = False

    def validate_environment(self, *args, **kwargs) -> None:
        if not self.pre_quantized:
            raise ValueError("load_as_stored() loads MXFP4 checkpoints; to quantize bf16 "
                             "experts use MoEConfig(quantization='mxfp4')")

    def param_needs_quantization(self, model, param_name: str, **kwargs) -> bool:
        return False

    def _process_model_before_weight_loading(self, model, **kwargs) -> None:
        config = model.config.get_text_config(decoder=True)
        for name, module in list(model.named_modules()):
            if type(module).__name__ == "GptOssExperts":
                model.set_submodule(name, Mxfp4Experts.for_config(config, device="meta",
                                                                  bias_dtype=model.dtype))

    def _process_model_after_weight_loading(self, model, **kwargs):
        for module in model.modules():
            if isinstance(module, Mxfp4Experts):
                module.from_checkpoint_order_()
        return model

    def get_weight_conversions(self) -> list:
        return []

    def is_serializable(self) -> bool:
        return True

    @property
    def is_trainable(self) -> bool:
        return False


class Fp8AsStored(FineGrainedFP8HfQuantizer):
    """transformers' FineGrainedFP8 quantizer without its GPU requirement: checkpoints keep
    their fp8 experts (and a bf16 model can be quantized on the CPU, with transformers' own
    quantization op, e.g. to save a test checkpoint)."""

    def validate_environment(self, *args, **kwargs) -> None:
        return


@contextlib.contextmanager
def load_as_stored() -> Iterator[None]:
    """Inside the block, from_pretrained keeps MXFP4 and FineGrainedFP8 experts as stored (see the
    module docstring); outside, transformers' own quantizers are back."""
    saved = {k: AUTO_QUANTIZER_MAPPING[k] for k in ("mxfp4", "fp8")}
    AUTO_QUANTIZER_MAPPING.update(mxfp4=Mxfp4AsStored, fp8=Fp8AsStored)
    try:
        yield
    finally:
        AUTO_QUANTIZER_MAPPING.update(saved)


# What gpt-oss's MXFP4 checkpoints leave unquantized (everything but the routed experts).
MXFP4_NOT_CONVERTED = ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                       "model.embed_tokens", "lm_head"]


def save_mxfp4_checkpoint(model: nn.Module, path: str | os.PathLike) -> dict[str, Tensor]:
    """Save a (bf16) gpt-oss model as OpenAI's MXFP4 checkpoints are stored: its experts'
    gate_up_proj [E, D, 2I] / down_proj [E, I, D] become ``*_blocks`` [E, N, K/32, 16] and
    ``*_scales`` [E, N, K/32] (rows in the model's column order, gate and up alternating;
    ops.quantize.quantize_mxfp4), the rest as it is, and config.json gets quant_method "mxfp4".
    Returns the saved tensors."""
    from safetensors.torch import save_file

    model.save_pretrained(path)
    tensors = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    for key in [k for k in tensors if k.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        blocks, scales = quantize_mxfp4(tensors.pop(key).transpose(1, 2))
        tensors[key + "_blocks"] = blocks.unflatten(-1, (-1, 16)).contiguous()
        tensors[key + "_scales"] = scales
    for name in os.listdir(path):
        if name.endswith(".safetensors") or name.endswith(".safetensors.index.json"):
            os.remove(os.path.join(path, name))
    save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    config_file = os.path.join(path, "config.json")
    with open(config_file) as f:
        config = json.load(f)
    config["quantization_config"] = {"quant_method": "mxfp4",
                                     "modules_to_not_convert": MXFP4_NOT_CONVERTED}
    with open(config_file, "w") as f:
        json.dump(config, f, indent=2)
    return tensors
