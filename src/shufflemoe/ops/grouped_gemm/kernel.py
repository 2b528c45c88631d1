"""Persistent grouped GEMM in Triton: MetaShuffling's GroupedGEMM (spec 000, "Kernel Design").

Rows of x are split into consecutive groups by m_sizes [G], which stays on the device. The work is
cut into tiles in the spec's order -- for g, for n-tile, for m-tile -- and tile t goes to program
t % num_programs (round-robin over a persistent grid of ctas_per_sm programs per SM). With the
m-tiles of one weight tile adjacent, programs running at the same time read the same weight tile,
so it comes from HBM once and from L2 after (and a group's rows stay in L2 across its n-tiles).

Each program loads m_sizes once into registers, prefix-sums rows and tiles per group, and finds
the group of each of its tiles with one vector reduction: no host sync, so the call is captured
in a CUDA graph and replayed with other m_sizes. Empty groups own no tiles and load no weights;
rows past sum(m_sizes) belong to no tile and are never written.

Loads: TMA (Hopper) through descriptors made on the host (``TensorDescriptor``, passed as
kernel arguments: the default, ~2 us per launch cheaper on an H100) or on the device
(``tl.make_tensor_descriptor``, needs ``triton.set_allocator``), else masked pointer loads (K
rows not 16-byte aligned, pre-Hopper GPUs, or the config says so; the interpreter runs all
three). The x descriptor covers all M rows, so a tile also loads rows of the next group; they
only produce output rows that the masked epilogue drops (the spec's "mask out the tokens that
belong to other experts"). The weight descriptor is [W*N, K]: a partial last n-tile reads the
next expert's rows (or TMA's zero fill) into columns that are not stored. fp8 dots use fast
accumulation (Triton's sm_90 default, as the spec's and torch._scaled_grouped_mm's).

Epilogue, in fp32: fp8 rowwise scales (x_scale[r] * w_scale[e, n]), row_weights[r], then either a
masked store into out [M, N] or an add into out[scatter_ids[r]] ([T, N]). The add is atomic in
out's dtype (Triton 3.6 emits 8-wide bf16 atomics on sm_90, ``atom.add.noftz.v8.bf16``), so a
row reached by k pairs is rounded k times and the sum order is not deterministic; the reference
adds in fp32. Measured cost on an H100, 16384 rows x N=5120, K=1024: 270 -> 335 us (bf16). When
the caller guarantees that no two rows share a destination (top-1 routing; one expert's rows),
``scatter_unique`` makes it a plain read, float32 add, one rounding and store instead.
fp32 inputs multiply as IEEE fp32 (input_precision="ieee", FMA-based, slow but exact to fp32):
tf32 would silently round them to 10 mantissa bits.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.tools.tensor_descriptor import TensorDescriptor

from .._impl import interpreting, kernel_op
from ..quantize import FP8_DTYPE
from . import configs

_INTERPRETER_PROGRAMS = 3  # several programs, so the round-robin is exercised on the CPU too


@triton.jit
def _locate_combine(a0, a1, a2, a3, b0, b1, b2, b3):
    return a0 + b0, a1 + b1, a2 + b2, tl.minimum(a3, b3)


@triton.jit
def _k_step(acc, k0, row0, w_row0, rows, row_ok, w_rows, col_ok, x_ptr, w_ptr, x_desc, w_desc, K,
            BLOCK_K: tl.constexpr, USE_TMA: tl.constexpr, SWAP_AB: tl.constexpr,
            UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """acc += x[rows, k0:k0+BLOCK_K] @ w[w_rows, k0:k0+BLOCK_K]^T (transposed when SWAP_AB)."""
    if USE_TMA:
        a = x_desc.load([row0, k0])
        b = w_desc.load([w_row0, k0])
    else:
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        a = tl.load(x_ptr + rows.to(tl.int64)[:, None] * K + ks[None, :],
                    mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(w_ptr + w_rows[:, None] * K + ks[None, :],
                    mask=col_ok[:, None] & k_ok[None, :], other=0.0)
    if UPCAST:  # interpreter: its bf16 dot is wrong (Triton 3.6); fp32 of bf16/fp8 is exact
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    if SWAP_AB:
        acc = tl.dot(b, a.T, acc, input_precision=DOT_PRECISION)
    else:
        acc = tl.dot(a, b.T, acc, input_precision=DOT_PRECISION)
    return acc


@triton.jit
def _tile(
    t,  # tile index in the global order
    m,  # [BLOCK_G] rows per group
    tiles,  # [BLOCK_G] tiles per group
    tile_end,  # [BLOCK_G] inclusive prefix sum of tiles
    row_end,  # [BLOCK_G] inclusive prefix sum of m
    x_ptr, w_ptr, x_desc, w_desc, weight_ids_ptr, x_scale_ptr, w_scale_ptr, row_weights_ptr,
    scatter_ids_ptr, out_ptr, M, N, K,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    USE_TMA: tl.constexpr, SWAP_AB: tl.constexpr, FP8: tl.constexpr,
    HAS_WEIGHT_IDS: tl.constexpr, HAS_ROW_WEIGHTS: tl.constexpr, SCATTER: tl.constexpr,
    UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr, INTERPRET: tl.constexpr,
):
    # Group g of tile t: the groups before it are those whose tiles end at or before t (empty
    # groups included); one 4-way reduction gives g, its first row, its first tile, its row end.
    before = tile_end <= t
    g, row_start, tile_start, row_stop = tl.reduce(
        (before.to(tl.int32), tl.where(before, m, 0), tl.where(before, tiles, 0),
         tl.where(before, 0x7FFFFFFF, row_end)), 0, _locate_combine)
    m_tiles = tl.cdiv(row_stop - row_start, BLOCK_M)
    local = t - tile_start
    n_tile = local // m_tiles
    row0 = row_start + (local - n_tile * m_tiles) * BLOCK_M
    n0 = n_tile * BLOCK_N
    if HAS_WEIGHT_IDS:
        wid = tl.load(weight_ids_ptr + g).to(tl.int32)
    else:
        wid = g
    rows = row0 + tl.arange(0, BLOCK_M)
    cols = n0 + tl.arange(0, BLOCK_N)
    row_ok = (rows < row_stop) & (rows < M)
    col_ok = cols < N
    w_rows = wid.to(tl.int64) * N + cols  # [BLOCK_N] rows of w viewed as [W*N, K]

    if SWAP_AB:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if INTERPRET:
        k0 = 0
        while k0 < K:
            acc = _k_step(acc, k0, row0, wid * N + n0, rows, row_ok, w_rows, col_ok, x_ptr, w_ptr,
                          x_desc, w_desc, K, BLOCK_K, USE_TMA, SWAP_AB, UPCAST, DOT_PRECISION)
            k0 += BLOCK_K
    else:
        for k0 in range(0, K, BLOCK_K):
            acc = _k_step(acc, k0, row0, wid * N + n0, rows, row_ok, w_rows, col_ok, x_ptr, w_ptr,
                          x_desc, w_desc, K, BLOCK_K, USE_TMA, SWAP_AB, UPCAST, DOT_PRECISION)
    if SWAP_AB:
        acc = acc.T

    if FP8:
        xs = tl.load(x_scale_ptr + rows, mask=row_ok, other=0.0)
        ws = tl.load(w_scale_ptr + w_rows, mask=col_ok, other=0.0)
        acc = acc * xs[:, None] * ws[None, :]
    if HAS_ROW_WEIGHTS:
        acc = acc * tl.load(row_weights_ptr + rows, mask=row_ok, other=0.0)[:, None]
    val = acc.to(out_ptr.dtype.element_ty)
    mask = row_ok[:, None] & col_ok[None, :]
    if SCATTER == "atomic":
        dst = tl.load(scatter_ids_ptr + rows, mask=row_ok, other=0).to(tl.int64)
        tl.atomic_add(out_ptr + dst[:, None] * N + cols[None, :], val, mask=mask, sem="relaxed")
    elif SCATTER == "unique":  # this program is the only writer of these rows of out
        dst = tl.load(scatter_ids_ptr + rows, mask=row_ok, other=0).to(tl.int64)
        ptrs = out_ptr + dst[:, None] * N + cols[None, :]
        old = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
        tl.store(ptrs, (old + acc).to(out_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(out_ptr + rows.to(tl.int64)[:, None] * N + cols[None, :], val, mask=mask)


@triton.jit
def _grouped_gemm_kernel(
    x_ptr,  # [M, K] rows sorted by group
    w_ptr,  # [W, N, K] weights, K contiguous
    m_sizes_ptr,  # [G] rows per group (int32/int64, on the device)
    weight_ids_ptr,  # [G] weight matrix of each group (HAS_WEIGHT_IDS)
    x_scale_ptr,  # [M] fp32 per-row scales (FP8)
    w_scale_ptr,  # [W, N] fp32 per-output-channel scales (FP8)
    row_weights_ptr,  # [M] fp32 (HAS_ROW_WEIGHTS)
    scatter_ids_ptr,  # [M] destination row in out (SCATTER != "none")
    out_ptr,  # [M, N], or [T, N] accumulated into (SCATTER != "none")
    x_host_desc,  # TensorDescriptor over x [M, K] (TMA == "host"), else None
    w_host_desc,  # TensorDescriptor over w [W*N, K] (TMA == "host"), else None
    M, N, K, G, W,
    num_programs,  # persistent programs in the grid
    BLOCK_G: tl.constexpr,  # next power of two >= G
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    TMA: tl.constexpr,  # "device" | "host" | "none"
    SWAP_AB: tl.constexpr, FLATTEN: tl.constexpr, FP8: tl.constexpr,
    HAS_WEIGHT_IDS: tl.constexpr, HAS_ROW_WEIGHTS: tl.constexpr,
    SCATTER: tl.constexpr,  # "none" (store), "atomic" (add), "unique" (read-add-store)
    UPCAST: tl.constexpr,  # cast tiles to fp32 before tl.dot (interpreter)
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 inputs (tf32 would drop 13 mantissa bits)
    INTERPRET: tl.constexpr,  # the interpreter needs a while loop (range() of a tensor fails)
):
    pid = tl.program_id(0)
    offs_g = tl.arange(0, BLOCK_G)
    m = tl.load(m_sizes_ptr + offs_g, mask=offs_g < G, other=0).to(tl.int32)
    m = tl.maximum(m, 0)
    tiles = tl.cdiv(m, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    tile_end = tl.cumsum(tiles, 0)
    row_end = tl.cumsum(m, 0)
    total = tl.sum(tiles, 0)

    if TMA == "device":
        x_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[K, 1],
                                           block_shape=[BLOCK_M, BLOCK_K])
        w_desc = tl.make_tensor_descriptor(w_ptr, shape=[W * N, K], strides=[K, 1],
                                           block_shape=[BLOCK_N, BLOCK_K])
    else:
        x_desc = x_host_desc
        w_desc = w_host_desc

    if INTERPRET:
        t = pid
        while t < total:
            _tile(t, m, tiles, tile_end, row_end, x_ptr, w_ptr, x_desc, w_desc, weight_ids_ptr,
                  x_scale_ptr, w_scale_ptr, row_weights_ptr, scatter_ids_ptr, out_ptr, M, N, K,
                  BLOCK_M, BLOCK_N, BLOCK_K, TMA != "none", SWAP_AB, FP8, HAS_WEIGHT_IDS,
                  HAS_ROW_WEIGHTS, SCATTER, UPCAST, DOT_PRECISION, INTERPRET)
            t += num_programs
    else:
        for t in tl.range(pid, total, num_programs, flatten=FLATTEN):
            _tile(t, m, tiles, tile_end, row_end, x_ptr, w_ptr, x_desc, w_desc, weight_ids_ptr,
                  x_scale_ptr, w_scale_ptr, row_weights_ptr, scatter_ids_ptr, out_ptr, M, N, K,
                  BLOCK_M, BLOCK_N, BLOCK_K, TMA != "none", SWAP_AB, FP8, HAS_WEIGHT_IDS,
                  HAS_ROW_WEIGHTS, SCATTER, UPCAST, DOT_PRECISION, INTERPRET)


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _ensure_allocator() -> None:
    """Device-made TMA descriptors need a global scratch buffer from Triton's allocator; install
    one (a torch tensor, so it follows graph capture) unless the caller already set one."""
    from triton.runtime import _allocation

    if isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        triton.set_allocator(
            lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device="cuda"))


def tma_mode(cfg: configs.TileConfig, x: Tensor, w: Tensor) -> str:
    """The TMA mode the kernel will use: cfg.tma when the hardware and the shapes allow, else
    "none" (TMA needs 16-byte aligned bases and row strides, i.e. K * itemsize % 16 == 0)."""
    K = x.shape[1]
    if cfg.tma == "none" or K == 0 or (K * x.element_size()) % 16:
        return "none"
    if x.data_ptr() % 16 or w.data_ptr() % 16:
        return "none"
    if x.is_cuda and torch.cuda.get_device_capability(x.device)[0] < 9:
        return "none"
    return cfg.tma


@kernel_op("grouped_gemm", mutates_args=("out",))
def _grouped_gemm_op(x: Tensor, w: Tensor, m_sizes: Tensor, x_scale: Optional[Tensor],
                     w_scale: Optional[Tensor], weight_ids: Optional[Tensor],
                     row_weights: Optional[Tensor], scatter_ids: Optional[Tensor], out: Tensor,
                     scatter_unique: bool) -> None:
    M, K = x.shape
    W, N, _ = w.shape
    G = m_sizes.shape[0]
    if M == 0 or N == 0 or G == 0:
        return
    if W * N >= 2**31:
        raise ValueError(f"w has {W} x {N} rows; the kernel indexes them with int32 (< 2**31)")
    cfg = configs.select(M, N, K, G, x.dtype)
    if x.dtype == FP8_DTYPE and cfg.block_k < 32:  # fp8 tensor-core dots need K >= 32
        cfg = cfg.with_(block_k=32)
    interpret = interpreting()
    tma = tma_mode(cfg, x, w)
    x_desc = w_desc = None
    if tma == "host":
        x_desc = TensorDescriptor(x, [M, K], [K, 1], [cfg.block_m, cfg.block_k])
        w2 = w.view(W * N, K)
        w_desc = TensorDescriptor(w2, [W * N, K], [K, 1], [cfg.block_n, cfg.block_k])
    elif tma == "device" and not interpret:
        _ensure_allocator()
    # Tiles can number at most n_tiles * (M // BLOCK_M + nonempty groups): no idle programs.
    max_tiles = triton.cdiv(N, cfg.block_n) * (M // cfg.block_m + min(G, M))
    sms = _INTERPRETER_PROGRAMS if interpret else _sm_count(x.device.index or 0) * cfg.ctas_per_sm
    num_programs = max(1, min(sms, max_tiles))
    upcast = interpret and x.dtype in (torch.bfloat16, FP8_DTYPE)
    # The interpreter has no 16-bit atomic add: accumulate into an fp32 copy there.
    dst = out.float() if interpret and scatter_ids is not None else out
    with torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext():
        _grouped_gemm_kernel[(num_programs,)](
            x, w, m_sizes, weight_ids, x_scale, w_scale, row_weights, scatter_ids, dst,
            x_desc, w_desc, M, N, K, G, W, num_programs,
            BLOCK_G=triton.next_power_of_2(G), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
            BLOCK_K=cfg.block_k, TMA=tma, SWAP_AB=cfg.swap_ab,
            FLATTEN=cfg.flatten, FP8=x.dtype == FP8_DTYPE, HAS_WEIGHT_IDS=weight_ids is not None,
            HAS_ROW_WEIGHTS=row_weights is not None,
            SCATTER="none" if scatter_ids is None else "unique" if scatter_unique else "atomic",
            UPCAST=upcast, DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
            INTERPRET=interpret, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )
    if dst is not out:
        out.copy_(dst)


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
    scatter_unique: bool = False,
) -> Tensor:
    """Arguments already validated by ``ops.grouped_gemm``: x [M, K], w [W, N, K], m_sizes [G]
    -> out [M, N] (or out [T, N] += scattered rows)."""
    if out is None:
        out = torch.empty((x.shape[0], w.shape[1]), dtype=out_dtype, device=x.device)
    _grouped_gemm_op(x, w, m_sizes, x_scale, w_scale, weight_ids, row_weights, scatter_ids, out,
                     scatter_unique)
    return out
