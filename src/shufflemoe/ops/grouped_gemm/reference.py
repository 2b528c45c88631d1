"""Grouped GEMM in torch ops: rows of x are split into consecutive groups by m_sizes (on the
device); group g is multiplied by its weight matrix. Sync-free on CUDA: torch._grouped_mm where it
takes the shapes, else one masked matmul per group (G times the FLOPs; odd shapes in tests). On
the CPU the sizes already live on the host, so odd shapes are sliced per group. Quantized inputs
are dequantized to float32 first (ops/quantize/reference.py), which is exact."""

from __future__ import annotations

import torch
from torch import Tensor

from .._common import store_rows
from ..quantize import reference as q
from ..quantize.formats import FORMATS


def _grouped_mm_supported(x: Tensor, w: Tensor) -> bool:
    aligned = all((n * x.element_size()) % 16 == 0 for n in (x.shape[1], w.shape[1]))
    if not aligned or not hasattr(torch, "_grouped_mm"):
        return False
    if x.is_cuda:
        return x.dtype == torch.bfloat16 and torch.cuda.get_device_capability(x.device) >= (9, 0)
    return x.device.type == "cpu" and x.dtype in (torch.bfloat16, torch.float16, torch.float32)


def _grouped_mm(x: Tensor, w: Tensor, ends: Tensor) -> Tensor:
    """x [M, K], w [G, N, K], ends [G] inclusive row ends -> [M, N] float32 (tail unspecified)."""
    if _grouped_mm_supported(x, w):
        return torch._grouped_mm(x, w.transpose(-2, -1), offs=ends.int()).float()
    M = x.shape[0]
    y = torch.zeros(M, w.shape[1], dtype=torch.float32, device=x.device)
    xf = x.float()
    if not x.is_cuda:  # CPU tensors: reading the sizes is no device sync
        start = 0
        for g, end in enumerate(ends.tolist()):
            if end > start:
                y[start:end] = xf[start:end] @ w[g].float().T
            start = end
        return y
    group = torch.searchsorted(ends.long(), torch.arange(M, device=x.device), right=True)
    for g in range(w.shape[0]):
        y = torch.where((group == g)[:, None], xf @ w[g].float().T, y)
    return y


def grouped_gemm(
    x: Tensor,
    w: Tensor,
    m_sizes: Tensor,
    x_scale: Tensor | None,
    w_scale: Tensor | None,
    weight_ids: Tensor | None,
    row_weights: Tensor | None,
    scatter_ids: Tensor | None,
    out: Tensor | None,
    out_dtype: torch.dtype,
    *,
    quantization: str = "none",
    bias: Tensor | None = None,
    scale_split: int | None = None,
) -> Tensor:
    M = x.shape[0]
    if weight_ids is not None:
        w, w_scale, bias = (None if t is None else t.index_select(0, weight_ids.long())
                            for t in (w, w_scale, bias))
    x, w = _dequantized(x, w, x_scale, w_scale, quantization, scale_split)
    ends = m_sizes.long().cumsum(0)
    total = ends[-1:] if ends.numel() else torch.zeros(1, dtype=torch.long, device=x.device)
    y = _grouped_mm(x, w, ends)  # [M, N] float32
    if bias is not None:  # bias of each row's group (rows past the groups: the last one's)
        group = torch.searchsorted(ends, torch.arange(M, device=x.device), right=True)
        y = y + bias.float()[group.clamp(max=w.shape[0] - 1)]
    if row_weights is not None:
        y = y * row_weights.float()[:, None]
    if scatter_ids is None:
        return store_rows(out, y.to(out_dtype), total)
    valid = torch.arange(M, device=x.device) < total
    y = torch.where(valid[:, None], y, 0.0)
    ids = torch.where(valid, scatter_ids.long(), 0)  # tail ids are never read (may be anything)
    acc = out.float().index_add_(0, ids, y)
    return out.copy_(acc)


def _dequantized(x: Tensor, w: Tensor, x_scale: Tensor | None, w_scale: Tensor | None,
                 quantization: str, split: int | None) -> tuple[Tensor, Tensor]:
    """(x, w) as float32 values (or unchanged when not quantized)."""
    fmt = FORMATS[quantization]
    if not fmt.quantized:
        return x, w
    x = _ACTIVATIONS[fmt.activation](x, x_scale)
    return x, fmt.dequantize(w, w_scale, split)


_ACTIVATIONS = {"none": lambda x, s: x.float(), "rowwise": q.dequantize_fp8_rowwise,
                "groups": q.dequantize_fp8_groups}
