"""Grouped GEMM in torch ops: rows of x are split into consecutive groups by m_sizes (on the
device); group g is multiplied by its weight matrix. Sync-free on CUDA: torch._grouped_mm where it
takes the shapes, else one masked matmul per group (G times the FLOPs; odd shapes in tests). On
the CPU the sizes already live on the host, so odd shapes are sliced per group."""

from __future__ import annotations

import torch
from torch import Tensor

from .._common import store_rows


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
) -> Tensor:
    M = x.shape[0]
    if weight_ids is not None:
        w = w.index_select(0, weight_ids.long())
        w_scale = None if w_scale is None else w_scale.index_select(0, weight_ids.long())
    if x_scale is not None:  # fp8 rowwise: dequantize, multiply in float32
        x = x.float() * x_scale[:, None]
        w = w.float() * w_scale[..., None]
    ends = m_sizes.long().cumsum(0)
    total = ends[-1:] if ends.numel() else torch.zeros(1, dtype=torch.long, device=x.device)
    y = _grouped_mm(x, w, ends)  # [M, N] float32
    if row_weights is not None:
        y = y * row_weights.float()[:, None]
    if scatter_ids is None:
        return store_rows(out, y.to(out_dtype), total)
    valid = torch.arange(M, device=x.device) < total
    y = torch.where(valid[:, None], y, 0.0)
    ids = torch.where(valid, scatter_ids.long(), 0)  # tail ids are never read (may be anything)
    acc = out.float().index_add_(0, ids, y)
    return out.copy_(acc)
