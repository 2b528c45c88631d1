"""Grouped GEMM in torch ops: rows of x are split into consecutive groups by m_sizes (on the
device); group g is multiplied by its weight matrix. Sync-free on CUDA: torch._grouped_mm where it
takes the shapes, else one masked matmul per group (G times the FLOPs; odd shapes in tests). On
the CPU the sizes already live on the host, so odd shapes are sliced per group. Quantized inputs
are dequantized to float32 first (ops/quantize/reference.py), which is exact."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .._common import store_rows
from .._impl import _is_compiling, inplace_op
from ..gather_scale.reference import gather_scale
from ..quantize import reference as q
from ..quantize.formats import FORMATS
from ..silu_mul.reference import glu as _glu


_HAS_GROUPED_MM = hasattr(torch, "_grouped_mm")
_CPU_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _grouped_mm_supported(x: Tensor, w: Tensor) -> bool:
    size = x.element_size()  # 16-byte aligned rows of x and of the result
    if not _HAS_GROUPED_MM or (x.shape[1] * size) % 16 or (w.shape[1] * size) % 16:
        return False
    if x.is_cuda:
        return x.dtype == torch.bfloat16 and torch.cuda.get_device_capability(x.device) >= (9, 0)
    return x.is_cpu and x.dtype in _CPU_DTYPES


def _grouped_mm(x: Tensor, w: Tensor, ends: Tensor) -> Tensor:
    """x [M, K], w [G, N, K], ends [G] int32 inclusive row ends -> [M, N] in x's dtype, summed
    in float32 (rows past ends[-1] unspecified)."""
    if _grouped_mm_supported(x, w):
        return torch._grouped_mm(x, w.transpose(-2, -1), offs=ends)
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
    group = torch.searchsorted(ends, torch.arange(M, device=x.device, dtype=ends.dtype), right=True)
    for g in range(w.shape[0]):
        y = torch.where((group == g)[:, None], xf @ w[g].float().T, y)
    return y


def _products(x: Tensor, w: Tensor, m_sizes: Tensor, x_scale: Optional[Tensor],
              w_scale: Optional[Tensor], weight_ids: Optional[Tensor],
              row_weights: Optional[Tensor], quantization: str, bias: Optional[Tensor],
              scale_split: Optional[int], x_ids: Optional[Tensor] = None
              ) -> tuple[Tensor, Tensor]:
    """(y [M, N]: each row (x's, or the one of x it gathers) times its group's weights, plus its group's bias, times its row
    weight, rows past the total uninitialised; ends [G] int32 inclusive row ends)."""
    if x_ids is not None:  # ids past the groups may be anything: they read row 0
        ends = torch.cumsum(m_sizes, 0, dtype=torch.int32)
        tail = torch.arange(x_ids.shape[0], device=x.device) >= _total(ends)
        x = gather_scale(x, x_ids.masked_fill(tail, 0), None, None, False, None)
    M = x.shape[0]
    if weight_ids is not None:
        w = w.index_select(0, weight_ids)
        w_scale = None if w_scale is None else w_scale.index_select(0, weight_ids)
        bias = None if bias is None else bias.index_select(0, weight_ids)
    x, w = _dequantized(x, w, x_scale, w_scale, quantization, scale_split)
    ends = torch.cumsum(m_sizes, 0, dtype=torch.int32)
    y = _grouped_mm(x, w, ends)  # [M, N]
    if bias is not None:  # bias of each row's group (rows past the groups: the last one's)
        group = torch.searchsorted(ends, torch.arange(M, device=x.device, dtype=ends.dtype),
                                   right=True)
        y = y.float() + bias.float()[group.clamp(max=w.shape[0] - 1)]
    if row_weights is not None:
        y = y.float() * row_weights.unsqueeze(1)
    return y, ends


def _glu_rows(y: Tensor, glu: tuple | None) -> Tensor:
    """y [M, N], or act(y[:, :N/2], y[:, N/2:]) [M, N / 2] in float32 with glu = (activation,
    alpha, limit)."""
    if glu is None:
        return y
    gate, up = y.float().chunk(2, dim=1)
    return _glu(gate, up, *glu)


@inplace_op("grouped_gemm_ref", mutates_args=("out",))
def _grouped_gemm(x: Tensor, w: Tensor, m_sizes: Tensor, x_scale: Optional[Tensor],
                  w_scale: Optional[Tensor], weight_ids: Optional[Tensor],
                  row_weights: Optional[Tensor], scatter_ids: Optional[Tensor], out: Tensor,
                  keep_tail: bool, quantization: str, bias: Optional[Tensor],
                  scale_split: Optional[int], all_rows: bool, store: bool,
                  x_ids: Optional[Tensor], glu: Optional[str],
                  alpha: float, limit: Optional[float]) -> None:
    """keep_tail: rows of out past sum(m_sizes) keep their values (else they may be written).
    all_rows: sum(m_sizes) == M, there is no tail. store: scattered rows replace out's rows
    (distinct ids) instead of adding to them."""
    M = x.shape[0] if x_ids is None else x_ids.shape[0]
    y, ends = _products(x, w, m_sizes, x_scale, w_scale, weight_ids, row_weights, quantization,
                        bias, scale_split, x_ids)
    y = _glu_rows(y, None if glu is None else (glu, alpha, limit))
    if scatter_ids is None:
        store_rows(out, y, _total(ends) if keep_tail and not all_rows else None)
        return
    y, ids = y.float(), scatter_ids
    if not all_rows:  # masked, never read on the host (a sync on CUDA)
        tail = torch.arange(M, device=x.device) >= _total(ends)
        y = y.masked_fill(tail.unsqueeze(1), 0.0)  # uninitialised rows
        ids = ids.masked_fill(tail, 0)  # may be anything
    if store:  # the rows a valid row reaches start from zero (their old values may be NaN)
        valid = torch.ones(M, device=x.device) if all_rows else (~tail).float()
        hit = torch.zeros(out.shape[0], device=x.device).index_add_(0, ids, valid)
        out.masked_fill_(hit.unsqueeze(1) > 0, 0.0)
    if out.dtype == torch.float32:
        out.index_add_(0, ids, y)
    else:  # summed in float32, rounded once
        out.copy_(out.float().index_add_(0, ids, y))


def _total(ends: Tensor) -> Tensor:
    """[1] rows in all groups."""
    return ends[-1:] if ends.shape[0] else torch.zeros(1, dtype=ends.dtype, device=ends.device)


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
    scatter: str = "add",
    quantization: str = "none",
    bias: Tensor | None = None,
    scale_split: int | None = None,
    all_rows: bool = False,
    x_ids: Tensor | None = None,
    glu: tuple[str, float, float | None] | None = None,
) -> Tensor:
    """As ops.grouped_gemm ("add" and "add_unique" are the same sum here)."""
    if out is None and scatter_ids is None and not _is_compiling():
        # eager, new output: the product itself (rows past the total may hold anything), not
        # an allocation and a copy
        y = _glu_rows(_products(x, w, m_sizes, x_scale, w_scale, weight_ids, row_weights,
                                quantization, bias, scale_split, x_ids)[0], glu)
        return y if y.dtype == out_dtype else y.to(out_dtype)
    keep_tail = out is not None
    if out is None:
        M = x.shape[0] if x_ids is None else x_ids.shape[0]
        N = w.shape[1] if glu is None else w.shape[1] // 2
        out = torch.empty(M, N, dtype=out_dtype, device=x.device)
    _grouped_gemm(x, w, m_sizes, x_scale, w_scale, weight_ids, row_weights, scatter_ids, out,
                  keep_tail, quantization, bias, scale_split, all_rows, scatter == "store",
                  x_ids, *((None, 1.0, None) if glu is None else glu))
    return out


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
