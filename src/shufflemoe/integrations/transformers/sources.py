"""Where a patched block's routed experts come from: one entry per way their tensors are held,
each read into MoE.from_weights arguments in the canonical layout without a copy of the weights
where the layout allows (the gate/up permutation of gpt-oss's bf16 experts does not).

| source    | experts module                                | quantization | tensors read                        |
| --------- | --------------------------------------------- | ------------ | ----------------------------------- |
| fp8_block | transformers' FP8Experts (FineGrainedFP8,     | fp8_block    | gate_up_proj, down_proj e4m3 and    |
|           | weight_block_size 128 x 128)                  |              | *_scale_inv [E, N/128, K/128] fp32  |
| mxfp4     | quantized.Mxfp4Experts (gpt-oss checkpoints)  | mxfp4        | *_blocks, *_scales, *_bias          |
| hf        | the model's own experts (model dtype)         | none         | BlockSpec.w13 / w2 (+ biases)       |

The first entry whose ``matches`` accepts the block's experts module is used.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor, nn

from ...ops.quantize import FP8_BLOCK
from .quantized import Mxfp4Experts, split_halves
from .specs import BlockSpec


def get(block: nn.Module, path: str) -> Tensor:
    return functools.reduce(getattr, path.split("."), block)


def contiguous(p: Tensor) -> Tensor:
    if not p.is_contiguous():  # keep one copy: the parameter itself becomes the contiguous one
        p.data = p.data.contiguous()
    return p.detach()


def transposed(p: Tensor) -> Tensor:
    """HF [E, A, B] (x @ W layout) -> canonical [E, B, A] contiguous. Converted once: the HF
    parameter then holds a transposed view of the canonical tensor (same name and shape)."""
    t = p.detach().transpose(1, 2)
    if not t.is_contiguous():
        t = t.contiguous()
        p.data = t.transpose(1, 2)
    return t


def canonical_experts(w13: Tensor, w2: Tensor, is_transposed: bool,
                      interleaved: bool = False) -> tuple[Tensor, Tensor]:
    """HF routed-expert parameters -> (w13 [E, 2I, D], w2 [E, D, I]) contiguous, sharing their
    storage (converted once when ``is_transposed``: HF [E, D, 2I] / [E, I, D]). Interleaved gate/up
    columns (gpt-oss) are permuted into a new tensor: no view can express that order."""
    if interleaved:
        w13 = w13.detach().transpose(1, 2) if is_transposed else w13.detach()
        w13 = split_halves(w13, 1).contiguous()
    else:
        w13 = transposed(w13) if is_transposed else contiguous(w13)
    return w13, transposed(w2) if is_transposed else contiguous(w2)


@dataclass(frozen=True)
class ExpertSource:
    name: str
    quantization: str  # the MoEConfig.quantization the tensors are stored in
    matches: Callable[[nn.Module], bool]  # experts module -> held this way
    tensors: Callable[[nn.Module, BlockSpec], list[Tensor]]  # the tensors read (rebuild key)
    read: Callable[[nn.Module, BlockSpec], dict[str, Tensor]]  # -> from_weights arguments


def _hf_tensors(block: nn.Module, spec: BlockSpec) -> list[Tensor]:
    return [get(block, p) for p in (spec.w13, spec.w2, spec.w13_bias, spec.w2_bias) if p]


def _read_hf(block: nn.Module, spec: BlockSpec) -> dict[str, Tensor]:
    w13, w2 = canonical_experts(get(block, spec.w13), get(block, spec.w2), spec.transposed,
                                spec.interleaved)
    weights = dict(w13=w13, w2=w2)
    if spec.w13_bias:
        b13 = get(block, spec.w13_bias).detach()
        weights.update(w13_bias=split_halves(b13, 1) if spec.interleaved else b13,
                       w2_bias=get(block, spec.w2_bias).detach())
    return weights


def _fp8_experts(module: nn.Module) -> bool:
    return hasattr(module, "gate_up_proj_scale_inv") and hasattr(module, "down_proj_scale_inv")


def _fp8_tensors(block: nn.Module, spec: BlockSpec) -> list[Tensor]:
    e = get(block, spec.experts)
    return [e.gate_up_proj, e.gate_up_proj_scale_inv, e.down_proj, e.down_proj_scale_inv]


def _read_fp8(block: nn.Module, spec: BlockSpec) -> dict[str, Tensor]:
    """FP8Experts: e4m3 [E, 2I, D] / [E, D, I] (gate rows then up rows, whatever the model's own
    layout) with float32 inverse scales per 128 x 128 block, gate and up blocked separately."""
    e = get(block, spec.experts)
    problems = [what for what, bad in (
        (f"block_size={e.block_size} (128 x 128 only)",
         tuple(e.block_size or ()) != (FP8_BLOCK, FP8_BLOCK)),
        (f"activation_scheme={e.activation_scheme!r} (dynamic only)",
         e.activation_scheme != "dynamic"),
        (f"weights of dtype {e.gate_up_proj.dtype} (e4m3 only)",
         e.gate_up_proj.dtype != torch.float8_e4m3fn)) if bad]
    if problems:
        raise NotImplementedError(f"{spec.block}: its FineGrainedFP8 experts have "
                                  f"{', '.join(problems)}")
    # ue8m0 scales (powers of two) widen to float32 exactly; a copy of E * 2I * D / 2^14 values
    scales = [s.detach() if s.dtype == torch.float32 else s.detach().float()
              for s in (e.gate_up_proj_scale_inv, e.down_proj_scale_inv)]
    return dict(w13=contiguous(e.gate_up_proj), w13_scale=scales[0], w2=contiguous(e.down_proj),
                w2_scale=scales[1])


def _mx_tensors(block: nn.Module, spec: BlockSpec) -> list[Tensor]:
    e = get(block, spec.experts)
    return [getattr(e, n) for n in e.TENSORS]


def _read_mx(block: nn.Module, spec: BlockSpec) -> dict[str, Tensor]:
    return get(block, spec.experts).canonical()


SOURCES: tuple[ExpertSource, ...] = (
    ExpertSource("fp8_block", "fp8_block", _fp8_experts, _fp8_tensors, _read_fp8),
    ExpertSource("mxfp4", "mxfp4", lambda m: isinstance(m, Mxfp4Experts), _mx_tensors, _read_mx),
    ExpertSource("hf", "none", lambda m: True, _hf_tensors, _read_hf),
)


def source_for(block: nn.Module, spec: BlockSpec) -> ExpertSource:
    experts = get(block, spec.experts)
    return next(s for s in SOURCES if s.matches(experts))
