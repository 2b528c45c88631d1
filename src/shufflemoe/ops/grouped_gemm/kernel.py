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

Weight formats (QUANT, see ops/quantize/formats.py), each a branch of two helpers, _load_w (the
weight tile of a K step) and _epilogue_scale_bias: fp8_rowwise (e4m3 x and w, per-row scales in
the epilogue); fp8_w8a16 (e4m3 w converted to x's dtype in the K step, exact; w_scale[n] in the
epilogue); fp8_block (e4m3 x and w; each K step lies in one 128-column block, so its product is
scaled by x_scale[r, kb] * w_scale[e, nb(n), kb] before it is accumulated, as DeepSeek-V3's
kernels do); mxfp4 (two e2m1 a byte and one e8m0 scale per 32 along K, dequantized exactly to
float32 in the K step and converted to x's dtype, exact). The packed weights stream at a quarter
of bf16's bytes, which is what decode is bound by. On the swapped 16-row tiles (TileConfig
.run_order) the decoded tile has its columns in mxfp4_run_order (a thread's bytes of each 16-byte
run adjacent in shared memory: one load where there were four single bytes) and x's tile is
permuted alike in registers: the dot sums the same products, grouped into other k16 steps.

Gathered rows (GATHER, 16-bit or fp32 x only): row r of the product is x[x_ids[r]], loaded
through pointers whatever the weights take, so the unfused MoE path needs no [A, D] copy of its
rows. (Rows scaled in registers before the MMA, x_ids with weights, gave wrong sums in 128x256x64
8-warp tiles without the flattened loop on an H100, Triton 3.6, fb4150c's GPU tests, and paid
only at small T: removed, gather_scale scales rows.)

GLU (16-bit or fp32 x only): a tile takes BLOCK_N gate rows and the BLOCK_N up rows N / 2
further on, and its epilogue stores act(gate, up) [M, N / 2] from the fp32 sums (after bias and
scales), as the fused decode kernels do: no [M, N] product stored and read again by silu_mul. A
plain tile loads both halves as one [2 BLOCK_N, BLOCK_K] weight tile a K step (through TMA one
box of a 3-D descriptor over w viewed as [2 W, N / 2, K], where gate and up matrices alternate)
for one dot as wide as a plain tile's, and splits the sums; a swapped tile (weights as the MMA's
M side) loads two [BLOCK_N, BLOCK_K] tiles for two dots and two accumulators, since the 3-D
box reached its MMA through registers (offline sm_90 SASS: LDSM and a register-operand wgmma)
where the plain tile's stays in shared memory.

Tail rows (TAIL_M, TileConfig.tail_m; not with SWAP_AB or a GLU): a group's last m-tile takes
up to TAIL_M rows past its BLOCK_M, multiplied in each K step by the weight tile already in shared
memory in a second, swapped dot (the rows as the MMA's N side, their own accumulator and epilogue):
a group of up to BLOCK_M + TAIL_M rows reads its weights once instead of in a second, nearly empty
tile. Tiles a group: cdiv(max(m - TAIL_M, 1), BLOCK_M) for m > 0. Only a tile that has rows past
its BLOCK_M runs the loop with the second dot; the others run the plain one.

Epilogue, in fp32: rowwise scales, bias[e, n] (HAS_BIAS), row_weights[r], then either a
masked store into out [M, N] or a scatter into out[scatter_ids[r]] ([T, N]). ``scatter``
"add" is atomic in out's dtype (Triton 3.6 emits 8-wide bf16 atomics on sm_90,
``atom.add.noftz.v8.bf16``), so a row reached by k pairs is rounded k times and the sum order is
not deterministic; the reference adds in fp32. Measured cost on an H100, 16384 rows x N=5120,
K=1024: 270 -> 335 us (bf16). When the caller guarantees that no two rows share a destination
(top-1 routing; one expert's rows), "add_unique" makes it a plain read, float32 add, one rounding
and store instead, and "store" overwrites the rows without reading them (the caller wants none
of out's old values): at a prefill of Llama 4 Scout TP8 (16384 rows) the read costs GEMM2 +28%
bf16, +134% fp8 (H100, benchmarks/results/probe_prefill.json), the epilogue waiting on it.
fp32 inputs multiply as IEEE fp32 (input_precision="ieee", FMA-based, slow but exact to fp32):
tf32 would silently round them to 10 mantissa bits.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.tools.tensor_descriptor import TensorDescriptor

from .._common import cdiv, device_sms, next_power_of_2, on_device, traced
from .._impl import interpreting, kernel_op
from .._launch import launch
from ..quantize import FP8_BLOCK, FP8_DTYPE, MX_GROUP
from ..quantize.kernel import e4m3_to, mxfp4_run_order, mxfp4_values
from ..silu_mul.kernel import glu_f32
from . import configs

_INTERPRETER_PROGRAMS = 3  # several programs, so the round-robin is exercised on the CPU too
# Swapped tiles' rows (the wgmma's N side) at most: 256-row swapped tiles, fp8_w8a16 and mxfp4,
# gave non-deterministic wrong sums on Qwen3-30B-A3B's down GEMM (K = 768, groups of ~128 rows)
# in 30 of 30 runs under Triton 3.6 on an H200 (whole output tiles of garbage), while right
# under the interpreter and on other shapes (benchmarks/results/probe_swap256_24e962d.json and
# probe_swap256_stress_dd4e678.json): the kernel refuses them.
SWAP_MAX_ROWS = 128


@triton.jit
def _locate_combine(a0, a1, a2, a3, b0, b1, b2, b3):
    return a0 + b0, a1 + b1, a2 + b2, tl.minimum(a3, b3)


@triton.jit
def _box(w_desc, w_row0, w_n0, k, WN: tl.constexpr, GLU: tl.constexpr, SWAP_AB: tl.constexpr):
    """The TMA box of the weight tile at column k: rows w_row0.. of w viewed as [W*N, K], or (a
    GLU tile not swapped) matrix w_row0 (gate) and the next (up) of w viewed as [2 W, N / 2, K]
    from row w_n0, one [WN, *] tile."""
    if GLU == "none":
        b = w_desc.load([w_row0, k])
    elif SWAP_AB:
        b = w_desc.load([w_row0, k])
    else:
        b = w_desc.load([w_row0, w_n0, k])
        b = b.reshape(WN, b.shape[2])
    return b


@triton.jit
def _load_w(k0, w_row0, w_n0, w_rows, col_ok, w_ptr, w_desc, w_scale_ptr, K,
            BLOCK_K: tl.constexpr, USE_TMA: tl.constexpr, QUANT: tl.constexpr,
            GLU: tl.constexpr, SWAP_AB: tl.constexpr, UPCAST: tl.constexpr,
            RUN_ORDER: tl.constexpr):
    """The weight tile w[w_rows, k0:k0+BLOCK_K] [len(w_rows), BLOCK_K]: as stored (bf16, fp8),
    or dequantized (mxfp4: packed [len(w_rows), BLOCK_K / 2] bytes and their scales; to bf16, or
    to float32 under the interpreter; RUN_ORDER: its columns in mxfp4_run_order, as _load_x's).
    Through TMA, _box's box at (w_row0, w_n0)."""
    WN: tl.constexpr = w_rows.shape[0]
    if QUANT == "mxfp4":
        if USE_TMA:
            packed = _box(w_desc, w_row0, w_n0, k0 // 2, WN, GLU, SWAP_AB)
        else:
            js = k0 // 2 + tl.arange(0, BLOCK_K // 2)
            packed = tl.load(w_ptr + w_rows[:, None] * (K // 2) + js[None, :],
                             mask=col_ok[:, None] & (js < K // 2)[None, :], other=0)
        gs = k0 // 32 + tl.arange(0, BLOCK_K // 32)
        s = tl.load(w_scale_ptr + w_rows[:, None] * (K // 32) + gs[None, :],
                    mask=col_ok[:, None] & (gs < K // 32)[None, :], other=0)
        b = mxfp4_values(packed, s, WN, BLOCK_K, UPCAST, RUN_ORDER)
    elif USE_TMA:
        b = _box(w_desc, w_row0, w_n0, k0, WN, GLU, SWAP_AB)
    else:
        ks = k0 + tl.arange(0, BLOCK_K)
        b = tl.load(w_ptr + w_rows[:, None] * K + ks[None, :],
                    mask=col_ok[:, None] & (ks < K)[None, :], other=0.0)
    return b


@triton.jit
def _load_x(k0, row0, row_ok, a_rows, x_ptr, x_desc, K, BLOCK_K: tl.constexpr,
            USE_TMA: tl.constexpr, GATHER: tl.constexpr, RUN_ORDER: tl.constexpr):
    """x[a_rows, k0:k0+BLOCK_K]: the tile's rows (through TMA from row0), or the x rows they
    gather (GATHER); RUN_ORDER: its columns in mxfp4_run_order (a permutation of registers),
    as the mxfp4 weight tile's."""
    if USE_TMA and GATHER == "none":
        a = x_desc.load([row0, k0])
    else:
        ks = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(x_ptr + a_rows[:, None] * K + ks[None, :],
                    mask=row_ok[:, None] & (ks < K)[None, :], other=0.0)
    if RUN_ORDER:
        a = mxfp4_run_order(a)
    return a


@triton.jit
def _mma(acc, a, b, k0, rows, row_ok, ws_rows, col_ok, x_scale_ptr, w_scale_ptr, KB,
         SWAP_AB: tl.constexpr, QUANT: tl.constexpr, UPCAST: tl.constexpr,
         DOT_PRECISION: tl.constexpr):
    """acc += a @ b^T (transposed when SWAP_AB); fp8_block scales this step's product by its
    128-column block's scales first."""
    if UPCAST:  # interpreter: its bf16 dot is wrong (Triton 3.6); fp32 of bf16/fp8 is exact
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    elif QUANT == "fp8_w8a16":  # weight-only: exact in x's dtype
        b = e4m3_to(b, a.dtype)
    elif QUANT == "mxfp4":
        b = b.to(a.dtype)
    if QUANT == "fp8_block":  # the K step lies inside one 128-column block (BLOCK_K <= 128)
        kb = k0 // 128
        xs = tl.load(x_scale_ptr + rows.to(tl.int64) * KB + kb, mask=row_ok, other=0.0)
        ws = tl.load(w_scale_ptr + ws_rows * KB + kb, mask=col_ok, other=0.0)
        if SWAP_AB:
            part = tl.dot(b, a.T, input_precision=DOT_PRECISION)
            acc += part * ws[:, None] * xs[None, :]
        else:
            part = tl.dot(a, b.T, input_precision=DOT_PRECISION)
            acc += part * xs[:, None] * ws[None, :]
    elif SWAP_AB:
        acc = tl.dot(b, a.T, acc, input_precision=DOT_PRECISION)
    else:
        acc = tl.dot(a, b.T, acc, input_precision=DOT_PRECISION)
    return acc


@triton.jit
def _k_step(acc, acc_u, acc_t, k0, row0, w_row0, w_n0, rows, row_ok, a_rows, w_rows, col_ok,
            ws_rows, row_t0, rows_t, row_ok_t, a_rows_t, x_ptr, w_ptr, x_desc, x_tail_desc,
            w_desc, x_scale_ptr, w_scale_ptr, K, KB, N_OUT,
            BLOCK_K: tl.constexpr, TAIL_M: tl.constexpr,
            USE_TMA: tl.constexpr, SWAP_AB: tl.constexpr, QUANT: tl.constexpr,
            GATHER: tl.constexpr, GLU: tl.constexpr, UPCAST: tl.constexpr,
            DOT_PRECISION: tl.constexpr, RUN_ORDER: tl.constexpr, STEP_K: tl.constexpr):
    """One K step: acc += x[rows] @ w[w_rows]^T over k0:k0+STEP_K, loaded and multiplied in parts
    of BLOCK_K (with a GLU, w_rows are the gate rows and then the up rows: one dot; swapped,
    w_rows are the gate rows and acc_u += the same rows against the up rows, N_OUT rows further
    on); with TAIL_M, also acc_t += the same weight tile against the tail rows (rows_t), swapped,
    issued first. RUN_ORDER (mxfp4): both tiles' columns in mxfp4_run_order, the same products
    summed."""
    for h in tl.static_range(STEP_K // BLOCK_K):
        kp = k0 + h * BLOCK_K
        a = _load_x(kp, row0, row_ok, a_rows, x_ptr, x_desc, K, BLOCK_K, USE_TMA, GATHER,
                    RUN_ORDER)
        b = _load_w(kp, w_row0, w_n0, w_rows, col_ok, w_ptr, w_desc, w_scale_ptr, K, BLOCK_K,
                    USE_TMA, QUANT, GLU, SWAP_AB, UPCAST, RUN_ORDER)
        if TAIL_M > 0:  # issued before the main dot: 3-10% faster tiles (probe_tail_forms)
            a_t = _load_x(kp, row_t0, row_ok_t, a_rows_t, x_ptr, x_tail_desc, K, BLOCK_K,
                          USE_TMA, GATHER, RUN_ORDER)
            acc_t = _mma(acc_t, a_t, b, kp, rows_t, row_ok_t, ws_rows, col_ok, x_scale_ptr,
                         w_scale_ptr, KB, True, QUANT, UPCAST, DOT_PRECISION)
        acc = _mma(acc, a, b, kp, rows, row_ok, ws_rows, col_ok, x_scale_ptr, w_scale_ptr, KB,
                   SWAP_AB, QUANT, UPCAST, DOT_PRECISION)
        if GLU != "none" and SWAP_AB:
            b = _load_w(kp, w_row0 + N_OUT, w_n0, w_rows + N_OUT, col_ok, w_ptr, w_desc,
                        w_scale_ptr, K, BLOCK_K, USE_TMA, QUANT, GLU, SWAP_AB, UPCAST,
                        RUN_ORDER)
            acc_u = _mma(acc_u, a, b, kp, rows, row_ok, ws_rows, col_ok, x_scale_ptr,
                         w_scale_ptr, KB, SWAP_AB, QUANT, UPCAST, DOT_PRECISION)
    return acc, acc_u, acc_t


@triton.jit
def _epilogue_scale_bias(acc, rows, row_ok, w_rows, col_ok, x_scale_ptr, w_scale_ptr, bias_ptr,
                         QUANT: tl.constexpr, HAS_BIAS: tl.constexpr):
    """acc [BLOCK_M, BLOCK_N] fp32 -> times the rowwise scales (fp8_rowwise: x_scale[r] *
    w_scale[n]; fp8_w8a16: w_scale[n]), plus bias[n] of the tile's weight matrix."""
    if QUANT == "fp8_rowwise":
        xs = tl.load(x_scale_ptr + rows, mask=row_ok, other=0.0)
        ws = tl.load(w_scale_ptr + w_rows, mask=col_ok, other=0.0)
        acc = acc * xs[:, None] * ws[None, :]
    elif QUANT == "fp8_w8a16":
        acc = acc * tl.load(w_scale_ptr + w_rows, mask=col_ok, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + w_rows, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    return acc


@triton.jit
def _m_tiles(m, BLOCK_M: tl.constexpr, TAIL_M: tl.constexpr):
    """The m-tiles of groups of m rows: BLOCK_M rows each, the last one up to TAIL_M more."""
    if TAIL_M > 0:
        n = tl.where(m > 0, tl.cdiv(tl.maximum(m - TAIL_M, 1), BLOCK_M), 0)
    else:
        n = tl.cdiv(m, BLOCK_M)
    return n


@triton.jit
def _tile(
    t,  # tile index in the global order
    m,  # [BLOCK_G] rows per group
    tiles,  # [BLOCK_G] tiles per group
    tile_end,  # [BLOCK_G] inclusive prefix sum of tiles
    row_end,  # [BLOCK_G] inclusive prefix sum of m
    x_ptr, w_ptr, x_desc, x_tail_desc, w_desc, weight_ids_ptr, x_scale_ptr, w_scale_ptr,
    bias_ptr, row_weights_ptr, scatter_ids_ptr, x_ids_ptr, out_ptr, M, N, N_OUT, K, NB, KB,
    SPLIT, alpha, limit,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, TAIL_M: tl.constexpr,
    USE_TMA: tl.constexpr, SWAP_AB: tl.constexpr, QUANT: tl.constexpr, HAS_BIAS: tl.constexpr,
    HAS_WEIGHT_IDS: tl.constexpr, HAS_ROW_WEIGHTS: tl.constexpr, SCATTER: tl.constexpr,
    GATHER: tl.constexpr, GLU: tl.constexpr, HAS_LIMIT: tl.constexpr, UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr, INTERPRET: tl.constexpr, RUN_ORDER: tl.constexpr,
    STEP_K: tl.constexpr,
):
    # Group g of tile t: the groups before it are those whose tiles end at or before t (empty
    # groups included); one 4-way reduction gives g, its first row, its first tile, its row end.
    before = tile_end <= t
    g, row_start, tile_start, row_stop = tl.reduce(
        (before.to(tl.int32), tl.where(before, m, 0), tl.where(before, tiles, 0),
         tl.where(before, 0x7FFFFFFF, row_end)), 0, _locate_combine)
    m_tiles = _m_tiles(row_stop - row_start, BLOCK_M, TAIL_M)
    local = t - tile_start
    n_tile = local // m_tiles
    m_tile = local - n_tile * m_tiles
    row0 = row_start + m_tile * BLOCK_M
    n0 = n_tile * BLOCK_N
    if HAS_WEIGHT_IDS:
        wid = tl.load(weight_ids_ptr + g).to(tl.int32)
    else:
        wid = g
    rows = row0 + tl.arange(0, BLOCK_M)
    cols = n0 + tl.arange(0, BLOCK_N)  # output columns: with a GLU, gate rows (up: + N_OUT)
    row_ok = (rows < row_stop) & (rows < M)
    col_ok = cols < N_OUT
    if GATHER == "none":
        a_rows = rows.to(tl.int64)
    else:  # only the tile's own rows are looked up: past row_stop the ids may be anything
        a_rows = tl.load(x_ids_ptr + rows, mask=row_ok, other=0).to(tl.int64)
    w_rows = wid.to(tl.int64) * N + cols  # [BLOCK_N] rows of w viewed as [W*N, K]
    if GLU != "none" and not SWAP_AB:
        # The K loop's weight tile: BLOCK_N gate rows, then their up rows N_OUT further (TMA: w
        # viewed as [2 W, N_OUT, K], matrix 2 wid and the next, from row n0); acc is as wide.
        j = tl.arange(0, 2 * BLOCK_N)
        k_cols = n0 + j % BLOCK_N
        k_col_ok = k_cols < N_OUT
        k_rows = wid.to(tl.int64) * N + k_cols + (j // BLOCK_N) * N_OUT
        w_row0 = 2 * wid
        ACC_N: tl.constexpr = 2 * BLOCK_N
    else:
        k_col_ok = col_ok
        k_rows = w_rows
        w_row0 = wid * N + n0
        ACC_N: tl.constexpr = BLOCK_N
    if QUANT == "fp8_block":  # each column's scale-block row; blocks restart at SPLIT (up half)
        blk = tl.where(cols < SPLIT, cols // 128, tl.cdiv(SPLIT, 128) + (cols - SPLIT) // 128)
        ws_rows = wid.to(tl.int64) * NB + blk
    else:
        ws_rows = k_rows
    if SWAP_AB:
        acc = tl.zeros((ACC_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, ACC_N), dtype=tl.float32)
    if GLU != "none" and SWAP_AB:  # the up rows' own accumulator
        acc_u = tl.zeros_like(acc)
    else:
        acc_u = tl.zeros((1,), dtype=tl.float32)  # unused
    no_tail = tl.zeros((1,), dtype=tl.float32)  # the K loop's acc_t without tail rows (unused)
    if TAIL_M > 0:
        # A group's last tile holds up to BLOCK_M + TAIL_M rows: those past BLOCK_M take a
        # second, swapped dot against the same weight tile (rows as the MMA's N side). Only
        # tiles that have such rows run it: the rest run the plain K loop.
        if (m_tile == m_tiles - 1) & (row0 + BLOCK_M < row_stop):
            row_t0 = row0 + BLOCK_M
            rows_t = row_t0 + tl.arange(0, TAIL_M)
            row_ok_t = (rows_t < row_stop) & (rows_t < M)
            if GATHER == "none":
                a_rows_t = rows_t.to(tl.int64)
            else:
                a_rows_t = tl.load(x_ids_ptr + rows_t, mask=row_ok_t, other=0).to(tl.int64)
            acc_t = tl.zeros((BLOCK_N, TAIL_M), dtype=tl.float32)
            acc, acc_u, acc_t = _k_loop(
                acc, acc_u, acc_t, row0, w_row0, n0, rows, row_ok, a_rows, k_rows, k_col_ok,
                ws_rows, row_t0, rows_t, row_ok_t, a_rows_t, x_ptr, w_ptr, x_desc, x_tail_desc,
                w_desc, x_scale_ptr, w_scale_ptr, K, KB, N_OUT, BLOCK_K, TAIL_M, USE_TMA,
                SWAP_AB, QUANT, GATHER, GLU, UPCAST, DOT_PRECISION, INTERPRET, RUN_ORDER, STEP_K)
            _epilogue(acc_t.T, acc_u, rows_t, row_ok_t, cols, col_ok, w_rows, x_scale_ptr,
                      w_scale_ptr, bias_ptr, row_weights_ptr, scatter_ids_ptr, out_ptr, N, N_OUT,
                      alpha, limit, QUANT, HAS_BIAS, HAS_ROW_WEIGHTS, SCATTER, GLU, HAS_LIMIT)
        else:
            acc, acc_u, no_tail = _k_loop(
                acc, acc_u, no_tail, row0, w_row0, n0, rows, row_ok, a_rows, k_rows, k_col_ok,
                ws_rows, row0, rows, row_ok, a_rows, x_ptr, w_ptr, x_desc, x_tail_desc, w_desc,
                x_scale_ptr, w_scale_ptr, K, KB, N_OUT, BLOCK_K, 0, USE_TMA, SWAP_AB,
                QUANT, GATHER, GLU, UPCAST, DOT_PRECISION, INTERPRET, RUN_ORDER, STEP_K)
    else:
        acc, acc_u, no_tail = _k_loop(
            acc, acc_u, no_tail, row0, w_row0, n0, rows, row_ok, a_rows, k_rows, k_col_ok,
            ws_rows, row0, rows, row_ok, a_rows, x_ptr, w_ptr, x_desc, x_tail_desc, w_desc,
            x_scale_ptr, w_scale_ptr, K, KB, N_OUT, BLOCK_K, 0, USE_TMA, SWAP_AB, QUANT, GATHER,
            GLU, UPCAST, DOT_PRECISION, INTERPRET, RUN_ORDER, STEP_K)
    if SWAP_AB:
        acc = acc.T
        if GLU != "none":
            acc_u = acc_u.T
    elif GLU != "none":  # [BLOCK_M, 2 BLOCK_N] -> the gate half and the up half
        acc, acc_u = acc.reshape(BLOCK_M, 2, BLOCK_N).permute(0, 2, 1).split()
    _epilogue(acc, acc_u, rows, row_ok, cols, col_ok, w_rows, x_scale_ptr, w_scale_ptr, bias_ptr,
              row_weights_ptr, scatter_ids_ptr, out_ptr, N, N_OUT, alpha, limit, QUANT, HAS_BIAS,
              HAS_ROW_WEIGHTS, SCATTER, GLU, HAS_LIMIT)


@triton.jit
def _k_loop(acc, acc_u, acc_t, row0, w_row0, w_n0, rows, row_ok, a_rows, w_rows, col_ok,
            ws_rows, row_t0, rows_t, row_ok_t, a_rows_t, x_ptr, w_ptr, x_desc, x_tail_desc,
            w_desc, x_scale_ptr, w_scale_ptr, K, KB, N_OUT,
            BLOCK_K: tl.constexpr, TAIL_M: tl.constexpr,
            USE_TMA: tl.constexpr, SWAP_AB: tl.constexpr, QUANT: tl.constexpr,
            GATHER: tl.constexpr, GLU: tl.constexpr, UPCAST: tl.constexpr,
            DOT_PRECISION: tl.constexpr, INTERPRET: tl.constexpr, RUN_ORDER: tl.constexpr,
            STEP_K: tl.constexpr):
    """A tile's K loop (_k_step over K; the interpreter needs a while loop)."""
    if INTERPRET:
        k0 = 0
        while k0 < K:
            acc, acc_u, acc_t = _k_step(
                acc, acc_u, acc_t, k0, row0, w_row0, w_n0, rows, row_ok, a_rows, w_rows, col_ok,
                ws_rows, row_t0, rows_t, row_ok_t, a_rows_t, x_ptr, w_ptr, x_desc, x_tail_desc,
                w_desc, x_scale_ptr, w_scale_ptr, K, KB, N_OUT, BLOCK_K, TAIL_M, USE_TMA,
                SWAP_AB, QUANT, GATHER, GLU, UPCAST, DOT_PRECISION, RUN_ORDER, STEP_K)
            k0 += STEP_K
    else:
        for k0 in range(0, K, STEP_K):
            acc, acc_u, acc_t = _k_step(
                acc, acc_u, acc_t, k0, row0, w_row0, w_n0, rows, row_ok, a_rows, w_rows, col_ok,
                ws_rows, row_t0, rows_t, row_ok_t, a_rows_t, x_ptr, w_ptr, x_desc, x_tail_desc,
                w_desc, x_scale_ptr, w_scale_ptr, K, KB, N_OUT, BLOCK_K, TAIL_M, USE_TMA,
                SWAP_AB, QUANT, GATHER, GLU, UPCAST, DOT_PRECISION, RUN_ORDER, STEP_K)
    return acc, acc_u, acc_t


@triton.jit
def _epilogue(acc, acc_u, rows, row_ok, cols, col_ok, w_rows, x_scale_ptr, w_scale_ptr,
              bias_ptr, row_weights_ptr, scatter_ids_ptr, out_ptr, N, N_OUT, alpha, limit,
              QUANT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_ROW_WEIGHTS: tl.constexpr,
              SCATTER: tl.constexpr, GLU: tl.constexpr, HAS_LIMIT: tl.constexpr):
    """A tile's fp32 sums acc [rows, cols] (and the up half's, acc_u, with a GLU) into out:
    scales and bias, the GLU, row weights, then a store or a scatter."""
    acc = _epilogue_scale_bias(acc, rows, row_ok, w_rows, col_ok, x_scale_ptr, w_scale_ptr,
                               bias_ptr, QUANT, HAS_BIAS)
    if GLU != "none":  # act(gate, up) from the fp32 sums, as the fused decode kernels take it
        acc_u = _epilogue_scale_bias(acc_u, rows, row_ok, w_rows + N_OUT, col_ok, x_scale_ptr,
                                     w_scale_ptr, bias_ptr, QUANT, HAS_BIAS)
        acc = glu_f32(acc, acc_u, GLU, HAS_LIMIT, alpha, limit)
    if HAS_ROW_WEIGHTS:
        acc = acc * tl.load(row_weights_ptr + rows, mask=row_ok, other=0.0)[:, None]
    val = acc.to(out_ptr.dtype.element_ty)
    mask = row_ok[:, None] & col_ok[None, :]
    if SCATTER == "add":
        dst = tl.load(scatter_ids_ptr + rows, mask=row_ok, other=0).to(tl.int64)
        tl.atomic_add(out_ptr + dst[:, None] * N + cols[None, :], val, mask=mask, sem="relaxed")
    elif SCATTER == "add_unique":  # this program is the only writer of these rows of out
        dst = tl.load(scatter_ids_ptr + rows, mask=row_ok, other=0).to(tl.int64)
        ptrs = out_ptr + dst[:, None] * N + cols[None, :]
        old = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
        tl.store(ptrs, (old + acc).to(out_ptr.dtype.element_ty), mask=mask)
    elif SCATTER == "store":  # the only writer, and out's old values are not wanted
        dst = tl.load(scatter_ids_ptr + rows, mask=row_ok, other=0).to(tl.int64)
        tl.store(out_ptr + dst[:, None] * N + cols[None, :], val, mask=mask)
    else:
        tl.store(out_ptr + rows.to(tl.int64)[:, None] * N_OUT + cols[None, :], val, mask=mask)


@triton.jit
def _grouped_gemm_kernel(
    x_ptr,  # [M, K] rows sorted by group
    w_ptr,  # [W, N, K] weights, K contiguous ([W, N, K / 2] bytes for mxfp4)
    m_sizes_ptr,  # [G] rows per group (int32/int64, on the device)
    weight_ids_ptr,  # [G] weight matrix of each group (HAS_WEIGHT_IDS)
    x_scale_ptr,  # fp32 [M] (fp8_rowwise) or [M, KB] (fp8_block)
    w_scale_ptr,  # fp32 [W, N] (fp8_rowwise, fp8_w8a16), [W, NB, KB] (fp8_block), e8m0 [W, N, K/32]
    bias_ptr,  # [W, N] added to each output row of group g with bias[weight of g] (HAS_BIAS)
    row_weights_ptr,  # [M] fp32 (HAS_ROW_WEIGHTS)
    scatter_ids_ptr,  # [M] destination row in out (SCATTER != "none")
    x_ids_ptr,  # [M] the row of x each row gathers (GATHER == "rows"; x is then [T, K])
    out_ptr,  # [M, N], or [T, N] accumulated into (SCATTER != "none")
    x_host_desc,  # TensorDescriptor over x [M, K] (TMA == "host"), else None
    x_tail_host_desc,  # the same with TAIL_M-row boxes (TMA == "host" and TAIL_M), else None
    w_host_desc,  # TensorDescriptor over w [W*N, K] (or [W*N, K/2]; unswapped GLU [2W, N/2, *])
    # (TMA == "host"), else None
    M, N, K, G, W,
    NB, KB,  # fp8_block: scale blocks per weight matrix along N, along K
    SPLIT,  # fp8_block: output rows restart their scale blocks here (N: no restart)
    alpha, limit,  # the GLU's (as ops.silu_mul's; limit used with HAS_LIMIT)
    num_programs,  # persistent programs in the grid
    BLOCK_G: tl.constexpr,  # next power of two >= G
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    TAIL_M: tl.constexpr,  # a group's last tile takes up to this many rows more (0: none)
    TMA: tl.constexpr,  # "device" | "host" | "none"
    SWAP_AB: tl.constexpr, FLATTEN: tl.constexpr,
    QUANT: tl.constexpr,  # "none" | "fp8_rowwise" | "fp8_w8a16" | "fp8_block" | "mxfp4"
    HAS_BIAS: tl.constexpr, HAS_WEIGHT_IDS: tl.constexpr, HAS_ROW_WEIGHTS: tl.constexpr,
    SCATTER: tl.constexpr,  # "none" (rows in order), "add" (atomic), "add_unique", "store"
    GATHER: tl.constexpr,  # "none" | "rows" (x[x_ids])
    GLU: tl.constexpr,  # "none" | "silu" | "swiglu_oai": out [M, N / 2] = act(gate, up) of the
    # rows' products with w's first and second N / 2 rows (a tile: BLOCK_N of each)
    HAS_LIMIT: tl.constexpr,
    UPCAST: tl.constexpr,  # cast tiles to fp32 before tl.dot (interpreter)
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 inputs (tf32 would drop 13 mantissa bits)
    INTERPRET: tl.constexpr,  # the interpreter needs a while loop (range() of a tensor fails)
    RUN_ORDER: tl.constexpr,  # mxfp4: the K loop in mxfp4_run_order (TileConfig.run_order)
    STEP_K: tl.constexpr,  # K a pipelined loop step: BLOCK_K, or k_parts of them (TileConfig)
):
    pid = tl.program_id(0)
    offs_g = tl.arange(0, BLOCK_G)
    m = tl.load(m_sizes_ptr + offs_g, mask=offs_g < G, other=0).to(tl.int32)
    m = tl.maximum(m, 0)
    if GLU != "none":
        N_OUT = N // 2
    else:
        N_OUT = N
    tiles = _m_tiles(m, BLOCK_M, TAIL_M) * tl.cdiv(N_OUT, BLOCK_N)
    tile_end = tl.cumsum(tiles, 0)
    row_end = tl.cumsum(m, 0)
    total = tl.sum(tiles, 0)

    if TMA == "device":
        if GATHER == "none":
            x_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[K, 1],
                                               block_shape=[BLOCK_M, BLOCK_K])
            if TAIL_M > 0:
                x_tail_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[K, 1],
                                                        block_shape=[TAIL_M, BLOCK_K])
            else:
                x_tail_desc = x_tail_host_desc
        else:  # gathered rows load through pointers
            x_desc = x_host_desc
            x_tail_desc = x_tail_host_desc
        if QUANT == "mxfp4":
            KW = K // 2
            BLOCK_KW: tl.constexpr = BLOCK_K // 2
        else:
            KW = K
            BLOCK_KW: tl.constexpr = BLOCK_K
        if GLU != "none" and not SWAP_AB:  # gate and up matrices alternate: one box, both
            w_desc = tl.make_tensor_descriptor(w_ptr, shape=[W * 2, N_OUT, KW],
                                               strides=[N_OUT * KW, KW, 1],
                                               block_shape=[2, BLOCK_N, BLOCK_KW])
        else:
            w_desc = tl.make_tensor_descriptor(w_ptr, shape=[W * N, KW], strides=[KW, 1],
                                               block_shape=[BLOCK_N, BLOCK_KW])
    else:
        x_desc = x_host_desc
        x_tail_desc = x_tail_host_desc
        w_desc = w_host_desc

    if INTERPRET:
        t = pid
        while t < total:
            _tile(t, m, tiles, tile_end, row_end, x_ptr, w_ptr, x_desc, x_tail_desc, w_desc,
                  weight_ids_ptr, x_scale_ptr, w_scale_ptr, bias_ptr, row_weights_ptr,
                  scatter_ids_ptr, x_ids_ptr, out_ptr, M, N, N_OUT, K, NB, KB, SPLIT, alpha,
                  limit, BLOCK_M, BLOCK_N, BLOCK_K, TAIL_M, TMA != "none", SWAP_AB, QUANT,
                  HAS_BIAS, HAS_WEIGHT_IDS, HAS_ROW_WEIGHTS, SCATTER, GATHER, GLU, HAS_LIMIT,
                  UPCAST, DOT_PRECISION, INTERPRET, RUN_ORDER, STEP_K)
            t += num_programs
    else:
        for t in tl.range(pid, total, num_programs, flatten=FLATTEN):
            _tile(t, m, tiles, tile_end, row_end, x_ptr, w_ptr, x_desc, x_tail_desc, w_desc,
                  weight_ids_ptr, x_scale_ptr, w_scale_ptr, bias_ptr, row_weights_ptr,
                  scatter_ids_ptr, x_ids_ptr, out_ptr, M, N, N_OUT, K, NB, KB, SPLIT, alpha,
                  limit, BLOCK_M, BLOCK_N, BLOCK_K, TAIL_M, TMA != "none", SWAP_AB, QUANT,
                  HAS_BIAS, HAS_WEIGHT_IDS, HAS_ROW_WEIGHTS, SCATTER, GATHER, GLU, HAS_LIMIT,
                  UPCAST, DOT_PRECISION, INTERPRET, RUN_ORDER, STEP_K)


def _ensure_allocator() -> None:
    """Device-made TMA descriptors need a global scratch buffer from Triton's allocator; install
    one (a torch tensor, so it follows graph capture) unless the caller already set one."""
    from triton.runtime import _allocation

    if isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        triton.set_allocator(
            lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device="cuda"))


def tma_mode(cfg: configs.TileConfig, x: Tensor, w: Tensor) -> str:
    """The TMA mode the kernel will use: cfg.tma when the hardware and the shapes allow, else
    "none" (TMA needs 16-byte aligned bases and row strides: K * itemsize % 16 == 0 for x and
    for w's stored rows). Traced by torch.compile, "none": the same sums through plain loads."""
    K = x.shape[1]
    if cfg.tma == "none" or K == 0 or (K * x.element_size()) % 16:
        return "none"
    if (w.shape[-1] * w.element_size()) % 16:
        return "none"
    if traced((x,)):  # torch.compile: descriptors cannot be traced into a triton_op's graph
        return "none"
    if x.data_ptr() % 16 or w.data_ptr() % 16:
        return "none"
    if x.is_cuda and torch.cuda.get_device_capability(x.device)[0] < 9:
        return "none"
    return cfg.tma


def _tile_config(M: int, N: int, K: int, G: int, x: Tensor,
                 quantization: str) -> configs.TileConfig:
    sms = device_sms(x.device) if x.is_cuda else configs.TUNED_SMS
    cfg = configs.select(M, N, K, G, x.dtype, quantization, sms)
    if x.dtype == FP8_DTYPE and cfg.block_k < 32:  # fp8 tensor-core dots need K >= 32
        cfg = cfg.with_(block_k=32)
    if quantization == "fp8_block" and cfg.block_k > FP8_BLOCK:  # one scale block a K step
        cfg = cfg.with_(block_k=FP8_BLOCK)
    if quantization == "mxfp4" and cfg.block_k < MX_GROUP:  # whole e8m0 groups a K step
        cfg = cfg.with_(block_k=MX_GROUP)
    if cfg.tail_m and (cfg.swap_ab or cfg.tail_m & (cfg.tail_m - 1) or not
                       16 <= cfg.tail_m <= cfg.block_m):
        raise ValueError(f"TileConfig.tail_m={cfg.tail_m} must be a power of two from 16 to "
                         f"block_m={cfg.block_m}, on tiles that are not swapped")
    if cfg.swap_ab and cfg.block_m > SWAP_MAX_ROWS:
        raise ValueError(f"TileConfig.block_m={cfg.block_m} with swap_ab: swapped tiles take at "
                         f"most {SWAP_MAX_ROWS} rows (256 gave wrong sums on an H200 under "
                         "Triton 3.6; benchmarks/probe_swap256.py)")
    part = cfg.block_k // max(cfg.k_parts, 1)
    if (cfg.k_parts < 1 or part * cfg.k_parts != cfg.block_k or part & (part - 1)
            or (quantization == "mxfp4" and part < MX_GROUP)
            or (x.dtype == FP8_DTYPE and part < 32)):
        raise ValueError(f"TileConfig.k_parts={cfg.k_parts} must cut block_k={cfg.block_k} "
                         "into power-of-two parts of whole scale groups (mxfp4: 32 values)")
    return cfg


@kernel_op("grouped_gemm", mutates_args=("out",))
def _grouped_gemm_op(x: Tensor, w: Tensor, m_sizes: Tensor, x_scale: Optional[Tensor],
                     w_scale: Optional[Tensor], weight_ids: Optional[Tensor],
                     row_weights: Optional[Tensor], scatter_ids: Optional[Tensor], out: Tensor,
                     scatter: str, quantization: str, bias: Optional[Tensor],
                     scale_split: Optional[int], x_ids: Optional[Tensor], glu: str, alpha: float,
                     limit: Optional[float]) -> None:
    M = x.shape[0] if x_ids is None else x_ids.shape[0]  # rows of the product
    K = x.shape[1]
    W, N = w.shape[:2]
    G = m_sizes.shape[0]
    if M == 0 or N == 0 or G == 0:
        return
    if W * N >= 2**31:
        raise ValueError(f"w has {W} x {N} rows; the kernel indexes them with int32 (< 2**31)")
    cfg = _tile_config(M, N, K, G, x, quantization)
    if glu != "none":  # a tile: block_n / 2 gate rows and as many up rows (and no tail rows)
        cfg = cfg.with_(block_n=max(16, cfg.block_n // 2), tail_m=0)
    interpret = interpreting()
    tma = tma_mode(cfg, x, w)
    block_k = cfg.block_k // cfg.k_parts  # a dot's K (its loads, its descriptors' boxes)
    x_desc = x_tail_desc = w_desc = None
    gather = "none" if x_ids is None else "rows"
    if tma == "host":
        if x_ids is None:  # gathered rows load through pointers
            x_desc = TensorDescriptor(x, [M, K], [K, 1], [cfg.block_m, block_k])
            if cfg.tail_m:
                x_tail_desc = TensorDescriptor(x, [M, K], [K, 1], [cfg.tail_m, block_k])
        Kw = w.shape[-1]  # K, or K / 2 packed mxfp4 bytes
        box_k = block_k * Kw // K
        if glu != "none" and not cfg.swap_ab:  # gate and up matrices alternate: one box, both
            w_desc = TensorDescriptor(w.view(W * 2, N // 2, Kw), [W * 2, N // 2, Kw],
                                      [N // 2 * Kw, Kw, 1], [2, cfg.block_n, box_k])
        else:
            w_desc = TensorDescriptor(w.view(W * N, Kw), [W * N, Kw], [Kw, 1],
                                      [cfg.block_n, box_k])
    elif tma == "device" and not interpret:
        _ensure_allocator()
    # Tiles can number at most n_tiles * (M // BLOCK_M + nonempty groups): no idle programs.
    max_tiles = cdiv(N if glu == "none" else N // 2, cfg.block_n) * (M // cfg.block_m + min(G, M))
    sms = _INTERPRETER_PROGRAMS if interpret else device_sms(x.device) * cfg.ctas_per_sm
    num_programs = max(1, min(sms, max_tiles))
    upcast = interpret and (x.dtype in (torch.bfloat16, FP8_DTYPE) or quantization == "mxfp4")
    nb = w_scale.shape[1] if quantization == "fp8_block" else 1
    # The interpreter has no 16-bit atomic add: accumulate into an fp32 copy there.
    dst = out.float() if interpret and scatter_ids is not None and scatter == "add" else out
    with on_device(x):
        launch(_grouped_gemm_kernel, (num_programs,),
            x, w, m_sizes, weight_ids, x_scale, w_scale, bias, row_weights, scatter_ids, x_ids,
            dst, x_desc, x_tail_desc, w_desc, M, N, K, G, W, nb, cdiv(K, FP8_BLOCK),
            N if scale_split is None else scale_split, alpha,
            0.0 if limit is None else limit, num_programs,
            BLOCK_G=next_power_of_2(G), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
            BLOCK_K=block_k, TAIL_M=cfg.tail_m, TMA=tma, SWAP_AB=cfg.swap_ab, FLATTEN=cfg.flatten,
            QUANT=quantization, HAS_BIAS=bias is not None, HAS_WEIGHT_IDS=weight_ids is not None,
            HAS_ROW_WEIGHTS=row_weights is not None,
            SCATTER="none" if scatter_ids is None else scatter, GATHER=gather, GLU=glu,
            HAS_LIMIT=limit is not None, UPCAST=upcast,
            DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
            INTERPRET=interpret, RUN_ORDER=cfg.run_order and quantization == "mxfp4",
            STEP_K=cfg.block_k,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
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
    scatter: str = "add",
    quantization: str = "none",
    bias: Tensor | None = None,
    scale_split: int | None = None,
    all_rows: bool = False,
    x_ids: Tensor | None = None,
    glu: tuple[str, float, float | None] | None = None,
) -> Tensor:
    """Arguments already validated by ``ops.grouped_gemm``: x [M, K] (or [T, K] with x_ids [M]),
    w [W, N, K] (mxfp4: [W, N, K / 2] bytes), m_sizes [G] -> out [M, N] (or out [T, N] +=
    scattered rows; with glu, out [M, N / 2]). all_rows changes nothing: tiles never cover rows
    past sum(m_sizes) anyway."""
    if out is None:
        M = x.shape[0] if x_ids is None else x_ids.shape[0]
        N = w.shape[1] if glu is None else w.shape[1] // 2
        out = torch.empty((M, N), dtype=out_dtype, device=x.device)
    _grouped_gemm_op(x, w, m_sizes, x_scale, w_scale, weight_ids, row_weights, scatter_ids, out,
                     scatter, quantization, bias, scale_split, x_ids,
                     *(("none", 1.0, None) if glu is None else glu))
    return out
