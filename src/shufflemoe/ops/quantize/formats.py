"""The routed-expert weight formats, one entry per MoEConfig.quantization value: how a weight
matrix [N, K] (w13 [E, 2I, D], w2 [E, D, I]) is stored, how the expert GEMMs' inputs are
quantized, and how many bytes it takes. The layer, the strategies, the float64 reference and the
planner read this table; nothing else branches on the format's name.

| name        | weights                        | weight scales                | activations          | checkpoints                       |
| ----------- | ------------------------------ | ---------------------------- | -------------------- | --------------------------------- |
| none        | model dtype                    | -                            | model dtype          |                                   |
| fp8_rowwise | e4m3                           | fp32 [N]                     | e4m3, fp32 per row   | Llama 4 Maverick FP8              |
| fp8_w8a16   | e4m3                           | fp32 [N]                     | model dtype          | FP8 along the hidden dim (Neuron) |
| fp8_block   | e4m3                           | fp32 [ceil(N/128), ceil(K/128)] | e4m3, fp32 per 128 | DeepSeek-V3, Qwen3-FP8            |
| mxfp4       | e2m1, 2 a byte: uint8 [N, K/2] | e8m0 uint8 [N, K/32]         | model dtype          | gpt-oss                           |

``split`` (fp8_block's w13): output rows restart their 128-row scale blocks at the up half, as
in checkpoints that quantized gate and up separately (see reference.block_rows).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from . import reference as ref

Quantize = Callable[[Tensor, "int | None"], tuple[Tensor, Tensor]]
Dequantize = Callable[[Tensor, Tensor, "int | None"], Tensor]
ScaleShape = Callable[[int, int, "int | None"], tuple[int, ...]]


@dataclass(frozen=True)
class WeightFormat:
    name: str
    weight_dtype: torch.dtype | None  # stored weights; None: the model dtype (unquantized)
    k_per_element: int  # weight values per stored element along K (mxfp4: 2 a byte)
    scale_dtype: torch.dtype | None  # None: no scales
    scales: ScaleShape | None  # (N, K, split) -> shape of the scales of one [N, K] matrix
    activation: str  # how the GEMM inputs are quantized: "none" | "rowwise" | "groups"
    quantize: Quantize | None = None  # w [..., N, K] in the model dtype -> (weights, scales)
    dequantize: Dequantize | None = None  # (weights, scales) -> float32 [..., N, K]
    k_multiple: int = 1  # K must be a multiple of this
    # (rows, columns along K) one scale covers; columns 0: the whole row. Tensor parallelism cuts
    # w13's rows and w2's columns on these boundaries.
    scale_block: tuple[int, int] = (1, 0)
    summary: str = ""

    @property
    def quantized(self) -> bool:
        return self.weight_dtype is not None

    def weight_shape(self, N: int, K: int) -> tuple[int, int]:
        return N, K // self.k_per_element

    def scale_shape(self, N: int, K: int, split: int | None = None) -> tuple[int, ...] | None:
        return None if self.scales is None else self.scales(N, K, split)

    def bytes(self, N: int, K: int, model_itemsize: int, split: int | None = None) -> int:
        """Bytes of one [N, K] weight matrix in this format, scales included."""
        if not self.quantized:
            return N * K * model_itemsize
        n = N * (K // self.k_per_element) * self.weight_dtype.itemsize
        scale = self.scale_shape(N, K, split)
        return n + (0 if scale is None else
                    int(torch.Size(scale).numel()) * self.scale_dtype.itemsize)

    def why_not(self, N: int, K: int) -> str | None:
        """None when an [N, K] matrix can be stored in this format, else the reason."""
        if K % self.k_multiple:
            return f"{self.name} needs K (here {K}) to be a multiple of {self.k_multiple}"
        return None


def _rowwise(w: Tensor, split: int | None) -> tuple[Tensor, Tensor]:
    q, s = ref.quantize_fp8_rowwise(w.reshape(-1, w.shape[-1]))
    return q.view(w.shape), s.view(w.shape[:-1])


def _unrowwise(q: Tensor, s: Tensor, split: int | None) -> Tensor:
    return ref.dequantize_fp8_rowwise(q, s)


def _block_scales(N: int, K: int, split: int | None) -> tuple[int, int]:
    B = ref.FP8_BLOCK
    rows = -(-N // B) if split is None else -(-split // B) + -(-(N - split) // B)
    return rows, -(-K // B)


def _row_scales(N: int, K: int, split: int | None) -> tuple[int]:
    return (N,)


def _mx_scales(N: int, K: int, split: int | None) -> tuple[int, int]:
    return N, K // ref.MX_GROUP


FP8 = dict(weight_dtype=ref.FP8_DTYPE, k_per_element=1, scale_dtype=torch.float32)

FORMATS: dict[str, WeightFormat] = {f.name: f for f in (
    WeightFormat("none", None, 1, None, None, "none", summary="weights in the model dtype"),
    WeightFormat("fp8_rowwise", **FP8, scales=_row_scales, activation="rowwise",
                 quantize=_rowwise, dequantize=_unrowwise,
                 summary="e4m3 weights and activations, one fp32 scale per row (w8a8)"),
    WeightFormat("fp8_w8a16", **FP8, scales=_row_scales, activation="none",
                 quantize=_rowwise, dequantize=_unrowwise,
                 summary="e4m3 weights, one fp32 scale per output row; activations in the "
                         "model dtype (weight-only)"),
    WeightFormat("fp8_block", **FP8, scales=_block_scales, activation="groups",
                 quantize=ref.quantize_fp8_blockwise, dequantize=ref.dequantize_fp8_blockwise,
                 scale_block=(ref.FP8_BLOCK, ref.FP8_BLOCK),
                 summary="e4m3 weights in 128 x 128 blocks, activations in groups of 128 "
                         "columns, fp32 scales (DeepSeek-V3 / Qwen3 FP8 checkpoints)"),
    WeightFormat("mxfp4", weight_dtype=torch.uint8, k_per_element=2, scale_dtype=torch.uint8,
                 scales=_mx_scales, activation="none",
                 quantize=lambda w, split: ref.quantize_mxfp4(w),
                 dequantize=lambda q, s, split: ref.dequantize_mxfp4(q, s),
                 k_multiple=ref.MX_GROUP, scale_block=(1, ref.MX_GROUP),
                 summary="e2m1 weights, two a byte, one e8m0 scale per 32 along K; activations "
                         "in the model dtype (gpt-oss checkpoints)"),
)}


def weight_format(name: str) -> WeightFormat:
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown quantization {name!r}; choose one of {list(FORMATS)}") from None
