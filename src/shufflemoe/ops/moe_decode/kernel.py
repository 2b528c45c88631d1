"""The routed experts at decode in two Triton launches (after index_shuffle):

    gate_up: a[p] = SwiGLU(x[token_ids[p]] (* w_in[p]) @ W13[e(p)]^T)  [A, I]  (+ w8a8 quant)
    down:    out[t] (+)= sum over t's pairs p of (a[p] @ W2[e(p)]^T) (* w_out[p])    [T, D]

Pairs are sorted by expert (Routing); an m-tile is up to BLOCK_M consecutive pairs of one expert,
found on the device from counts as in the grouped GEMM (no host sync). Program pid covers m-tile
u, n-tile n and K range s (pid = (u * n_tiles + n) * split + s); the grid is planned for the
most m-tiles A pairs can form, and programs past the real ones return at once.

Weights stream as the MMA's M side (swap-AB: acc [BLOCK_N, BLOCK_M]); gate_up holds two
accumulators (gate rows n, up rows I + n) so SwiGLU runs in registers. The gather (and Llama 4's
input weight, rounded to x's dtype once as gather_scale does) happens in the K loop's loads.

Split-K fixup, no memset launch: each split stores its fp32 partial to a workspace, then (after a
CTA barrier, so every thread's stores precede the release) adds one to its tile's arrival word
with acq_rel. The program that sees split - 1 is last: it sums the partials in split order (a
fixed order, so the result does not depend on which program came last), runs the epilogue and
puts the word back to 0, so the words are zero between launches (CUDA-graph safe). The
interpreter runs programs one after another; the same code is then trivially ordered.

fp8 rowwise keeps the layer's w8a8 contract (activations quantized per row with the formula of
ops.quantize, as gather_scale and silu_mul do): gate_up quantizes its rows of x in the K loop
from the rows' amax (a pass over the rows before the loop); its epilogue stores a in fp32. At
T = 1 every routed row is x[0] times its input weight, so the amax is max |x[0]| times |w| (the
same bits: rounding is monotone), and where the caller says x was written before the launches
gate_up overlaps (early: the layer's calls) it is taken before the PDL wait. Where down's
tiles hold one pair (configs.down_quantizes), down quantizes those rows itself (A_F32): each
program takes its rows' amax (a pass before its K loop) and quantizes each K step's tile in
registers, the formula of ops.quantize, so no gate_up program waits for the rest of its m-tile.
Else the last tile of each m-tile (a second arrival word) quantizes the m-tile's whole rows of a
into (q, scale), which down's MMA tiles read like any fp8 GEMM input (a tile quantized in
registers would cost them the pipelined fp8 operand).

fp8_block (w8a8 in 128-column groups, DeepSeek-V3 / Qwen3 FP8 checkpoints) takes K steps of whole
128-column scale blocks (one a step on MMA tiles, the tile's multiple of 128 on one-pair tiles):
each step quantizes its groups of the gathered rows (each from its own amax: no pass before the
loop), multiplies in fp8 and adds each block's product times the weights' block scale and the
rows' group scale (the grouped GEMM's order); the last tile of each m-tile quantizes whole rows of
a in groups of 128 (q, scale [A, ceil(I / 128)]), which down reads the same way.

Weight-only formats (QUANT, ops/quantize/formats.py) keep x and a in x's dtype and dequantize
the weight tile in registers in the K step, as the grouped GEMM does: fp8_w8a16 (e4m3, exact in
bf16; w_scale[n] in the epilogue, before the GLU) and mxfp4 (two e2m1 a byte, an e8m0 scale per
32 along K, exact; MMA tiles' columns in mxfp4_run_order, x's tile permuted alike). Their
weights stream at a half and a quarter of bf16's bytes.

down's combine is token-major and deterministic. Top-1 (k == 1): a token has one pair, so the
tile's last program adds into out[token] in fp32 and rounds once. k > 1: the tile's last program
stores its fp32 rows, and the last m-tile of each n-tile (a column arrival word) sums every
token's k rows through Routing.positions, in the token's choice order, into out in fp32 and
rounds once: no atomics on out. ACCUMULATE False: the sum is written instead of added (the layer's
fused shared expert writes out first, then the routed experts add into it).

Expert biases (gpt-oss) are added in the epilogues in fp32: gate_up's after the weight scales,
before the GLU (SwiGLU, or the clamped swiglu_oai of ops.silu_mul: ACT, HAS_LIMIT); down's before
the output weight, as the grouped GEMM's epilogue adds them.

A shared expert in the same launches (SHARED, the layer's merged decode): its m-tiles come first
(rows = tokens 0 .. T - 1 of its own weights, no routing read), a holds its T rows before the
pairs', and down's combine adds each token's shared row before its pairs' (so k = 1 combines
too). EARLY (with PDL): gate_up's shared programs skip the wait for index_shuffle and count
their stored rows of a in a handshake word; down's shared programs wait for that count, not
for all of gate_up, and for the grid only before their epilogue (see _await_shared).
A gated shared expert (Qwen2-MoE, Qwen3-Next: GATE) has down's epilogue multiply its rows by
sigmoid(x[token] . gate) in fp32 before they are stored or summed (_gate): with SHARED the shared
m-tiles' rows, without it every row (the shared expert alone, as one expert every token visits).

Indexing: products that can pass 2^31 (token * D, expert * rows * K, pair * N) are int64.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .._common import cdiv, device_name, device_sms, next_power_of_2, on_device, traced
from .._impl import interpreting, kernel_op
from .._launch import launch, persistent_zeros
from ..quantize.kernel import (cast_to, e2m1_f16, e4m3_bits, e4m3_to, e8m0_values, fp8_target,
                               mxfp4_run_order, mxfp4_values, row_scales, store_fp8)
from ..quantize.reference import FP8_DTYPE
from ..silu_mul.kernel import glu_f32
from . import configs
from .reference import SILU, W8A8, WEIGHT_ONLY, Act, format_of, unpack_outputs

_COMBINE_TOKENS = 16  # tokens per step of down's token-major combine


@triton.jit
def _locate(counts_ptr, u, E, live, BLOCK_E: tl.constexpr, BLOCK_M: tl.constexpr):
    """m-tile u -> (exists, expert, first row, row stop, m-tiles in all, rows in all). Plain sums
    over a one-hot of u's expert (the grouped GEMM's 4-way tl.reduce costs 120 ms a program in
    the interpreter at E = 256; on the GPU both are a few shuffles). Not ``live``: counts is not
    read (every expert empty)."""
    offs = tl.arange(0, BLOCK_E)
    m = tl.maximum(tl.load(counts_ptr + offs, mask=(offs < E) & live, other=0).to(tl.int32), 0)
    tiles = tl.cdiv(m, BLOCK_M)
    tile_end = tl.cumsum(tiles, 0)
    before = tile_end <= u
    mine = (tile_end > u) & (tile_end - tiles <= u)  # empty experts never hold a tile
    g = tl.sum(tl.where(mine, offs, 0), 0)
    row_start = tl.sum(tl.where(before, m, 0), 0)
    row0 = row_start + (u - tl.sum(tl.where(before, tiles, 0), 0)) * BLOCK_M
    row_stop = row_start + tl.sum(tl.where(mine, m, 0), 0)
    total_tiles = tl.sum(tiles, 0)
    return u < total_tiles, g, row0, row_stop, total_tiles, tl.sum(m, 0)


@triton.jit
def _fp8_value(v, INTERPRET: tl.constexpr):
    """v (already scaled into [-448, 448]) rounded to e4m3: the fp8 tensor on the GPU; its exact
    float32 value under the interpreter, whose fp8 casts are wrong (the dot is float32 there)."""
    if INTERPRET:
        bits = e4m3_bits(v)
        e = (bits >> 3) & 0xF
        m = (bits & 7).to(tl.float32)
        mag = tl.where(e == 0, m * 0.001953125, (8.0 + m) * tl.exp2((e - 10).to(tl.float32)))
        out = tl.where((bits & 0x80) != 0, -mag, mag)
        out = tl.where(v != v, v, out)
    else:
        out = v.to(tl.float8e4nv)
    return out


@triton.jit
def _dot(acc, w, xt, UPCAST: tl.constexpr, W_TO_X: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """acc [BN, BM] += w [BN, BK] @ xt [BK, BM]; with BM = 1 on the CUDA cores (products of
    bf16 / fp8 values are exact in fp32, summed in fp32): each step's products summed across
    the block, or with acc [BN, runs] (_acc0's RUNS) each run of 16 bytes of a weight row (one
    thread's load) into its own column, so the K loop sums nothing across threads and _acc_sum
    reduces the runs once after it. W_TO_X: a
    weight-only format's tile (e4m3, or mxfp4 dequantized to fp32) becomes x's dtype for the
    MMA, exactly (fp8_w8a16, mxfp4 with bf16 x)."""
    if xt.shape[1] == 1 and acc.shape[1] == 1:
        x = tl.reshape(xt, [xt.shape[0]]).to(tl.float32)
        acc += tl.reshape(tl.sum(w.to(tl.float32) * x[None, :], 1), [w.shape[0], 1])
    elif xt.shape[1] == 1:  # acc [BN, runs] (_acc0): each run's products summed apart
        R: tl.constexpr = acc.shape[1]
        runs = tl.reshape(w, [w.shape[0], R, w.shape[1] // R]).to(tl.float32)
        x = tl.reshape(xt, [R, xt.shape[0] // R]).to(tl.float32)
        acc += tl.sum(runs * x[None, :, :], 2)
    else:
        if UPCAST:  # interpreter: its bf16 dot is wrong (Triton 3.6); fp32 of bf16/fp8 is exact
            w = w.to(tl.float32)
            xt = xt.to(tl.float32)
        elif W_TO_X:
            w = e4m3_to(w, xt.dtype) if w.dtype == tl.float8e4nv else w.to(xt.dtype)
        acc = tl.dot(w, xt, acc, input_precision=DOT_PRECISION)
    return acc


@triton.jit
def _w_tile(w_ptr, ws_ptr, w_rows, col_ok, k0, k_hi, K, QUANT: tl.constexpr,
            BLOCK_K: tl.constexpr, UPCAST: tl.constexpr):
    """Weight rows w_rows [BN] (of w viewed as [E * N, K]) at columns k0 .. k0 + BLOCK_K below
    k_hi: as stored (bf16, e4m3), or for mxfp4 (bytes [E * N, K / 2], e8m0 scales [E * N,
    K / 32]; K steps of whole 32-column groups) dequantized exactly (mxfp4_values), its columns
    in mxfp4_run_order: the MMA's left operand, x's tile in that order too (_x_cols)."""
    if QUANT == "mxfp4":
        js = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        packed = tl.load(w_ptr + w_rows[:, None] * (K // 2) + js[None, :],
                         mask=col_ok[:, None] & (js < k_hi // 2)[None, :], other=0)
        gs = k0 // 32 + tl.arange(0, BLOCK_K // 32)
        sc = tl.load(ws_ptr + w_rows[:, None] * (K // 32) + gs[None, :],
                     mask=col_ok[:, None] & (gs < k_hi // 32)[None, :], other=0)
        w = mxfp4_values(packed, sc, w_rows.shape[0], BLOCK_K, UPCAST, True)
    else:
        kk = k0 + tl.arange(0, BLOCK_K)
        w = tl.load(w_ptr + w_rows[:, None] * K + kk[None, :],
                    mask=col_ok[:, None] & (kk < k_hi)[None, :], other=0.0)
    return w


@triton.jit
def _x_cols(x, QUANT: tl.constexpr):
    """x [BM, BK] as the dot's right operand [BK, BM] against _w_tile's tile: for mxfp4, its
    columns in mxfp4_run_order."""
    if QUANT == "mxfp4":
        x = mxfp4_run_order(x)
    return tl.trans(x)


@triton.jit
def _arrive(word_ptr, expected):
    """After this program's stores: count its arrival; True for the last of ``expected``, which
    also puts the word back to zero (after it, nobody else touches the word in this launch)."""
    tl.debug_barrier()  # every thread's stores happen before the release below
    last = tl.atomic_add(word_ptr, 1, sem="acq_rel") == expected - 1
    if last:
        tl.atomic_xchg(word_ptr, 0)
    return last


@triton.jit
def _await_shared(flag_ptr, expected, programs):
    """down's shared-expert programs (EARLY): wait until gate_up's ``expected`` shared programs
    have stored their rows of a (flag_ptr[0], counted with release), then count this program
    in flag_ptr[1]; the last of ``programs`` puts both words back to zero (nothing else touches
    them in this pair of launches)."""
    seen = tl.atomic_add(flag_ptr, 0, sem="acquire")
    while seen < expected:
        seen = tl.atomic_add(flag_ptr, 0, sem="acquire")
    tl.debug_barrier()  # every thread's loads of a come after the acquire
    if tl.atomic_add(flag_ptr + 1, 1, sem="relaxed") == programs - 1:
        tl.atomic_xchg(flag_ptr, 0)
        tl.atomic_xchg(flag_ptr + 1, 0)


@triton.jit
def _gate_step(z, k0, x_ptr, gate_ptr, at, row_ok, D, GATE_K: tl.constexpr):
    ks = k0 + tl.arange(0, GATE_K)
    k_ok = ks < D
    xs = tl.load(x_ptr + at + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
    gs = tl.load(gate_ptr + ks, mask=k_ok, other=0.0)
    return z + tl.sum(xs.to(tl.float32) * gs.to(tl.float32)[None, :], axis=1)


@triton.jit
def _gate(x_ptr, gate_ptr, tok, row_ok, D, BLOCK_M: tl.constexpr, GATE_K: tl.constexpr,
          INTERPRET: tl.constexpr):
    """sigmoid(x[tok] . gate) [BM] in fp32: a gated shared expert's factor for its rows'
    tokens (x [T, D] the layer's input, gate [D])."""
    z = tl.zeros([BLOCK_M], tl.float32)
    at = tok.to(tl.int64)[:, None] * D
    if INTERPRET:  # range() over a tensor bound fails in the interpreter
        k0 = 0
        while k0 < D:
            z = _gate_step(z, k0, x_ptr, gate_ptr, at, row_ok, D, GATE_K)
            k0 += GATE_K
    else:
        for k0 in range(0, D, GATE_K):
            z = _gate_step(z, k0, x_ptr, gate_ptr, at, row_ok, D, GATE_K)
    return tl.sigmoid(z)


@triton.jit
def _partials_sum(part_ptr, at, mask, split, stride_split):
    """Sum of the split partials at ``at`` in split order (a fixed order: the result does not
    depend on which program arrived last); .cg: they were written by other programs."""
    acc = tl.zeros(at.shape, tl.float32)
    j = 0
    while j < split:  # split is a runtime value: one compiled kernel serves every split > 1
        acc += tl.load(part_ptr + at + j * stride_split, mask=mask, other=0.0,
                       cache_modifier=".cg")
        j += 1
    return acc


@triton.jit
def _program(counts_ptr, E, n_tiles, split, T, BLOCK_E: tl.constexpr, BLOCK_M: tl.constexpr,
             SHARED: tl.constexpr, PDL: tl.constexpr, EARLY: tl.constexpr):
    """This program's work: (split s, tile, m-tile u, n-tile, shared, exists, expert, first row,
    row stop, m-tiles in all, routed pairs). SHARED: the first cdiv(T, BLOCK_M) m-tiles are the
    shared expert's (rows = tokens 0 .. T - 1, expert 0 of its own weights), the routed m-tiles
    follow (their rows are pairs; a's rows for them start at T). With programmatic dependent
    launch the program first waits for the previous kernel's memory, then lets the next kernel
    launch (whose programs wait in turn before they touch memory); EARLY: the shared expert's
    programs do not wait (they read only x and weights, and write only buffers the caller made
    before the kernels they overlap were launched) and read no routing."""
    pid = tl.program_id(0)
    tile = pid // split
    u = tile // n_tiles
    if SHARED:
        u_routed = u - tl.cdiv(T, BLOCK_M)
    else:
        u_routed = u
    shared = u_routed < 0
    if PDL:
        if EARLY:
            if u_routed >= 0:
                gdc_wait()
        else:
            gdc_wait()
        gdc_launch_dependents()
    if EARLY:  # the shared expert's programs read no counts
        live = u_routed >= 0
    else:  # every program reads counts (the combine needs the rows in all)
        live = tl.full([], True, tl.int1)
    exists, g, row0, row_stop, total_tiles, num_valid = _locate(counts_ptr, u_routed, E, live,
                                                                BLOCK_E, BLOCK_M)
    if SHARED:
        exists = exists | shared
        g = tl.where(shared, 0, g)
        row0 = tl.where(shared, u * BLOCK_M, row0)
        row_stop = tl.where(shared, T, row_stop)
        total_tiles += tl.cdiv(T, BLOCK_M)
    return (pid % split, tile, u, tile % n_tiles, shared, exists, g, row0, row_stop,
            total_tiles, num_valid)


@triton.jit
def _tile_rows(rows, shared, T, SHARED: tl.constexpr, QUANT: tl.constexpr):
    """A tile's rows [BM] (pairs, or the shared expert's tokens) -> (their rows of the partials
    and of gate_up's a / down's y, their rows of the input a). SHARED: the shared expert's T
    rows come first in both (w8a8 formats keep the shared rows of a in sa, the pairs' rows of q
    unshifted). (The weight pointer is picked in the kernels themselves: Inductor's analysis of
    which arguments a user kernel writes took a pointer returned by a helper for written, and
    copied the shared weights before every compiled call.)"""
    if SHARED:
        p_rows = rows + tl.where(shared, 0, T)
        if QUANT == "fp8_rowwise" or QUANT == "fp8_block":  # w8a8: shared rows in sa
            a_rows = rows
        else:
            a_rows = p_rows
    else:
        p_rows = rows
        a_rows = rows
    return p_rows, a_rows


@triton.jit
def _row_amax(ptr, ids_ptr, rw_ptr, row0, n_rows, D, GATHER: tl.constexpr,
              HAS_RW: tl.constexpr, BLOCK_M: tl.constexpr, ROW_BLOCK: tl.constexpr,
              ROW_CHUNKS: tl.constexpr):
    """max |row * w| of each of the m-tile's n_rows rows of D values (float32); [BLOCK_M], 0
    past n_rows. GATHER: the rows are x[token] of the pairs from row0 (times their input weight
    with HAS_RW, as gather_scale's fp8 path); else rows row0, row0 + 1, ... of ptr, read past L1
    (a's fp32 rows, written by gate_up; x's row 0 at T = 1). Row by row (decode tiles hold a
    few), each row in ROW_CHUNKS independent loads of ROW_BLOCK lanes: one round trip a row,
    not one per K step."""
    lanes = tl.arange(0, BLOCK_M)
    offs = tl.arange(0, ROW_BLOCK)
    amax = tl.zeros([BLOCK_M], tl.float32)
    r = 0
    while r < n_rows:
        if GATHER:
            src = ptr + tl.load(ids_ptr + row0 + r).to(tl.int64) * D
        else:
            src = ptr + (row0 + r).to(tl.int64) * D
        w = 1.0
        if HAS_RW:
            w = tl.load(rw_ptr + row0 + r)
        m = 0.0
        for c in tl.static_range(ROW_CHUNKS):
            cols = c * ROW_BLOCK + offs
            if GATHER:
                v = tl.load(src + cols, mask=cols < D, other=0.0)
            else:
                v = tl.load(src + cols, mask=cols < D, other=0.0, cache_modifier=".cg")
            m = tl.maximum(m, tl.max(tl.abs(v.to(tl.float32) * w), 0))
        amax = tl.where(lanes == r, m, amax)
        r += 1
    return amax


@triton.jit
def _x_tile(x_ptr, tok, rw, inv, row_ok, ks, D, HAS_RW: tl.constexpr, QUANT: tl.constexpr,
            INTERPRET: tl.constexpr):
    """Gathered rows x[tok, ks] as the dot's input [BM, BK]: times rw rounded to x's dtype (as
    gather_scale), or for fp8 quantized with the rows' multipliers inv."""
    v = tl.load(x_ptr + tok[:, None] * D + ks[None, :], mask=row_ok[:, None] & (ks < D)[None, :],
                other=0.0)
    if QUANT == "fp8_rowwise":
        y = tl.clamp(v.to(tl.float32) * rw[:, None] * inv[:, None], -448.0, 448.0,
                     propagate_nan=tl.PropagateNan.ALL)
        v = _fp8_value(y, INTERPRET)
    elif HAS_RW:
        v = cast_to(v.to(tl.float32) * rw[:, None], x_ptr.dtype.element_ty, INTERPRET)
    return v


@triton.jit
def _x_groups(x_ptr, tok, rw, row_ok, ks, D, HAS_RW: tl.constexpr, INTERPRET: tl.constexpr):
    """fp8_block: gathered rows x[tok, ks] [BM, BK] (times rw rounded to x's dtype, as
    gather_scale), BK whole 128-column groups, quantized as ops.quantize_fp8_groups does:
    (values [BM, BK] as the dot takes them, group scales [BM, BK / 128])."""
    v = tl.load(x_ptr + tok[:, None] * D + ks[None, :], mask=row_ok[:, None] & (ks < D)[None, :],
                other=0.0)
    if HAS_RW:
        v = cast_to(v.to(tl.float32) * rw[:, None], x_ptr.dtype.element_ty, INTERPRET)
    BM: tl.constexpr = v.shape[0]
    BK: tl.constexpr = v.shape[1]
    groups = tl.reshape(v.to(tl.float32), [BM, BK // 128, 128])
    inv, scale = row_scales(tl.max(tl.abs(groups), 2))
    y = tl.clamp(groups * inv[:, :, None], -448.0, 448.0, propagate_nan=tl.PropagateNan.ALL)
    return _fp8_value(tl.reshape(y, [BM, BK]), INTERPRET), scale


@triton.jit
def _block_scales(ws_ptr, blocks, col_ok, k0, KB, BLOCK_K: tl.constexpr):
    """fp8_block: the weight rows' scales [BN, BLOCK_K / 128] for the step at k0 (blocks [BN]:
    their scale rows of w_scale viewed as [E * NB, KB])."""
    kb = k0 // 128 + tl.arange(0, BLOCK_K // 128)
    return tl.load(ws_ptr + blocks[:, None] * KB + kb[None, :],
                   mask=col_ok[:, None] & (kb < KB)[None, :], other=0.0)


@triton.jit
def _block_dot(acc, w, xq, w_scale, x_scale, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """fp8_block: acc [BN, BM] += for each 128-column group g of the step, (w[:, g] @ xq[:, g]^T)
    * w_scale[:, g] * x_scale[:, g] (w [BN, BK], xq [BM, BK], scales [BN, G], [BM, G]): each
    group's product scaled by its scales, as the grouped GEMM does. One pair (BM = 1): products
    on the CUDA cores summed per group; MMA tiles take one group a step (G = 1)."""
    BN: tl.constexpr = w.shape[0]
    BK: tl.constexpr = w.shape[1]
    BM: tl.constexpr = xq.shape[0]
    G: tl.constexpr = BK // 128
    if BM == 1:
        x = tl.reshape(xq, [BK]).to(tl.float32)
        part = tl.sum(tl.reshape(w.to(tl.float32) * x[None, :], [BN, G, 128]), 2)  # [BN, G]
        step = tl.sum(part * w_scale * tl.reshape(x_scale, [G])[None, :], 1)
        acc += tl.reshape(step, [BN, 1])
    else:
        part = _dot(tl.zeros(acc.shape, tl.float32), w, tl.trans(xq), UPCAST, False,
                    DOT_PRECISION)
        acc += part * tl.reshape(w_scale, [BN])[:, None] * tl.reshape(x_scale, [BM])[None, :]
    return acc


@triton.jit
def _acc0(BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
          QUANT: tl.constexpr, RUNS: tl.constexpr):
    """A zero accumulator: [BLOCK_N, BLOCK_M], or for one-pair tiles [BLOCK_N, columns], reduced
    once after the K loop (_acc_sum): mxfp4's 32-value groups (scaled sums), or with RUNS
    (_runs) runs of 16 bytes of a weight row (_dot)."""
    if BLOCK_M == 1 and QUANT == "mxfp4":
        acc = tl.zeros((BLOCK_N, BLOCK_K // 32), tl.float32)
    elif RUNS:
        if QUANT == "fp8_rowwise" or QUANT == "fp8_w8a16":  # 16 e4m3 bytes a run
            acc = tl.zeros((BLOCK_N, BLOCK_K // 16), tl.float32)
        else:  # 16 bytes of bf16
            acc = tl.zeros((BLOCK_N, BLOCK_K // 8), tl.float32)
    else:
        acc = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
    return acc


@triton.jit
def _acc_sum(acc, BLOCK_M: tl.constexpr):
    """The accumulator as [BLOCK_N, BLOCK_M] (see _acc0)."""
    if acc.shape[1] != BLOCK_M:
        acc = tl.reshape(tl.sum(acc, 1), [acc.shape[0], 1])
    return acc


@triton.jit
def _row_halves(ptr, row, w, ok, k0, k_hi, K, HAS_W: tl.constexpr, INTERPRET: tl.constexpr,
                BLOCK_K: tl.constexpr):
    """One row's K step as float32 [BLOCK_K / 32, 16] pairs (even columns, odd columns): column
    k0 + 32 g + 2 j (+ 1), below k_hi; times w rounded to the row's dtype (as gather_scale)."""
    g = tl.arange(0, BLOCK_K // 32)
    ks = k0 + g[:, None] * 32 + 2 * tl.arange(0, 16)[None, :]
    m = ok & (ks < k_hi)
    src = ptr + row * K
    even = tl.load(src + ks, mask=m, other=0.0)
    odd = tl.load(src + ks + 1, mask=m, other=0.0)
    if HAS_W:
        even = cast_to(even.to(tl.float32) * w, ptr.dtype.element_ty, INTERPRET)
        odd = cast_to(odd.to(tl.float32) * w, ptr.dtype.element_ty, INTERPRET)
    return even.to(tl.float32), odd.to(tl.float32)


@triton.jit
def _mxfp4_gemv(acc, w_ptr, ws_ptr, w_rows, col_ok, k0, k_hi, K, even, odd,
                BLOCK_K: tl.constexpr, UPCAST: tl.constexpr):
    """acc [BN, groups] += mxfp4 rows w_rows [BN] at columns k0 .. k0 + BLOCK_K (below k_hi) times
    one row of the input (even, odd: _row_halves), on the CUDA cores, per 32-value group. The
    bytes load as [BN, BLOCK_K / 2] rows, written so that the compiler sees 16-byte alignment
    and masks constant over 16 bytes (K and k_hi are multiples of 32): 16-byte loads, a row's
    step read by consecutive threads, each thread a group of each of its rows, so one thread's
    input values serve all its rows. Viewed as [BN, groups, 16 bytes] from there to the sum: no
    nibble interleave, no reduction across threads; codes decoded times 2^-14 (e2m1_f16: PTX on
    the GPU, UPCAST the interpreter's float32), each group's sum scaled once by 2^14 and its
    e8m0 scale (powers of two: exact)."""
    gs = k0 // 32 + tl.arange(0, BLOCK_K // 32)
    g_ok = col_ok[:, None] & (gs < k_hi // 32)[None, :]
    js = (k0 // 32) * 16 + tl.arange(0, BLOCK_K // 2)
    flat = tl.load(w_ptr + w_rows[:, None] * ((K // 32) * 16) + js[None, :],
                   mask=col_ok[:, None] & (js < (k_hi // 32) * 16)[None, :], other=0)
    packed = tl.reshape(flat, [w_rows.shape[0], BLOCK_K // 32, 16])
    p = (e2m1_f16(packed, False, UPCAST).to(tl.float32) * even[None, :, :]
         + e2m1_f16(packed, True, UPCAST).to(tl.float32) * odd[None, :, :])
    s = tl.load(ws_ptr + w_rows[:, None] * (K // 32) + gs[None, :], mask=g_ok, other=0)
    return acc + tl.sum(p, 2) * 16384.0 * e8m0_values(s)


@triton.jit
def _gate_up_step(acc_g, acc_u, k0, k_hi, x_ptr, w_ptr, ws_ptr, tok, rw, inv, row_ok, gate_rows,
                  col_ok, blocks, D, I, BLOCK_K: tl.constexpr, HAS_RW: tl.constexpr,
                  QUANT: tl.constexpr, UPCAST: tl.constexpr, W_TO_X: tl.constexpr,
                  DOT_PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    """One K step of gate_up: both accumulators += weights [BN, BK] @ gathered x^T [BK, BM]
    (fp8_block: blocks [BN], the gate rows' scale rows of w_scale viewed as [E * NB, KB])."""
    if QUANT == "fp8_block":  # whole 128-column scale blocks a step (see _plan)
        wg = _w_tile(w_ptr, ws_ptr, gate_rows, col_ok, k0, k_hi, D, QUANT, BLOCK_K, UPCAST)
        wu = _w_tile(w_ptr, ws_ptr, gate_rows + I, col_ok, k0, k_hi, D, QUANT, BLOCK_K, UPCAST)
        xq, xs = _x_groups(x_ptr, tok, rw, row_ok, k0 + tl.arange(0, BLOCK_K), D, HAS_RW,
                           INTERPRET)
        KB = tl.cdiv(D, 128)
        sg = _block_scales(ws_ptr, blocks, col_ok, k0, KB, BLOCK_K)
        su = _block_scales(ws_ptr, blocks + tl.cdiv(I, 128), col_ok, k0, KB, BLOCK_K)
        acc_g = _block_dot(acc_g, wg, xq, sg, xs, UPCAST, DOT_PRECISION)
        acc_u = _block_dot(acc_u, wu, xq, su, xs, UPCAST, DOT_PRECISION)
    elif QUANT == "mxfp4" and tok.shape[0] == 1:  # one pair: see _mxfp4_gemv
        ok = tl.sum(row_ok.to(tl.int32), 0) > 0
        even, odd = _row_halves(x_ptr, tl.sum(tok, 0), tl.sum(rw, 0), ok, k0, k_hi, D, HAS_RW,
                                INTERPRET, BLOCK_K)
        acc_g = _mxfp4_gemv(acc_g, w_ptr, ws_ptr, gate_rows, col_ok, k0, k_hi, D, even, odd,
                            BLOCK_K, UPCAST)
        acc_u = _mxfp4_gemv(acc_u, w_ptr, ws_ptr, gate_rows + I, col_ok, k0, k_hi, D, even, odd,
                            BLOCK_K, UPCAST)
    else:
        # weights first: their addresses need only the expert, x's wait for the token ids
        wg = _w_tile(w_ptr, ws_ptr, gate_rows, col_ok, k0, k_hi, D, QUANT, BLOCK_K, UPCAST)
        wu = _w_tile(w_ptr, ws_ptr, gate_rows + I, col_ok, k0, k_hi, D, QUANT, BLOCK_K, UPCAST)
        kk = k0 + tl.arange(0, BLOCK_K)
        xt = _x_cols(_x_tile(x_ptr, tok, rw, inv, row_ok, kk, D, HAS_RW, QUANT, INTERPRET), QUANT)
        acc_g = _dot(acc_g, wg, xt, UPCAST, W_TO_X, DOT_PRECISION)
        acc_u = _dot(acc_u, wu, xt, UPCAST, W_TO_X, DOT_PRECISION)
    return acc_g, acc_u


@triton.jit
def _gate_up_loop(k_lo, k_hi, x_ptr, w_ptr, ws_ptr, tok, rw, inv, row_ok, gate_rows, col_ok,
                  blocks, D, I, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                  HAS_RW: tl.constexpr, QUANT: tl.constexpr, UPCAST: tl.constexpr,
                  W_TO_X: tl.constexpr, DOT_PRECISION: tl.constexpr, INTERPRET: tl.constexpr,
                  RUNS: tl.constexpr):
    """gate_up's K loop over [k_lo, k_hi): the (gate, up) accumulators [BN, BM] in float32.
    One-pair tiles' loads feed no dot, so Triton keeps one step in flight a program; putting
    more in flight (cp.async stages, or the next step in registers) lost in the layer
    (DESIGN.md, "Register double-buffering")."""
    acc_g = _acc0(BLOCK_N, BLOCK_M, BLOCK_K, QUANT, RUNS)
    acc_u = _acc0(BLOCK_N, BLOCK_M, BLOCK_K, QUANT, RUNS)
    if INTERPRET:  # range() over a tensor bound fails in the interpreter
        k0 = k_lo
        while k0 < k_hi:
            acc_g, acc_u = _gate_up_step(acc_g, acc_u, k0, k_hi, x_ptr, w_ptr, ws_ptr, tok, rw,
                                         inv, row_ok, gate_rows, col_ok, blocks, D, I, BLOCK_K,
                                         HAS_RW, QUANT, UPCAST, W_TO_X, DOT_PRECISION,
                                         INTERPRET)
            k0 += BLOCK_K
    else:
        for k0 in range(k_lo, k_hi, BLOCK_K):
            acc_g, acc_u = _gate_up_step(acc_g, acc_u, k0, k_hi, x_ptr, w_ptr, ws_ptr, tok, rw,
                                         inv, row_ok, gate_rows, col_ok, blocks, D, I, BLOCK_K,
                                         HAS_RW, QUANT, UPCAST, W_TO_X, DOT_PRECISION,
                                         INTERPRET)
    return _acc_sum(acc_g, BLOCK_M), _acc_sum(acc_u, BLOCK_M)


@triton.jit
def _gate_up_kernel(
    x_ptr,  # [T, D] tokens
    w_ptr,  # [E, 2I, D] gate rows then up rows (mxfp4: bytes [E, 2I, D / 2])
    sw_ptr,  # [2I, D] the shared expert's gate rows then up rows (SHARED)
    w_scale_ptr,  # [E, 2I] fp32 (fp8_rowwise, fp8_w8a16); e8m0 [E, 2I, D / 32] (mxfp4); fp32
    # [E, 2 ceil(I / 128), ceil(D / 128)] (fp8_block: gate's blocks, then up's)
    bias_ptr,  # [E, 2I] expert bias, added before the GLU (HAS_BIAS)
    counts_ptr,  # [E] pairs per expert
    ids_ptr,  # [A] token of each pair
    rw_ptr,  # [A] fp32 input weight of each pair (HAS_RW)
    a_ptr,  # [A, I] SwiGLU output: x's dtype, or fp32 (w8a8: the last m-tile quantizes, or
    # with QUANT_A off down does);
    # SHARED: [T + A, I], the shared expert's rows first (w8a8: [A, I], see sa_ptr)
    sa_ptr,  # [T, I] x's dtype: the shared expert's rows of a (SHARED with w8a8)
    q_ptr,  # [A, I] e4m3 output (w8a8; uint8 view under the interpreter)
    scale_ptr,  # [A] fp32 row scales (fp8_rowwise), [A, ceil(I / 128)] group scales (fp8_block)
    part_ptr,  # [split, A, 2I] fp32 partials (split > 1)
    words_ptr,  # int32 arrival words: [m-tiles max * n_tiles] tiles, then [m-tiles max] rows
    # (split > 1 or w8a8)
    flag_ptr,  # int32 [2]: shared programs done (EARLY: each adds one after storing its rows)
    E, D, I, n_tiles, k_split,  # k_split: K elements per split, a multiple of BLOCK_K
    split,  # K ranges (a runtime value: Triton specializes 1, so split 1 drops the fixup)
    A,  # rows of a (pairs, plus T with SHARED)
    T,  # tokens (SHARED: the shared expert's rows)
    words_rows,  # offset of the per-m-tile words in words_ptr
    alpha, limit,  # swiglu_oai's alpha; the GLU's clamp (HAS_LIMIT), as ops.silu_mul's
    BLOCK_E: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    QUANT: tl.constexpr,  # the weight format: "none" | "fp8_rowwise" | "fp8_w8a16" |
    # "fp8_block" | "mxfp4"
    ACT: tl.constexpr, HAS_LIMIT: tl.constexpr, HAS_BIAS: tl.constexpr,
    HAS_RW: tl.constexpr, UPCAST: tl.constexpr, W_TO_X: tl.constexpr,
    DOT_PRECISION: tl.constexpr, INTERPRET: tl.constexpr, PDL: tl.constexpr,
    SHARED: tl.constexpr,  # the shared expert's tiles first (see _program; its weights in x's
    # dtype: with a quantized QUANT, SHARED_K columns a step, a K loop of its own)
    EARLY: tl.constexpr,  # ... they start before the routing is done (with PDL) and tell
    # down's shared programs when their rows of a are stored (flag_ptr; split 1)
    SHARED_K: tl.constexpr,
    RUNS: tl.constexpr,  # one-pair tiles sum runs of a weight row per thread (_runs)
    QUANT_BLOCK: tl.constexpr,  # columns per step when the last m-tile quantizes rows of a
    QUANT_A: tl.constexpr,  # w8a8: quantize a's rows here (else a stays fp32, down quantizes)
    ROW_BLOCK: tl.constexpr, ROW_CHUNKS: tl.constexpr,  # fp8_rowwise: lanes and loads a row of x
    X_READY: tl.constexpr,  # fp8 rowwise only: x was written before the launches this one
    # overlaps (the layer's input), so at T = 1 its amax is taken before the PDL wait
):
    one_row = False  # T = 1 (Triton specializes 1): every routed row is x[0]
    if X_READY:
        one_row = T == 1
    x0_amax = 0.0
    if one_row:  # x[0]'s amax before the wait, beside index_shuffle's tail
        first_routed = 0
        if SHARED:
            first_routed = 1  # the shared expert's m-tile quantizes nothing
        if tl.program_id(0) // split // n_tiles >= first_routed:
            x0_amax = tl.max(_row_amax(x_ptr, ids_ptr, rw_ptr, 0, 1, D, False, False,
                                       BLOCK_M, ROW_BLOCK, ROW_CHUNKS), 0)
    s, tile, u, n_tile, shared, exists, g, row0, row_stop, _, _ = _program(
        counts_ptr, E, n_tiles, split, T, BLOCK_E, BLOCK_M, SHARED, PDL, EARLY)
    if exists:
        rows = row0 + tl.arange(0, BLOCK_M)  # pairs (shared: tokens)
        row_ok = rows < row_stop
        routed = row_ok & (shared == 0)
        tok = tl.load(ids_ptr + rows, mask=routed, other=0).to(tl.int64)
        rw = tl.full([BLOCK_M], 1.0, tl.float32)
        if HAS_RW:  # the shared expert's rows: weight 1
            rw = tl.load(rw_ptr + rows, mask=routed, other=1.0)
        MIXED: tl.constexpr = SHARED and QUANT != "none"
        if SHARED:
            tok = tl.where(shared, rows.to(tl.int64), tok)
        p_rows, a_rows = _tile_rows(rows, shared, T, SHARED, QUANT)
        if SHARED and QUANT == "none":  # the shared tiles read sw_ptr in the same K loop
            wg_ptr = tl.where(shared, sw_ptr, w_ptr)
        else:
            wg_ptr = w_ptr
        inv = rw
        if QUANT == "fp8_rowwise":
            n_rows = tl.minimum(row_stop - row0, BLOCK_M)
            if SHARED:  # the shared expert's rows stay in x's dtype
                n_rows = tl.where(shared, 0, n_rows)
            if one_row:  # |x[0] * w| rounds monotonically: max |x[0]| * |w| is the same bits
                amax = tl.where(tl.arange(0, BLOCK_M) < n_rows, x0_amax * tl.abs(rw), 0.0)
            else:
                amax = _row_amax(x_ptr, ids_ptr, rw_ptr, row0, n_rows, D, True, HAS_RW,
                                 BLOCK_M, ROW_BLOCK, ROW_CHUNKS)
            inv, x_scale = row_scales(amax)
        cols = n_tile * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < I
        gate_rows = g.to(tl.int64) * (2 * I) + cols  # [BN] rows of w viewed as [E*2I, D]
        blocks = gate_rows
        if QUANT == "fp8_block":  # the gate rows' scale blocks (the up half's restart after)
            blocks = g.to(tl.int64) * (2 * tl.cdiv(I, 128)) + cols // 128
        k_lo = s * k_split
        k_hi = tl.minimum(k_lo + k_split, D)
        if MIXED:
            if shared:  # the shared expert's weights in x's dtype
                acc_g, acc_u = _gate_up_loop(k_lo, k_hi, x_ptr, sw_ptr, w_scale_ptr, tok, rw, inv,
                                             row_ok, gate_rows, col_ok, blocks, D, I, BLOCK_N,
                                             BLOCK_M, SHARED_K, HAS_RW, "none", UPCAST, False,
                                             DOT_PRECISION, INTERPRET, RUNS)
            else:
                acc_g, acc_u = _gate_up_loop(k_lo, k_hi, x_ptr, w_ptr, w_scale_ptr, tok, rw, inv,
                                             row_ok, gate_rows, col_ok, blocks, D, I, BLOCK_N,
                                             BLOCK_M, BLOCK_K, HAS_RW, QUANT, UPCAST, W_TO_X,
                                             DOT_PRECISION, INTERPRET, RUNS)
        else:
            acc_g, acc_u = _gate_up_loop(k_lo, k_hi, x_ptr, wg_ptr, w_scale_ptr, tok, rw, inv,
                                         row_ok, gate_rows, col_ok, blocks, D, I, BLOCK_N, BLOCK_M,
                                         BLOCK_K, HAS_RW, QUANT, UPCAST, W_TO_X, DOT_PRECISION,
                                         INTERPRET, RUNS)
        mask = col_ok[:, None] & row_ok[None, :]  # [BN, BM]
        if split > 1:  # store both partials, arrive once; the last split sums them all
            at = p_rows.to(tl.int64)[None, :] * (2 * I) + cols[:, None]
            stride = tl.cast(A, tl.int64) * (2 * I)  # one split's partials: may pass 2^31
            mine = part_ptr + s * stride
            tl.store(mine + at, acc_g, mask=mask)
            tl.store(mine + at + I, acc_u, mask=mask)
            last = _arrive(words_ptr + tile, split)
            if last:
                acc_g = _partials_sum(part_ptr, at, mask, split, stride)
                acc_u = _partials_sum(part_ptr, at + I, mask, split, stride)
        else:
            last = True
        if last:
            if QUANT == "fp8_rowwise" or QUANT == "fp8_w8a16":
                ws_g = tl.load(w_scale_ptr + gate_rows, mask=col_ok, other=0.0)
                ws_u = tl.load(w_scale_ptr + gate_rows + I, mask=col_ok, other=0.0)
                if QUANT == "fp8_rowwise":
                    ws_g = ws_g[:, None] * x_scale[None, :]
                    ws_u = ws_u[:, None] * x_scale[None, :]
                else:
                    ws_g = ws_g[:, None]
                    ws_u = ws_u[:, None]
                if MIXED:  # the shared expert's weights carry no scales
                    ws_g = tl.where(shared, 1.0, ws_g)
                    ws_u = tl.where(shared, 1.0, ws_u)
                acc_g = acc_g * ws_g
                acc_u = acc_u * ws_u
            if HAS_BIAS:
                b_g = tl.load(bias_ptr + gate_rows, mask=col_ok, other=0.0)
                b_u = tl.load(bias_ptr + gate_rows + I, mask=col_ok, other=0.0)
                acc_g += b_g.to(tl.float32)[:, None]
                acc_u += b_u.to(tl.float32)[:, None]
            a = glu_f32(acc_g, acc_u, ACT, HAS_LIMIT, alpha, limit)  # e.g. silu(gate) * up, fp32
            a_at = a_rows.to(tl.int64)[None, :] * I + cols[:, None]
            if QUANT == "fp8_rowwise" or QUANT == "fp8_block":
                if SHARED:
                    if shared:  # the shared expert's rows, in x's dtype
                        tl.store(sa_ptr + a_at, cast_to(a, sa_ptr.dtype.element_ty, INTERPRET),
                                 mask=mask)
                        _release_shared(flag_ptr, EARLY)
                    elif QUANT_A:
                        _store_quantized(a, a_ptr, a_at, mask, q_ptr, scale_ptr, words_ptr,
                                         words_rows + u, n_tiles, rows, row_ok, I, BLOCK_M,
                                         QUANT_BLOCK, QUANT, INTERPRET)
                    else:
                        tl.store(a_ptr + a_at, a, mask=mask)
                elif QUANT_A:
                    _store_quantized(a, a_ptr, a_at, mask, q_ptr, scale_ptr, words_ptr,
                                     words_rows + u, n_tiles, rows, row_ok, I, BLOCK_M,
                                     QUANT_BLOCK, QUANT, INTERPRET)
                else:
                    tl.store(a_ptr + a_at, a, mask=mask)
            else:
                tl.store(a_ptr + a_at, cast_to(a, a_ptr.dtype.element_ty, INTERPRET), mask=mask)
                if shared:
                    _release_shared(flag_ptr, EARLY)


@triton.jit
def _store_quantized(a, a_ptr, a_at, mask, q_ptr, scale_ptr, words_ptr, word, n_tiles, rows,
                     row_ok, I, BLOCK_M: tl.constexpr, QUANT_BLOCK: tl.constexpr,
                     QUANT: tl.constexpr, INTERPRET: tl.constexpr):
    """w8a8: store this tile's fp32 rows of a; the m-tile's last tile quantizes them (per row,
    or for fp8_block per 128-column group)."""
    tl.store(a_ptr + a_at, a, mask=mask)
    if _arrive(words_ptr + word, n_tiles):
        if QUANT == "fp8_block":
            _quantize_groups(a_ptr, q_ptr, scale_ptr, rows, row_ok, I, BLOCK_M, INTERPRET)
        else:
            _quantize_rows(a_ptr, q_ptr, scale_ptr, rows, row_ok, I, BLOCK_M, QUANT_BLOCK,
                           INTERPRET)


@triton.jit
def _release_shared(flag_ptr, EARLY: tl.constexpr):
    """EARLY: a shared program of gate_up has stored its rows of a: count it for down's."""
    if EARLY:
        tl.debug_barrier()  # every thread's stores happen before the release
        tl.atomic_add(flag_ptr, 1, sem="release")


@triton.jit
def _quantize_rows(a_ptr, q_ptr, scale_ptr, rows, row_ok, I, BLOCK_M: tl.constexpr,
                   QUANT_BLOCK: tl.constexpr, INTERPRET: tl.constexpr):
    """(q, scale) of whole rows of a (fp32, written by this m-tile's programs): two passes over
    them (L2), amax then quantize, with the formula of ops.quantize."""
    offs = tl.arange(0, QUANT_BLOCK)
    base = rows.to(tl.int64)[:, None] * I
    amax = tl.zeros([BLOCK_M], tl.float32)
    c = 0
    while c < I:
        m = row_ok[:, None] & (c + offs < I)[None, :]
        v = tl.load(a_ptr + base + c + offs[None, :], mask=m, other=0.0, cache_modifier=".cg")
        amax = tl.maximum(amax, tl.max(tl.abs(v), 1))
        c += QUANT_BLOCK
    inv, scale = row_scales(amax)
    c = 0
    while c < I:
        m = row_ok[:, None] & (c + offs < I)[None, :]
        v = tl.load(a_ptr + base + c + offs[None, :], mask=m, other=0.0, cache_modifier=".cg")
        store_fp8(q_ptr + base + c + offs[None, :], v, inv[:, None], m, INTERPRET)
        c += QUANT_BLOCK
    tl.store(scale_ptr + rows, scale, mask=row_ok)


@triton.jit
def _quantize_groups(a_ptr, q_ptr, scale_ptr, rows, row_ok, I, BLOCK_M: tl.constexpr,
                     INTERPRET: tl.constexpr):
    """(q, scale [rows, ceil(I / 128)]) of whole rows of a (fp32, written by this m-tile's
    programs), one pass: each 128-column group with the formula of ops.quantize_fp8_groups."""
    offs = tl.arange(0, 128)
    base = rows.to(tl.int64)[:, None] * I
    G = tl.cdiv(I, 128)
    c = 0
    while c < I:
        m = row_ok[:, None] & (c + offs < I)[None, :]
        v = tl.load(a_ptr + base + c + offs[None, :], mask=m, other=0.0, cache_modifier=".cg")
        inv, scale = row_scales(tl.max(tl.abs(v), 1))
        store_fp8(q_ptr + base + c + offs[None, :], v, inv[:, None], m, INTERPRET)
        tl.store(scale_ptr + rows.to(tl.int64) * G + c // 128, scale, mask=row_ok)
        c += 128


@triton.jit
def _down_step(acc, k0, k_hi, a_ptr, as_ptr, w_ptr, ws_ptr, rows, row_ok, w_rows, col_ok, blocks,
               inv, I, BLOCK_K: tl.constexpr, QUANT: tl.constexpr, UPCAST: tl.constexpr,
               W_TO_X: tl.constexpr, DOT_PRECISION: tl.constexpr, A_F32: tl.constexpr,
               INTERPRET: tl.constexpr):
    """One K step of down: acc += w2 rows [BN, BK] @ a^T [BK, BM] (fp8_block: times the step's
    block scales, blocks [BN] the rows' scale rows of w_scale viewed as [E * NB, KB], as_ptr
    a's group scales [A, KB])."""
    if QUANT == "fp8_block":  # whole 128-column scale blocks a step (see _plan)
        w = _w_tile(w_ptr, ws_ptr, w_rows, col_ok, k0, k_hi, I, QUANT, BLOCK_K, UPCAST)
        kk = k0 + tl.arange(0, BLOCK_K)
        at = tl.load(a_ptr + rows.to(tl.int64)[:, None] * I + kk[None, :],
                     mask=row_ok[:, None] & (kk < k_hi)[None, :], other=0.0,
                     cache_modifier=".cg")
        KB = tl.cdiv(I, 128)
        kb = k0 // 128 + tl.arange(0, BLOCK_K // 128)
        sx = tl.load(as_ptr + rows.to(tl.int64)[:, None] * KB + kb[None, :],
                     mask=row_ok[:, None] & (kb < KB)[None, :], other=0.0, cache_modifier=".cg")
        acc = _block_dot(acc, w, at, _block_scales(ws_ptr, blocks, col_ok, k0, KB, BLOCK_K), sx,
                         UPCAST, DOT_PRECISION)
    elif QUANT == "mxfp4" and rows.shape[0] == 1:  # one pair: see _mxfp4_gemv
        even, odd = _row_halves(a_ptr, tl.sum(rows, 0).to(tl.int64), 1.0,
                                tl.sum(row_ok.to(tl.int32), 0) > 0, k0, k_hi, I, False, False,
                                BLOCK_K)
        acc = _mxfp4_gemv(acc, w_ptr, ws_ptr, w_rows, col_ok, k0, k_hi, I, even, odd, BLOCK_K,
                          UPCAST)
    else:
        w = _w_tile(w_ptr, ws_ptr, w_rows, col_ok, k0, k_hi, I, QUANT, BLOCK_K, UPCAST)
        acc = _down_dot(acc, w, k0, k_hi, a_ptr, rows, row_ok, inv, I, BLOCK_K, QUANT, UPCAST,
                        W_TO_X, DOT_PRECISION, A_F32, INTERPRET)
    return acc


@triton.jit
def _down_dot(acc, w, k0, k_hi, a_ptr, rows, row_ok, inv, I, BLOCK_K: tl.constexpr,
              QUANT: tl.constexpr, UPCAST: tl.constexpr, W_TO_X: tl.constexpr,
              DOT_PRECISION: tl.constexpr, A_F32: tl.constexpr, INTERPRET: tl.constexpr):
    """The rest of a K step of down (not fp8_block, not a one-pair mxfp4 tile) once its weight
    tile w [BN, BK] at k0 is loaded: acc += w @ a^T [BK, BM]."""
    kk = k0 + tl.arange(0, BLOCK_K)
    at = tl.load(a_ptr + rows.to(tl.int64)[:, None] * I + kk[None, :],
                 mask=row_ok[:, None] & (kk < k_hi)[None, :], other=0.0,
                 cache_modifier=".cg")  # (EARLY: rows other programs of gate_up wrote)
    if A_F32:  # fp32 rows of a quantized here, exactly as _quantize_rows would
        y = tl.clamp(at * inv[:, None], -448.0, 448.0, propagate_nan=tl.PropagateNan.ALL)
        at = _fp8_value(y, INTERPRET)
    return _dot(acc, w, _x_cols(at, QUANT), UPCAST, W_TO_X, DOT_PRECISION)


@triton.jit
def _down_loop(k_lo, k_hi, a_ptr, as_ptr, w_ptr, ws_ptr, rows, row_ok, w_rows, col_ok, blocks,
               inv, I, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
               QUANT: tl.constexpr, UPCAST: tl.constexpr, W_TO_X: tl.constexpr,
               DOT_PRECISION: tl.constexpr, INTERPRET: tl.constexpr, RUNS: tl.constexpr,
               A_F32: tl.constexpr, w0, FIRST: tl.constexpr):
    """down's K loop over [k_lo, k_hi): the accumulator [BN, BM] in float32. FIRST: w0 is the
    weight tile of the first step, loaded before the program's PDL wait (_down_kernel)."""
    acc = _acc0(BLOCK_N, BLOCK_M, BLOCK_K, QUANT, RUNS)
    k_start = k_lo
    if FIRST:
        acc = _down_dot(acc, w0, k_lo, k_hi, a_ptr, rows, row_ok, inv, I, BLOCK_K, QUANT, UPCAST,
                        W_TO_X, DOT_PRECISION, A_F32, INTERPRET)
        k_start += BLOCK_K
    if INTERPRET:  # range() over a tensor bound fails in the interpreter
        k0 = k_start
        while k0 < k_hi:
            acc = _down_step(acc, k0, k_hi, a_ptr, as_ptr, w_ptr, ws_ptr, rows, row_ok, w_rows,
                             col_ok, blocks, inv, I, BLOCK_K, QUANT, UPCAST, W_TO_X,
                             DOT_PRECISION, A_F32, INTERPRET)
            k0 += BLOCK_K
    else:
        for k0 in range(k_start, k_hi, BLOCK_K):
            acc = _down_step(acc, k0, k_hi, a_ptr, as_ptr, w_ptr, ws_ptr, rows, row_ok, w_rows,
                             col_ok, blocks, inv, I, BLOCK_K, QUANT, UPCAST, W_TO_X,
                             DOT_PRECISION, A_F32, INTERPRET)
    return _acc_sum(acc, BLOCK_M)


@triton.jit
def _down_kernel(
    a_ptr,  # [A, I] activations (x's dtype, or e4m3 with a_scale, or fp32 with A_F32);
    # SHARED: [T + A, I]
    # (w8a8: [A, I], the shared expert's rows in sa_ptr)
    sa_ptr,  # [T, I] the shared expert's rows of a in x's dtype (SHARED with a quantized QUANT:
    # sa_ptr is a_ptr itself but for w8a8)
    a_scale_ptr,  # [A] fp32 (fp8_rowwise), [A, ceil(I / 128)] (fp8_block)
    w_ptr,  # [E, D, I] (mxfp4: bytes [E, D, I / 2])
    sw_ptr,  # [D, I] the shared expert's (SHARED)
    w_scale_ptr,  # [E, D] fp32 (fp8_rowwise, fp8_w8a16); e8m0 [E, D, I / 32] (mxfp4); fp32
    # [E, ceil(D / 128), ceil(I / 128)] (fp8_block)
    bias_ptr,  # [E, D] expert bias, added before the output weight (HAS_BIAS)
    counts_ptr,  # [E] pairs per expert
    ids_ptr,  # [A] token of each pair (TOP1)
    pos_ptr,  # [T * K] Routing.positions (not TOP1)
    rw_ptr,  # [A] fp32 output weight of each pair (HAS_RW)
    out_ptr,  # [T, D] accumulated into (ACCUMULATE), else written
    y_ptr,  # [A, D] fp32 rows for the combine (not TOP1; SHARED: [T + A, D])
    part_ptr,  # [split, A, D] fp32 partials (split > 1; SHARED: [split, T + A, D])
    words_ptr,  # int32 arrival words: [m-tiles max * n_tiles] tiles, then [n_tiles] columns
    # (split > 1 or not TOP1)
    flag_ptr,  # int32 [2]: gate_up's shared programs done, then this launch's past the wait
    gx_ptr,  # [T, D] the layer's input (GATE)
    gate_ptr,  # [D] the shared expert's gate (GATE)
    flag_expected,  # gate_up's shared programs (EARLY)
    E, D, I, n_tiles, k_split, split, A, T,  # A: rows of a
    words_cols,  # offset of the per-n-tile words in words_ptr
    K: tl.constexpr,  # pairs per token (positions has T * K entries)
    TOP1: tl.constexpr,  # K == 1: each pair owns its token's row
    ACCUMULATE: tl.constexpr,  # out += the sum (else out = the sum)
    BLOCK_E: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_T: tl.constexpr,  # tokens per step of the combine
    QUANT: tl.constexpr,  # the weight format, as in _gate_up_kernel
    HAS_BIAS: tl.constexpr, HAS_RW: tl.constexpr, UPCAST: tl.constexpr, W_TO_X: tl.constexpr,
    DOT_PRECISION: tl.constexpr, INTERPRET: tl.constexpr, PDL: tl.constexpr,
    SHARED: tl.constexpr,  # a's first T rows are the shared expert's (see _program; not TOP1)
    EARLY: tl.constexpr,  # the shared programs wait for gate_up's shared rows of a (flag_ptr),
    # not for all of gate_up, and for the rest only before their epilogue
    SHARED_K: tl.constexpr,  # as in _gate_up_kernel
    RUNS: tl.constexpr,  # as in _gate_up_kernel
    A_F32: tl.constexpr,  # fp8_rowwise: a's routed rows in fp32, quantized here (one pair a
    # tile: see the module's docstring)
    ROW_BLOCK: tl.constexpr, ROW_CHUNKS: tl.constexpr,  # A_F32: lanes and loads a row of a
    GATE: tl.constexpr,  # the shared expert's rows times sigmoid(x . gate) (see _gate)
    GATE_K: tl.constexpr,  # columns of x a step of _gate
    PRELOAD: tl.constexpr,  # the first K step's weight tile is loaded before a's rows are read,
    # with PDL before the program's wait (the routing, which the tile needs, ended before
    # gate_up passed its own): a program's first bytes are on their way while gate_up ends
):
    WAIT_LATE: tl.constexpr = PDL and PRELOAD  # the program waits after its first weight tile
    s, tile, u, n_tile, shared, exists, g, row0, row_stop, total_tiles, num_valid = _program(
        counts_ptr, E, n_tiles, split, T, BLOCK_E, BLOCK_M, SHARED, PDL and not WAIT_LATE, EARLY)
    if EARLY:
        if shared:
            if WAIT_LATE:  # as _program: the shared programs let the next kernel launch at once
                gdc_launch_dependents()
            _await_shared(flag_ptr, flag_expected,
                          tl.cdiv(T, BLOCK_M) * n_tiles * split)
    if exists:
        rows = row0 + tl.arange(0, BLOCK_M)  # pairs (shared: tokens)
        row_ok = rows < row_stop
        MIXED: tl.constexpr = SHARED and QUANT != "none"
        y_rows, a_rows = _tile_rows(rows, shared, T, SHARED, QUANT)
        if SHARED and QUANT == "none":  # the shared tiles read sw_ptr in the same K loop
            wd_ptr = tl.where(shared, sw_ptr, w_ptr)
        else:
            wd_ptr = w_ptr
        cols = n_tile * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < D
        w_rows = g.to(tl.int64) * D + cols  # [BN] rows of w viewed as [E*D, I]
        blocks = w_rows
        if QUANT == "fp8_block":  # the rows' scale blocks
            blocks = g.to(tl.int64) * tl.cdiv(D, 128) + cols // 128
        k_lo = s * k_split
        k_hi = tl.minimum(k_lo + k_split, I)
        w0 = 0.0
        if PRELOAD:  # (MIXED: the routed tiles' step; the shared tiles load none)
            w0 = _w_tile(wd_ptr, w_scale_ptr, w_rows, col_ok & ((shared == 0) | (not MIXED)),
                         k_lo, k_hi, I, QUANT, BLOCK_K, UPCAST)
        if WAIT_LATE:
            if (shared == 0) | (not EARLY):  # EARLY's shared programs wait in their epilogue
                gdc_wait()
                gdc_launch_dependents()
        if A_F32:  # the routed rows' scales from their fp32 values
            n_rows = tl.where(shared, 0, tl.minimum(row_stop - row0, BLOCK_M))
            inv, a_sc = row_scales(_row_amax(a_ptr, ids_ptr, rw_ptr, row0, n_rows, I, False,
                                             False, BLOCK_M, ROW_BLOCK, ROW_CHUNKS))
        else:
            inv = tl.zeros([BLOCK_M], tl.float32)
            a_sc = inv
        if MIXED:
            if shared:  # the shared expert's weights and rows of a in the activations' dtype
                acc = _down_loop(k_lo, k_hi, sa_ptr, a_scale_ptr, sw_ptr, w_scale_ptr, a_rows,
                                 row_ok, w_rows, col_ok, blocks, inv, I, BLOCK_N, BLOCK_M,
                                 SHARED_K, "none", UPCAST, False, DOT_PRECISION, INTERPRET, RUNS,
                                 False, w0, False)
            else:
                acc = _down_loop(k_lo, k_hi, a_ptr, a_scale_ptr, w_ptr, w_scale_ptr, a_rows,
                                 row_ok, w_rows, col_ok, blocks, inv, I, BLOCK_N, BLOCK_M,
                                 BLOCK_K, QUANT, UPCAST, W_TO_X, DOT_PRECISION, INTERPRET, RUNS,
                                 A_F32, w0, PRELOAD)
        else:
            acc = _down_loop(k_lo, k_hi, a_ptr, a_scale_ptr, wd_ptr, w_scale_ptr, a_rows,
                             row_ok, w_rows, col_ok, blocks, inv, I, BLOCK_N, BLOCK_M, BLOCK_K,
                             QUANT, UPCAST, W_TO_X, DOT_PRECISION, INTERPRET, RUNS, A_F32, w0,
                             PRELOAD)
        if EARLY:
            if shared:  # the routing and all of a, for the combine: as the other programs
                if PDL:
                    gdc_wait()
                _, _, _, _, total_tiles, num_valid = _locate(counts_ptr, 0, E, True, BLOCK_E,
                                                             BLOCK_M)
                total_tiles += tl.cdiv(T, BLOCK_M)
        mask = col_ok[:, None] & row_ok[None, :]  # [BN, BM]
        at_y = y_rows.to(tl.int64)[None, :] * D + cols[:, None]
        if split > 1:
            stride = tl.cast(A, tl.int64) * D
            tl.store(part_ptr + s * stride + at_y, acc, mask=mask)
            last = _arrive(words_ptr + tile, split)
            if last:
                acc = _partials_sum(part_ptr, at_y, mask, split, stride)
        else:
            last = True
        if last:
            if QUANT == "fp8_rowwise" or QUANT == "fp8_w8a16":
                scale = tl.load(w_scale_ptr + w_rows, mask=col_ok, other=0.0)[:, None]
                if A_F32:
                    scale = scale * a_sc[None, :]
                elif QUANT == "fp8_rowwise":
                    scale = scale * tl.load(a_scale_ptr + rows, mask=row_ok & (shared == 0),
                                            other=0.0)[None, :]
                if MIXED:  # the shared expert's weights and rows carry no scales
                    scale = tl.where(shared, 1.0, scale)
                acc = acc * scale
            if HAS_BIAS:
                acc += tl.load(bias_ptr + w_rows, mask=col_ok, other=0.0).to(tl.float32)[:, None]
            if HAS_RW:  # the shared expert's rows: weight 1
                acc = acc * tl.load(rw_ptr + rows, mask=row_ok & (shared == 0),
                                    other=1.0)[None, :]
            if TOP1 or (GATE and not SHARED):
                tok = tl.load(ids_ptr + rows, mask=row_ok, other=0)
            if GATE:
                if SHARED:
                    if shared:  # rows = tokens
                        acc = acc * _gate(gx_ptr, gate_ptr, rows, row_ok, D, BLOCK_M,
                                          GATE_K, INTERPRET)[None, :]
                else:  # the shared expert alone: every row
                    acc = acc * _gate(gx_ptr, gate_ptr, tok, row_ok, D, BLOCK_M, GATE_K,
                                      INTERPRET)[None, :]
            if TOP1:  # the pair's token has no other pair: read, add in fp32, round once
                dst = out_ptr + tok.to(tl.int64)[None, :] * D + cols[:, None]
                if ACCUMULATE:
                    acc += tl.load(dst, mask=mask, other=0.0).to(tl.float32)
                tl.store(dst, cast_to(acc, out_ptr.dtype.element_ty, INTERPRET), mask=mask)
            else:
                tl.store(y_ptr + at_y, acc, mask=mask)
                if _arrive(words_ptr + words_cols + n_tile, total_tiles):
                    _combine(out_ptr, y_ptr, pos_ptr, cols, col_ok, num_valid, T, D, K, BLOCK_T,
                             ACCUMULATE, SHARED, INTERPRET)


@triton.jit
def _combine(out_ptr, y_ptr, pos_ptr, cols, col_ok, num_valid, T, D, K: tl.constexpr,
             BLOCK_T: tl.constexpr, ACCUMULATE: tl.constexpr, SHARED: tl.constexpr,
             INTERPRET: tl.constexpr):
    """out[t, cols] (+)= sum over j < K of y[positions[t * K + j], cols] for pairs below num_valid,
    for every token, in fp32 in choice order, rounded once (not ACCUMULATE: only tokens with a
    pair below num_valid are written). SHARED: y's first T rows are the shared expert's, added
    first (every token written); the pairs' rows follow."""
    t0 = 0
    while t0 < T:
        ts = t0 + tl.arange(0, BLOCK_T)
        t_ok = ts < T
        dst = out_ptr + ts.to(tl.int64)[:, None] * D + cols[None, :]
        m = t_ok[:, None] & col_ok[None, :]
        acc = tl.zeros([BLOCK_T, cols.shape[0]], tl.float32)  # [BT, BN]
        if ACCUMULATE:
            acc += tl.load(dst, mask=m, other=0.0).to(tl.float32)
        pairs = y_ptr
        if SHARED:
            acc += tl.load(y_ptr + ts.to(tl.int64)[:, None] * D + cols[None, :], mask=m,
                           other=0.0, cache_modifier=".cg")
            pairs = y_ptr + tl.cast(T, tl.int64) * D
        routed = tl.zeros([BLOCK_T], tl.int1)
        for j in tl.static_range(K):
            p = tl.load(pos_ptr + ts.to(tl.int64) * K + j, mask=t_ok, other=0).to(tl.int64)
            ok = t_ok & (p >= 0) & (p < num_valid)
            routed = routed | ok
            acc += tl.load(pairs + p[:, None] * D + cols[None, :],
                           mask=ok[:, None] & col_ok[None, :], other=0.0, cache_modifier=".cg")
        if not (ACCUMULATE or SHARED):  # written only where the token has a routed pair
            m = m & routed[:, None]
        tl.store(dst, cast_to(acc, out_ptr.dtype.element_ty, INTERPRET), mask=m)
        t0 += BLOCK_T


# ---------------------------------------------------------------------------------------- host

def sm_count(device: torch.device) -> int:
    """SMs the plan spreads weights over (a small number under the interpreter)."""
    return device_sms(device) if device.type == "cuda" else configs.INTERPRETER_SMS


_WORDS: dict[tuple[torch.device, int], list[Tensor]] = {}


def arrival_words(like: Tensor, n: int, workspace: int = 0,
                  held: Tensor | None = None) -> Tensor:
    """n zeroed int32 arrival words on ``like``'s device. The kernels leave them zero, so one
    buffer per (device, workspace) serves every call in stream order: calls that may run at the
    same time on two streams use two workspaces (the layer's shared expert beside its routed
    experts). Old buffers are kept alive: a captured CUDA graph may still point at them. Inside
    a capture a new buffer cannot be zeroed before the replay, so warm up (as graphed() does) or
    reserve first. ``held``: the buffer held_words gave the op (a graph input when compiled),
    used when large enough; traced by torch.compile without one: fresh zeros in the graph
    (a fill kernel each call)."""
    if held is not None and held.numel() >= n:
        return held  # whole: compiled, the mutated tensor is then the graph input itself
    device = like.device
    if traced((like,)):
        return torch.zeros(n, dtype=torch.int32, device=device)
    buffers = _WORDS.setdefault((device, workspace), [])
    if buffers and buffers[-1].numel() >= n:
        return buffers[-1][:n]
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("the fused decode kernels need a larger arrival buffer inside a CUDA "
                           "graph capture; run the layer once at this size before capturing")
    words = persistent_zeros(max(n, 1024), torch.int32, device)
    if device.type == "cuda":  # CUDA-graph trees (compile's reduce-overhead) may mutate it
        torch._dynamo.mark_static_address(words)
    buffers.append(words)
    return words[:n]


def held_words(like: Tensor, workspace: int) -> Tensor | None:
    """The newest arrival buffer of (like's device, workspace), or None: what the ops pass their
    kernels' launcher. Compiled, Dynamo makes it a graph input (a static address) and the
    kernels mutate it in place, so no graph fills fresh words every call."""
    buffers = _WORDS.get((like.device, workspace))
    return buffers[-1] if buffers else None


def reserve_arrival_words(w13: Tensor, w2: Tensor, max_pairs: int, workspace: int = 0,
                          k_per_element: int = 1, quant: str = "none",
                          shared_tokens: int = 0) -> None:
    """Allocate now the arrival words every fused call of a layer (w13 [E, 2I, D], w2 [E, D, I];
    k_per_element: weight values a stored element holds along K, mxfp4's 2) with up to
    ``max_pairs`` pairs (and a shared expert in the same launches for up to ``shared_tokens``
    tokens) needs, so that no later call allocates them: not while a CUDA graph captures (which
    arrival_words refuses), nor while torch.compile's CUDA-graph trees warm up (the buffer would
    land in their private pool and fail its check). Call it outside both."""
    (E, _, D), I = w13.shape, w2.shape[2]
    D, I = D * k_per_element, I * k_per_element
    sms, need = sm_count(w13.device), 0
    for A in range(1, max_pairs + shared_tokens + 1):
        plan = configs.select(A, E, D, I, w13.dtype, sms, quant, device_name(w13.device))
        up = max_m_tiles(A, E, plan.gate_up.block_m) + shared_tokens
        dn = max_m_tiles(A, E, plan.down.block_m) + shared_tokens
        need = max(need, up * cdiv(I, plan.gate_up.block_n) + up,
                   dn * cdiv(D, plan.down.block_n) + cdiv(D, plan.down.block_n))
    arrival_words(w13, need, workspace)
    if shared_tokens:
        arrival_words(w13, 2, FLAG_WORKSPACE)


def max_m_tiles(A: int, E: int, block_m: int) -> int:
    """The most m-tiles A pairs over E experts can form: sum of cdiv(count, BM) over non-empty
    experts <= A // BM + min(E, A)."""
    return A // block_m + min(E, A)


def _pdl(plan: configs.DecodeConfig, like: Tensor, interpret: bool) -> bool:
    """Whether to launch with PDL: where the table says so, on the GPU, and not while
    torch.compile traces. Inductor's analysis of a user kernel stops at griddepcontrol's inline
    asm and then takes every argument for written (copies of counts, ids, x: torch 2.11, the
    Qwen3-30B-A3B compiled decode step fell from 1.30x transformers' to 1.01x)."""
    return plan.pdl and not interpret and not traced((like,))


FLAG_WORKSPACE = 2  # the arrival words of _await_shared's handshake (0: routed, 1: shared)


def _early(early: bool, shared: Tensor | None, gate_up_split: int, like: Tensor) -> bool:
    """Whether a merged call's shared programs run EARLY: asked for, with a shared expert, a
    gate_up without split-K partials (their buffer would be allocated after the launches they
    overlap), and not while torch.compile traces (no persistent handshake words there)."""
    return early and shared is not None and gate_up_split == 1 and not traced((like,))


def _launch_options(cfg: configs.GemmConfig, pdl: bool) -> dict:
    opts = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if pdl:
        opts["launch_pdl"] = True
    return opts


def _upcast(interpret: bool, x_dtype: torch.dtype, quant: str, w_dtype: torch.dtype) -> bool:
    """Under the interpreter, dots of bf16 or fp8 go through fp32 (exact for their products)."""
    return interpret and (x_dtype == torch.bfloat16 or w_dtype == FP8_DTYPE or quant == "mxfp4")


def _check_block_k(quant: str, cfg: configs.GemmConfig) -> None:
    if quant == "mxfp4" and cfg.block_k % 32:
        raise ValueError(f"mxfp4 needs K steps of whole 32-column scale groups, got block_k "
                         f"{cfg.block_k}")


def _plan(A: int, E: int, D: int, I: int, w: Tensor, quant: str) -> configs.DecodeConfig:
    """The tiles for A rows of a (configs.select). fp8_block's K steps hold whole 128-column
    scale blocks: one for MMA tiles (each block's product is scaled before the next is added),
    the tile's own multiple of 128 for one-pair tiles (summed per block on the CUDA cores)."""
    plan = configs.select(A, E, D, I, w.dtype, sm_count(w.device), quant, device_name(w.device))
    if quant != "fp8_block":
        return plan
    fit = [g.with_(block_k=128 if g.block_m > 1 else max(128, g.block_k // 128 * 128))
           for g in (plan.gate_up, plan.down)]
    return plan.with_(gate_up=fit[0], down=fit[1])


def _k_split(K: int, cfg: configs.GemmConfig) -> tuple[int, int]:
    """(K elements per split, a multiple of block_k; splits that are not empty)."""
    steps = cdiv(K, cfg.block_k)
    per = cdiv(steps, max(1, min(cfg.split_k, steps)))
    return per * cfg.block_k, cdiv(steps, per)


def _runs(cfg: configs.GemmConfig, k_split: int, quant: str) -> bool:
    """Whether a one-pair tile sums each run of 16 bytes of a weight row per thread and reduces
    across threads once after its K loop (_dot) instead of every step: fewer instructions (the
    sm_90 K loop of an fp8 gate_up tile 16 x 1024 1067 -> 819, bf16 4 x 2048 580 -> 452, no
    shuffles or barriers) for more live registers (bf16 4 x 2048 gate_up 80 -> 90, fp8_w8a16
    32 x 256 96 -> 123), so only where it saves reductions: at least 2 K steps of e4m3 weights,
    4 of bf16. H200, the layer in CUDA graphs, T = 1..8, per step / this rule, us
    (benchmarks/probe_one_pair.py, results/probe_one_pair_a8b0416.jsonl): fp8_w8a16 Maverick
    TP8 T = 1 25.3 / 22.7, Scout TP8 22.7 / 21.0, fp8 rowwise Maverick 27.3 / 25.1, bf16
    Maverick T = 4 53.4 / 51.2; 48 rows 1.012x (geometric mean), slower past the ~1% noise at
    one, fp8_w8a16 Mixtral TP2 T = 4 143.3 / 150.0. Runs everywhere lost up to 6% with one or
    two steps (bf16 Mixtral TP2 T = 1 90.9 / 97.0, _f1e4e24.jsonl)."""
    if cfg.block_m != 1 or quant in ("mxfp4", "fp8_block"):
        return False
    return k_split // cfg.block_k >= (2 if quant in ("fp8_rowwise", "fp8_w8a16") else 4)


def _shared_k(cfg: configs.GemmConfig, w: Tensor, x_dtype: torch.dtype, quant: str) -> int:
    """The K step of a merged shared expert's weights (x's dtype) beside routed weights in a
    quantized format: as many bytes a row as the routed step's (at least 16 columns, a dot's)."""
    if quant == "none":
        return cfg.block_k
    bits = w.element_size() * 8 // (2 if quant == "mxfp4" else 1)
    return max(16, cfg.block_k * bits // (x_dtype.itemsize * 8))


@kernel_op("decode_gate_up", mutates_args=("a", "q", "scale", "sa", "words"))
def _gate_up_op(x: Tensor, w13: Tensor, w13_scale: Optional[Tensor], counts: Tensor,
                token_ids: Tensor, row_weights: Optional[Tensor], a: Optional[Tensor],
                q: Optional[Tensor], scale: Optional[Tensor], sa: Optional[Tensor],
                workspace: int, quant: str, bias: Optional[Tensor], activation: str,
                alpha: float, limit: Optional[float], words: Optional[Tensor],
                shared: Optional[Tensor], early: bool) -> None:
    """a [A, I] (x's dtype), or for w8a8 w13 (q [A, I], scale [A], fp8_block's [A, I / 128])
    (fp8 rowwise: or a [A, I] float32 and no q, the rows left for down to quantize) <- the
    GLU (activation, alpha, limit: as ops.silu_mul's) of the gathered rows' products plus
    their expert's bias [E, 2I]; with the shared expert's w13 ``shared`` [2I, D] (x's dtype), a
    [T + A, I] holds its rows first, or for w8a8 sa [T, I] holds them. early: x was written
    before the launches this one overlaps (the layer's input), so with PDL the shared programs
    do not wait for the routing (see _program) and fp8 rowwise at T = 1 takes x's amax before
    the wait. words: held_words (left zero).
    The tiles are planned here, inside the op, so torch.compile never traces the host logic."""
    (T, D), (E, two_i, _), A = x.shape, w13.shape, token_ids.shape[0]
    I = two_i // 2
    s_rows = T if shared is not None else 0  # the shared expert's rows of a
    if A + s_rows == 0 or I == 0:
        return
    plan = _plan(A + s_rows, E, D, I, w13, quant)
    cfg = plan.gate_up
    k_split, split = _k_split(D, cfg)
    n_tiles = cdiv(I, cfg.block_n)
    m_tiles = max_m_tiles(A, E, cfg.block_m) + cdiv(s_rows, cfg.block_m)
    _check_block_k(quant, cfg)
    fp8 = quant in W8A8
    quant_a = fp8 and q is not None  # else a holds the rows in fp32: down quantizes them
    # arrival words only where read (split-K, w8a8's quantization of a's rows)
    words = (arrival_words(x, m_tiles * n_tiles + m_tiles, workspace, words)
             if split > 1 or quant_a else None)
    part = (torch.empty(split, A + s_rows, 2 * I, dtype=torch.float32, device=x.device)
            if split > 1 else None)
    if quant_a:  # a in fp32 first; each m-tile's last program quantizes its rows into (q, scale)
        a = torch.empty(A, I, dtype=torch.float32, device=x.device)  # (the shared rows: sa)
    interpret = interpreting()
    x_ready = early and quant == "fp8_rowwise"  # early: x predates the launches this overlaps
    early = _early(early, shared, split, x)
    # early: PDL whatever the table says, as the overlap with the routing is the point
    pdl = _pdl(plan.with_(pdl=plan.pdl or early), x, interpret)
    row_block = min(4096, next_power_of_2(D))
    with on_device(x):
        launch(_gate_up_kernel, (m_tiles * n_tiles * split,),
            x, w13, shared, w13_scale, bias, counts, token_ids, row_weights, a, sa,
            fp8_target(q)[0] if quant_a else None, scale, part, words,
            arrival_words(x, 2, FLAG_WORKSPACE) if early else None, E, D, I, n_tiles, k_split,
            split, A + s_rows, T, m_tiles * n_tiles, alpha, 0.0 if limit is None else limit,
            BLOCK_E=next_power_of_2(E), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
            BLOCK_K=cfg.block_k, QUANT=quant, ACT=activation, HAS_LIMIT=limit is not None,
            HAS_BIAS=bias is not None, HAS_RW=row_weights is not None,
            UPCAST=_upcast(interpret, x.dtype, quant, w13.dtype),
            W_TO_X=quant in WEIGHT_ONLY,
            DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32", INTERPRET=interpret,
            PDL=pdl, SHARED=shared is not None, EARLY=early,
            SHARED_K=_shared_k(cfg, w13, x.dtype, quant), RUNS=_runs(cfg, k_split, quant),
            QUANT_BLOCK=min(1024, next_power_of_2(I)), QUANT_A=quant_a,
            ROW_BLOCK=row_block, ROW_CHUNKS=cdiv(D, row_block), X_READY=x_ready,
            **_launch_options(cfg, pdl))


@kernel_op("decode_down", mutates_args=("out", "words"))
def _down_op(a: Tensor, a_scale: Optional[Tensor], sa: Optional[Tensor], w2: Tensor,
             w2_scale: Optional[Tensor], counts: Tensor, token_ids: Tensor, positions: Tensor,
             row_weights: Optional[Tensor], out: Tensor, accumulate: bool, workspace: int,
             quant: str, bias: Optional[Tensor], words: Optional[Tensor],
             shared: Optional[Tensor], early: bool, gate_input: Optional[Tensor],
             shared_gate: Optional[Tensor]) -> None:
    """out [T, D] (+)= the routed rows of a [A, I] through w2 [E, D, I] plus their expert's
    bias [E, D] (times the row weights), token-major (fp8 rowwise: a e4m3 with a_scale [A], or
    float32 without, quantized here); with the shared expert's w2 ``shared``
    [D, I] (a's dtype), a [T + A, I] holds its rows first (for w8a8, a [A, I] and sa
    [T, I] in out's dtype), added first (early: as the gate_up call that wrote a; its shared
    programs wait only for gate_up's). words: held_words (left zero). shared_gate [1, D] with
    gate_input [T, D]: the shared expert's rows (without ``shared``: every row) times
    sigmoid(gate_input[token] . shared_gate)."""
    (A, I), (E, D, _), T = a.shape, w2.shape, out.shape[0]
    s_rows = T if shared is not None else 0
    if sa is None:  # the shared expert's rows, if any, are a's first
        A -= s_rows
    rows = A + s_rows  # rows of a's partials and of y: the shared expert's first
    if rows == 0 or D == 0:
        return
    k = A // T
    top1 = k == 1 and shared is None  # each token's row is one program's
    plan = _plan(rows, E, D, I, w2, quant)
    cfg = plan.down
    _check_block_k(quant, cfg)
    k_split, split = _k_split(I, cfg)
    n_tiles = cdiv(D, cfg.block_n)
    m_tiles = max_m_tiles(A, E, cfg.block_m) + cdiv(s_rows, cfg.block_m)
    words = (arrival_words(a, m_tiles * n_tiles + n_tiles, workspace, words)
             if split > 1 or not top1 else None)  # only where read (split-K, the combine)
    part = (torch.empty(split, rows, D, dtype=torch.float32, device=a.device)
            if split > 1 else None)
    y = torch.empty(rows, D, dtype=torch.float32, device=a.device) if not top1 else None
    a_f32 = quant == "fp8_rowwise" and a.dtype == torch.float32
    gu = plan.gate_up  # the gate_up call's tiles: how many shared programs stored rows of a
    early = _early(early, shared, _k_split(D, gu)[1], a)
    interpret = interpreting()
    # early: PDL whatever the table says, as in gate_up: the shared programs start once gate_up's
    # shared rows are stored (the A = 2 key of a merged T = 1 is judged with unmerged T = 2)
    pdl = _pdl(plan.with_(pdl=plan.pdl or early), a, interpret)
    # The interpreter runs programs in order, so out can be read-modify-written in its dtype;
    # its bf16 rounding is done by cast_to (the interpreter's own cast truncates).
    with on_device(a):
        launch(_down_kernel, (m_tiles * n_tiles * split,),
            a, a if sa is None else sa, a_scale, w2, shared, w2_scale, bias, counts, token_ids,
            positions, row_weights,
            out, y, part, words, arrival_words(a, 2, FLAG_WORKSPACE) if early else None,
            gate_input, shared_gate, cdiv(T, gu.block_m) * cdiv(I, gu.block_n), E, D, I,
            n_tiles, k_split, split, rows, T, m_tiles * n_tiles,
            K=k, TOP1=top1, ACCUMULATE=accumulate, BLOCK_E=next_power_of_2(E),
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
            BLOCK_T=_COMBINE_TOKENS, QUANT=quant, HAS_BIAS=bias is not None,
            HAS_RW=row_weights is not None,
            UPCAST=_upcast(interpret, a.dtype, quant, w2.dtype), W_TO_X=quant in WEIGHT_ONLY,
            DOT_PRECISION="ieee" if a.dtype == torch.float32 else "tf32", INTERPRET=interpret,
            PDL=pdl, SHARED=shared is not None, EARLY=early,
            SHARED_K=_shared_k(cfg, w2, out.dtype, quant), RUNS=_runs(cfg, k_split, quant),
            A_F32=a_f32, ROW_BLOCK=min(1024, next_power_of_2(I)),
            ROW_CHUNKS=cdiv(I, min(1024, next_power_of_2(I))),
            GATE=shared_gate is not None,
            GATE_K=_gate_k(D, cfg.block_m) if shared_gate is not None else 16,  # ungated: one build
            PRELOAD=_preload(quant, k),
            **_launch_options(cfg, pdl))


def _preload(quant: str, k: int) -> bool:
    """Whether down loads its first weight step before a's rows (_down_kernel's PRELOAD): for
    layers of k >= 2 pairs a token with e4m3 weights (fp8 rowwise, fp8_w8a16). H100, the layer
    in CUDA graphs, T = 1..8, 2-3 rounds ABAB, min, with / without (benchmarks/
    probe_one_pair.py, results/probe_one_pair_preload_47e3053.jsonl, _626cc89.jsonl):
    Qwen3-30B-A3B (k = 8) fp8 rowwise T = 2 / 4 38.7 / 40.7, 61.0 / 64.0 us, fp8_w8a16 37.6 /
    38.8, 59.5 / 62.2; Mixtral TP2 (k = 2) fp8_w8a16 T = 2 118.1 / 119.6, every other within
    0.7%. Not bf16 (Qwen3 T = 1 / 2 1-2% faster, T = 4 / 8 and Mixtral T = 4 ~1% slower) nor
    top-1 (Llama 4 Scout TP8 within the noise but bf16 T = 1, a merged shared expert: 29.2 /
    27.7 us)."""
    return k >= 2 and quant in ("fp8_rowwise", "fp8_w8a16")


def _gate_k(D: int, block_m: int) -> int:
    """_gate's columns a step: about 4096 values of x a step (32 registers a thread at 4 warps),
    one step for D <= 4096 at one token a tile."""
    return max(16, min(next_power_of_2(D), 4096 // block_m))


def gate_up(x: Tensor, w13: Tensor, w13_scale: Tensor | None, counts: Tensor, token_ids: Tensor,
            row_weights: Tensor | None, out: Tensor | tuple[Tensor, Tensor],
            workspace: int = 0, quant: str | None = None, bias: Tensor | None = None,
            act: Act = SILU, shared: Tensor | None = None,
            early: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """x [T, D], w13 [E, 2I, D] -> out: a [A, I] in x's dtype, or (q [A, I] e4m3, scale [A])
    for w8a8 w13 (fp8_block: scale [A, I / 128]; quant: the weight format, see format_of);
    bias [E, 2I]; act: (activation, alpha, limit) as ops.silu_mul's; shared [2I, D]: a [T + A,
    I], the shared expert's rows first, or for w8a8 out = (q, scale, sa [T, I]) with them in sa;
    early: x was written before the launches this one overlaps (see _gate_up_op); fp8
    rowwise's (a [A, I] float32, None[, sa]) leaves the rows for down to quantize. Arguments
    were checked by the public function."""
    a, q, scale, sa = unpack_outputs(out)
    _gate_up_op(x, w13, w13_scale, counts, token_ids, row_weights, a, q, scale, sa, workspace,
                format_of(w13, quant), bias, *act, held_words(x, workspace), shared, early)
    return out


def down(a: Tensor, a_scale: Tensor | None, w2: Tensor, w2_scale: Tensor | None, counts: Tensor,
         token_ids: Tensor, positions: Tensor, row_weights: Tensor | None, out: Tensor,
         accumulate: bool = True, workspace: int = 0, quant: str | None = None,
         bias: Tensor | None = None, shared: Tensor | None = None,
         early: bool = False, shared_a: Tensor | None = None,
         shared_gate: Tensor | None = None, gate_input: Tensor | None = None) -> Tensor:
    """out [T, D] += (or, not accumulate, =) the routed rows of a [A, I] through w2 [E, D, I]
    plus bias [E, D]; shared [D, I]: a [T + A, I] holds the shared expert's rows first, or for
    w8a8 shared_a [T, I] holds them; each token's added before its pairs' (early: as the
    gate_up call that wrote a); shared_gate [1, D], gate_input [T, D]: the shared expert's rows
    (without ``shared``, every row) times sigmoid(gate_input . shared_gate). Returns out.
    Arguments were checked by the public function."""
    _down_op(a, a_scale, shared_a, w2, w2_scale, counts, token_ids, positions, row_weights, out,
             accumulate, workspace, format_of(w2, quant), bias, held_words(a, workspace), shared,
             early, gate_input, shared_gate)
    return out
