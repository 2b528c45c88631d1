"""CombineShuffling and SplitShuffling: rank-major <-> expert-major row order for expert
parallelism, with sizes on the device. ``starts`` [EP] says where source rank r's rows begin:
the exclusive prefix sum of per-rank totals for the dense (all-to-all) form, r * P for the padded
(all-gather) form. Rows that belong to no segment are neither read nor written."""

from __future__ import annotations

import torch
from torch import Tensor

from ..._checks import INDEX_DTYPES, check_same_device, check_tensor
from .._impl import ops_for, resolve


def _check(rows: Tensor, counts: Tensor, starts: Tensor, out: Tensor | None, out_rows: int | None,
           rows_name: str) -> Tensor:
    check_tensor(rows_name, rows, dim=2, contiguous=True)
    check_tensor("counts", counts, dim=2, dtypes=INDEX_DTYPES)
    check_tensor("starts", starts, shape=[counts.shape[0]], dtypes=INDEX_DTYPES)
    check_same_device(**{rows_name: rows}, counts=counts, starts=starts, out=out)
    if out is None:
        if out_rows is None or out_rows < 0:
            raise ValueError("give out or out_rows >= 0")
        out = torch.empty(out_rows, rows.shape[1], dtype=rows.dtype, device=rows.device)
    check_tensor("out", out, shape=[None, rows.shape[1]], dtypes=(rows.dtype,), contiguous=True)
    return out


def combine_shuffling(
    x: Tensor,
    counts: Tensor,
    starts: Tensor,
    *,
    out: Tensor | None = None,
    out_rows: int | None = None,
    impl: str | None = None,
) -> tuple[Tensor, Tensor]:
    """x [N, D] rank-major, counts [EP, El], starts [EP] -> (expert-major [out_rows, D], counts per
    local expert [El] int32). Rows past sum(counts) are not written."""
    out = _check(x, counts, starts, out, out_rows, "x")
    return ops_for(resolve(impl, x)).combine_shuffling(x, counts, starts, out)


def split_shuffling(
    y: Tensor,
    counts: Tensor,
    starts: Tensor,
    *,
    out: Tensor | None = None,
    out_rows: int | None = None,
    impl: str | None = None,
) -> Tensor:
    """y [M, D] expert-major, counts [EP, El], starts [EP] -> rank-major [out_rows, D]: row
    starts[r] + i holds source rank r's i-th row. Rows outside every segment are not written."""
    out = _check(y, counts, starts, out, out_rows, "y")
    return ops_for(resolve(impl, y)).split_shuffling(y, counts, starts, out)


__all__ = ["combine_shuffling", "split_shuffling"]
