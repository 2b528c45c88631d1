"""CombineShuffling / SplitShuffling in Triton: rank-major <-> expert-major row order for expert
parallelism, sizes read on the device (MetaShuffling's graph-mode EP path).

The rows form EP * El segments (source rank r, local expert e) of counts[r, e] rows. A segment
starts at ``starts[r] + sum(counts[r, :e])`` in rank-major order and at
``sum(counts[:, :e]) + sum(counts[:r, e])`` in expert-major order; combine copies each segment
from the first place to the second, split the other way. Every program rebuilds this small
layout from ``counts`` (EP * El values, a few hundred) and finds the segment of each of its
output rows, so one launch does the whole reorder; rows in no segment are neither read nor
written.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .._common import cdiv, next_power_of_2
from .._impl import kernel_op
from .._launch import launch


@triton.jit
def _shuffle_kernel(
    src_ptr,  # [n_src, D] rows to move
    dst_ptr,  # [n_dst, D] output (rows outside every segment untouched)
    counts_ptr,  # [EP, El] rows per (source rank, local expert)
    starts_ptr,  # [EP] first rank-major row of each source rank
    totals_ptr,  # [El] int32 rows per local expert (written when COMBINE)
    n_src,
    n_dst,
    D,
    EP,
    EL,
    stride_cr,  # counts strides (rank, expert)
    stride_ce,
    COMBINE: tl.constexpr,  # rank-major -> expert-major, else the reverse
    EPP: tl.constexpr,  # EP rounded up to a power of two
    ELP: tl.constexpr,  # El rounded up to a power of two
    ROWS: tl.constexpr,  # output rows per program
    BLOCK_D: tl.constexpr,  # columns per program (grid axis 1 covers D)
):
    e = tl.arange(0, ELP)[:, None]
    r = tl.arange(0, EPP)[None, :]
    c = tl.load(counts_ptr + r * stride_cr + e * stride_ce, mask=(e < EL) & (r < EP),
                other=0).to(tl.int64)  # [ELP, EPP], expert-major
    starts = tl.load(starts_ptr + tl.arange(0, EPP), mask=tl.arange(0, EPP) < EP,
                     other=0).to(tl.int64)
    per_expert = tl.sum(c, 1)  # [ELP]
    expert_major = (tl.cumsum(per_expert, 0) - per_expert)[:, None] + tl.cumsum(c, 1) - c
    rank_major = starts[None, :] + tl.cumsum(c, 0) - c
    if COMBINE:
        dst_start, src_start = expert_major, rank_major
    else:
        dst_start, src_start = rank_major, expert_major
    seg_dst = tl.reshape(dst_start, [ELP * EPP])
    seg_len = tl.reshape(c, [ELP * EPP])
    seg_shift = tl.reshape(src_start - dst_start, [ELP * EPP])

    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # [ROWS] output rows
    hit = (seg_dst[None, :] <= rows[:, None]) & (rows[:, None] < (seg_dst + seg_len)[None, :])
    src = rows + tl.sum(tl.where(hit, seg_shift[None, :], 0), 1)
    valid = (tl.max(hit.to(tl.int32), 1) > 0) & (rows < n_dst) & (src >= 0) & (src < n_src)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = valid[:, None] & (cols < D)[None, :]
    v = tl.load(src_ptr + src[:, None] * D + cols[None, :], mask=mask)
    tl.store(dst_ptr + rows.to(tl.int64)[:, None] * D + cols[None, :], v, mask=mask)
    if COMBINE:
        first = (tl.program_id(0) == 0) & (tl.program_id(1) == 0)
        ex = tl.arange(0, ELP)
        tl.store(totals_ptr + ex, per_expert.to(tl.int32), mask=(ex < EL) & first)


def _launch(src: Tensor, dst: Tensor, counts: Tensor, starts: Tensor, totals: Tensor | None,
            combine: bool) -> None:
    EP, El = counts.shape
    n_dst, D = dst.shape
    block_d = min(1024, next_power_of_2(max(D, 16)))
    rows = 4
    grid = (max(1, cdiv(n_dst, rows)), max(1, cdiv(D, block_d)))
    launch(_shuffle_kernel, grid,
        src, dst, counts, starts, totals if totals is not None else counts,
        src.shape[0], n_dst, D, EP, El, counts.stride(0), counts.stride(1),
        COMBINE=combine, EPP=max(2, next_power_of_2(EP)),
        ELP=max(2, next_power_of_2(El)), ROWS=rows, BLOCK_D=block_d, num_warps=4)


@kernel_op("combine_shuffling", mutates_args=("out", "totals"))
def _combine_op(x: Tensor, counts: Tensor, starts: Tensor, out: Tensor, totals: Tensor) -> None:
    if counts.numel() == 0:
        totals.zero_()
        return
    _launch(x, out, counts, starts, totals, combine=True)


@kernel_op("split_shuffling", mutates_args=("out",))
def _split_op(y: Tensor, counts: Tensor, starts: Tensor, out: Tensor) -> None:
    if counts.numel() == 0 or out.shape[0] == 0:
        return
    _launch(y, out, counts, starts, None, combine=False)


def combine_shuffling(x: Tensor, counts: Tensor, starts: Tensor, out: Tensor) -> tuple[Tensor, Tensor]:
    """x [N, D] rank-major -> (out [M, D] expert-major, counts per local expert [El] int32).
    Arguments were checked (and out allocated) by the public function."""
    totals = torch.empty(counts.shape[1], dtype=torch.int32, device=x.device)
    _combine_op(x, counts, starts, out, totals)
    return out, totals


def split_shuffling(y: Tensor, counts: Tensor, starts: Tensor, out: Tensor) -> Tensor:
    """y [M, D] expert-major -> out [N, D] rank-major (rows outside every segment untouched)."""
    _split_op(y, counts, starts, out)
    return out
