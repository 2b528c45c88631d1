"""The quantization formulas, in torch: each defines its quantized model, and every fused kernel
that quantizes reproduces it bit for bit.

| format       | values                  | scales                                        | used for       |
| ------------ | ----------------------- | --------------------------------------------- | -------------- |
| fp8 rowwise  | e4m3                    | fp32, one per row                             | w and x        |
| fp8 groups   | e4m3                    | fp32, one per row and 128 columns (1 x 128)   | x (fp8_block)  |
| fp8 blocks   | e4m3                    | fp32, one per 128 x 128 block                 | w (fp8_block)  |
| mxfp4        | e2m1, two per byte      | e8m0 (a power of two), one per 32 along K     | w              |

fp8: amax = max(|values|, 1e-12) over the row / group / block; q = e4m3(clamp(v * (448 / amax)));
scale = amax * (1 / 448) (v ~= q * scale). mxfp4 follows the OCP MX format as gpt-oss checkpoints
store it (and as triton_kernels' downcast_to_mxfp rounds): the scale is amax / 6 rounded up to a
power of two, values are rounded to the nearest e2m1 (ties to even), element 2j of a row in the
low nibble of byte j and 2j + 1 in the high nibble.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from .._common import store_rows
from .._impl import inplace_op

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3 value
FP8_EPS = 1e-12  # floor on a row's absolute maximum, so all-zero rows get a finite scale
FP8_BLOCK = 128  # fp8_block: weights in 128 x 128 blocks, activations in groups of 128 columns
# quantize= as the public op takes it -> the fp8 scale layout ("none": not quantized)
QUANTIZE_MODES = {False: "none", True: "rowwise", "none": "none", "rowwise": "rowwise",
                  "groups": "groups"}
MX_GROUP = 32  # mxfp4: values sharing one e8m0 scale, along K
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # codes 0..7; bit 3 is the sign


def quantize_fp8_rowwise(x: Tensor) -> tuple[Tensor, Tensor]:
    """x [M, K] -> (q [M, K] float8_e4m3fn, scale [M] float32) with x ~= q * scale[:, None].

    In float32: amax = max(|row|, eps); q = clamp(row * (448 / amax)); scale = amax * (1 / 448).
    (The scale multiplies by the rounded reciprocal because that is what torch does for a
    division by a constant on CUDA; written so, CPU and GPU agree bit for bit.)
    """
    xf = x.float()
    amax = xf.abs().amax(dim=-1).clamp_min(FP8_EPS)
    q = (xf * (FP8_MAX / amax)[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, amax * (1.0 / FP8_MAX)


def dequantize_fp8_rowwise(q: Tensor, scale: Tensor) -> Tensor:
    """(q [M, K], scale [M]) -> float32 [M, K]."""
    return q.float() * scale[..., None]


def _pad_to(x: Tensor, dim: int, multiple: int) -> Tensor:
    pad = -x.shape[dim] % multiple
    if pad == 0:
        return x
    widths = [0, 0] * (x.dim() - dim % x.dim() - 1) + [0, pad]
    return F.pad(x, widths)


def quantize_fp8_groups(x: Tensor, group: int = FP8_BLOCK) -> tuple[Tensor, Tensor]:
    """x [M, K] -> (q [M, K] e4m3, scale [M, ceil(K / group)] float32): the rowwise formula on
    each group of ``group`` columns (the last one may be partial). DeepSeek-V3's per-token-group
    activation quantization."""
    M, K = x.shape
    G = -(-K // group)
    padded = _pad_to(x.float(), 1, group).view(M * G, group)
    q, s = quantize_fp8_rowwise(padded)
    return q.view(M, G * group)[:, :K].contiguous(), s.view(M, G)


@inplace_op("quantize_fp8_groups_ref", mutates_args=("q", "scale"))
def quantize_fp8_groups_into(x: Tensor, num_valid: Optional[Tensor], q: Tensor, scale: Tensor,
                             group: int) -> None:
    """q, scale <- quantize_fp8_groups(x) for rows below num_valid (the op's torch reference)."""
    new_q, new_scale = quantize_fp8_groups(x, group)
    store_rows(q, new_q, num_valid)
    store_rows(scale, new_scale, num_valid)


def block_rows(n_rows: int, split: int | None, block: int = FP8_BLOCK) -> Tensor:
    """[n_rows] int64: the scale block of each output row. Rows restart their blocks at ``split``
    (w13's up half: gate and up quantized separately, as DeepSeek-V3 / Qwen3 FP8 checkpoints
    store them and transformers concatenates their scales); None: no restart."""
    rows = torch.arange(n_rows)
    if split is None or split >= n_rows:
        return rows // block
    return torch.where(rows < split, rows // block, -(-split // block) + (rows - split) // block)


def quantize_fp8_blockwise(w: Tensor, split: int | None = None,
                           block: int = FP8_BLOCK) -> tuple[Tensor, Tensor]:
    """w [..., N, K] -> (q [..., N, K] e4m3, scale [..., NB, KB] float32): the rowwise formula on
    each block x block tile (partial at the edges); NB = ceil(N / block), or with ``split``
    ceil(split / block) + ceil((N - split) / block) (the two parts are quantized separately)."""
    if split is not None and 0 < split < w.shape[-2]:
        parts = [quantize_fp8_blockwise(p, None, block)
                 for p in (w[..., :split, :], w[..., split:, :])]
        return torch.cat([parts[0][0], parts[1][0]], -2), torch.cat([parts[0][1], parts[1][1]], -2)
    *lead, N, K = w.shape
    NB, KB = -(-N // block), -(-K // block)
    wf = _pad_to(_pad_to(w.float().reshape(-1, N, K), 1, block), 2, block)
    tiles = wf.view(-1, NB, block, KB, block).transpose(2, 3).reshape(-1, block * block)
    q, s = quantize_fp8_rowwise(tiles)
    q = q.view(-1, NB, KB, block, block).transpose(2, 3).reshape(-1, NB * block, KB * block)
    return q[:, :N, :K].reshape(*lead, N, K).contiguous(), s.view(*lead, NB, KB)


def dequantize_fp8_blockwise(q: Tensor, scale: Tensor, split: int | None = None,
                             block: int = FP8_BLOCK) -> Tensor:
    """(q [..., N, K], scale [..., NB, KB]) -> float32 [..., N, K]."""
    N, K = q.shape[-2:]
    rows = block_rows(N, split, block).to(q.device)
    cols = torch.arange(K, device=q.device) // block
    return q.float() * scale.index_select(-2, rows).index_select(-1, cols)


def dequantize_fp8_groups(q: Tensor, scale: Tensor, group: int = FP8_BLOCK) -> Tensor:
    """(q [M, K], scale [M, ceil(K / group)]) -> float32 [M, K]."""
    cols = torch.arange(q.shape[-1], device=q.device) // group
    return q.float() * scale.index_select(-1, cols)


def _e2m1_codes(a: Tensor) -> Tensor:
    """|v| (already divided by the scale) -> e2m1 code 0..7, nearest value, ties to the even
    code (0.25 -> 0, 0.75 -> 1.0, 1.25 -> 1.0, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4); past 6
    saturates at 6."""
    codes = torch.zeros(a.shape, dtype=torch.uint8, device=a.device)
    for bound, inclusive in ((0.25, False), (0.75, True), (1.25, False), (1.75, True),
                             (2.5, False), (3.5, True), (5.0, False)):
        codes += (a >= bound) if inclusive else (a > bound)
    return codes


def quantize_mxfp4(w: Tensor) -> tuple[Tensor, Tensor]:
    """w [..., N, K] (K a multiple of 32) -> (blocks [..., N, K / 2] uint8, scales [..., N, K / 32]
    uint8 e8m0, exponent bias 127). gpt-oss checkpoints store blocks viewed as [..., N, K/32, 16]."""
    *lead, N, K = w.shape
    if K % MX_GROUP:
        raise ValueError(f"mxfp4 needs K (the last dimension) a multiple of {MX_GROUP}, got {K}")
    groups = w.float().reshape(*lead, N, K // MX_GROUP, MX_GROUP)
    amax = groups.abs().amax(-1)
    # amax / 6 rounded up to a power of two: its biased float32 exponent, mantissa rounded up
    bits = (amax / 6.0).view(torch.int32)
    scale = ((bits + 0x7FFFFF) >> 23).clamp(0, 254).to(torch.uint8)  # [..., N, K/32]
    v = torch.ldexp(groups, (127 - scale.to(torch.int32))[..., None])
    codes = _e2m1_codes(v.abs()) | ((v < 0).to(torch.uint8) << 3)
    codes = codes.reshape(*lead, N, K // 2, 2)
    return codes[..., 0] | (codes[..., 1] << 4), scale


def dequantize_mxfp4(blocks: Tensor, scales: Tensor) -> Tensor:
    """(blocks [..., N, K / 2] uint8, scales [..., N, K / 32] uint8) -> float32 [..., N, K]."""
    lut = torch.tensor(E2M1_VALUES, device=blocks.device)
    lut = torch.cat([lut, -lut])
    values = torch.stack([lut[(blocks & 0xF).long()], lut[(blocks >> 4).long()]], -1)
    values = values.flatten(-2).unflatten(-1, (-1, MX_GROUP))  # [..., N, K/32, 32]
    exp = scales.to(torch.int32) - 127
    return torch.ldexp(values, exp[..., None]).flatten(-2)
