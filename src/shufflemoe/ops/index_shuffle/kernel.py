"""IndexShuffling in Triton: top-k + histogram + stable bucket sort, all on the device, in one
launch for small batches and two for large ones (no grid-wide barrier, no atomics, so the order
is deterministic and the kernels also run, one program after another, in the interpreter).

Pairs are handled in blocks of BT tokens (P = BT * KP pairs, KP = k rounded up to a power of
two). For each block, program ``_route_kernel``:
  1. picks each token's top-k experts (DeepSeek-V3's grouped top-k with ``groups``, or loads
     precomputed ids) and computes the pair weights;
  2. sorts the block's pairs by (bucket, pair index) with ``tl.sort`` (bucket = expert id, or E for
     an id outside [0, E)), and finds where each bucket starts and ends in the sorted keys by a
     binary search (``tl.gather``), which gives the block's histogram;
  3. with one block (``SINGLE``), places them directly: position = start of the bucket's section
     + rank inside the bucket (with no capacity and at most 64 pairs, steps 2 and 3 are one
     count instead: _place_by_rank); otherwise it stores the sorted keys, ids, weights and the
     block's histogram row to scratch, and ``_place_kernel`` (at most 128 programs, each placing
     a run of consecutive blocks) reads the small [blocks, buckets] histogram table once to get
     each bucket's totals and the number of pairs of earlier blocks, then places the pairs.
Pair order (reference.py): kept pairs expert-major, then pairs over capacity expert-major, then
pairs routed nowhere; pair index order inside each. Ties in top-k go to the lower expert id.
Placing a pair also stores its position at its pair index t * k + j (Routing.positions, the
inverse permutation): one more store, no extra pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from ...types import Routing
from .._common import cdiv, next_power_of_2
from .._impl import interpreting, kernel_op
from .._launch import launch
from .._pdl import chain_start, chained
from ..quantize.kernel import cast_to
from .reference import DEEPSEEK_EPS, GROUP_BEST

SCORING_IDS = {"none": 0, "softmax": 1, "sigmoid": 2}
# Below the key of every float (canonical NaN aside): marks taken experts and padding columns.
_SENTINEL = tl.constexpr(-(2**31) + 1)
_EPS = tl.constexpr(DEEPSEEK_EPS)


@triton.jit
def _score_keys(s):
    """float32 -> int32 keys in the order torch.sort uses: -0.0 == +0.0, NaN above +inf."""
    bits = tl.where(s == 0.0, 0, s.to(tl.int32, bitcast=True))
    key = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    return tl.where(s != s, 0x7FC00000, key)


@triton.jit
def _key_value(key):
    """Inverse of _score_keys (up to the sign of zero and NaN payloads)."""
    return tl.where(key >= 0, key, key ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)


@triton.jit
def _load_scores(s_ptr, stride, t, tmask, cols, E: tl.constexpr):
    return tl.load(s_ptr + t.to(tl.int64)[:, None] * stride + cols[None, :],
                   mask=tmask[:, None] & (cols < E)[None, :], other=float("-inf")).to(tl.float32)


@triton.jit
def _topk(s_ptr, stride, t, tmask, scaling, E: tl.constexpr, K: tl.constexpr, KP: tl.constexpr,
          BT: tl.constexpr, BEC: tl.constexpr, SCORING: tl.constexpr, RENORM: tl.constexpr):
    """Each row's top-k experts: (ids [BT, KP] int32, weights [BT, KP] float32)."""
    jj = tl.arange(0, KP)[None, :]
    ids = tl.zeros([BT, KP], tl.int32)
    vals = tl.zeros([BT, KP], tl.float32)
    if BEC >= E:  # the whole row at once: take the best, mark it, repeat
        cols = tl.arange(0, BEC)
        s = _load_scores(s_ptr, stride, t, tmask, cols, E)
        key = tl.where((cols < E)[None, :], _score_keys(s), _SENTINEL)
        for j in tl.static_range(K):
            m = tl.max(key, 1)
            idx = tl.min(tl.where(key == m[:, None], cols[None, :], BEC), 1)
            key = tl.where(cols[None, :] == idx[:, None], _SENTINEL, key)
            ids = tl.where(jj == j, idx[:, None], ids)
            vals = tl.where(jj == j, _key_value(m)[:, None], vals)
        if SCORING == 1:
            rmax = tl.where(tmask, tl.max(s, 1), 0.0)
            denom = tl.sum(tl.exp(s - rmax[:, None]), 1)
    else:  # chunks of BEC experts: pass j takes the best (key, id) below pass j-1's
        prev_key = tl.full([BT], 0x7FFFFFFF, tl.int32)
        prev_idx = tl.full([BT], -1, tl.int32)
        for j in tl.static_range(K):
            best = tl.full([BT], _SENTINEL, tl.int32)
            best_idx = tl.zeros([BT], tl.int32)
            for c0 in range(0, E, BEC):  # a loop, not unrolled: K * E / BEC chunks
                cols = c0 + tl.arange(0, BEC)
                key = _score_keys(_load_scores(s_ptr, stride, t, tmask, cols, E))
                below = (key < prev_key[:, None]) | (
                    (key == prev_key[:, None]) & (cols[None, :] > prev_idx[:, None]))
                key = tl.where((cols < E)[None, :] & below, key, _SENTINEL)
                m = tl.max(key, 1)
                idx = tl.min(tl.where(key == m[:, None], cols[None, :], E), 1)
                better = m > best  # an equal key in a later chunk has a higher id
                best = tl.where(better, m, best)
                best_idx = tl.where(better, idx, best_idx)
            prev_key, prev_idx = best, best_idx
            ids = tl.where(jj == j, best_idx[:, None], ids)
            vals = tl.where(jj == j, _key_value(best)[:, None], vals)
        if SCORING == 1:
            rmax = tl.where(tmask, tl.sum(tl.where(jj == 0, vals, 0.0), 1), 0.0)
            denom = tl.zeros([BT], tl.float32)
            for c0 in range(0, E, BEC):
                s = _load_scores(s_ptr, stride, t, tmask, c0 + tl.arange(0, BEC), E)
                denom += tl.sum(tl.exp(s - rmax[:, None]), 1)
    if SCORING == 1:
        denom = tl.where(tmask, denom, 1.0)  # rows past T (and their rmax = 0): no 0 / 0
        w = tl.math.div_rn(tl.exp(vals - rmax[:, None]), denom[:, None])
    elif SCORING == 2:
        w = tl.math.div_rn(tl.full([BT, KP], 1.0, tl.float32), 1.0 + tl.exp(-vals))
    else:
        w = vals
    if RENORM:
        total = tl.where(tmask, tl.sum(tl.where(jj < K, w, 0.0), 1), 1.0)
        w = tl.math.div_rn(w, total[:, None])
    return ids, w * tl.cast(scaling, tl.float32)  # (Inductor passes Python floats as float64)


@triton.jit
def _grouped_topk(s_ptr, stride, bias_ptr, t, tmask, scaling, K: tl.constexpr, KP: tl.constexpr,
                  BT: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, EG: tl.constexpr,
                  EGP: tl.constexpr, TOPG: tl.constexpr, GBEST: tl.constexpr,
                  SCORING: tl.constexpr, RENORM: tl.constexpr, HAS_BIAS: tl.constexpr,
                  ROUND: tl.constexpr, INTERPRET: tl.constexpr):
    """DeepSeek-V3's selection, each row whole: (ids [BT, KP] int32, weights [BT, KP] float32).
    A row's G groups of EG experts lie in GP * EGP columns (powers of two), group g in columns
    [g * EGP, g * EGP + EG). The choice is the score (softmax or sigmoid of the row, or the row)
    plus the bias; a group scores its GBEST (2: V3; 1: DeepSeek-V2's group_limited_greedy) best
    choices summed (its one when EG = 1); the TOPG
    best groups are kept, then the top K choices in them; a weight is the chosen expert's score,
    renormalized with DeepSeek's epsilon. Ties go to the lower group, then the lower expert."""
    W: tl.constexpr = GP * EGP
    c = tl.arange(0, W)
    ing = c % EGP
    ok = (c // EGP < G) & (ing < EG)
    expert = (c // EGP) * EG + ing
    s = tl.load(s_ptr + t.to(tl.int64)[:, None] * stride + expert[None, :],
                mask=tmask[:, None] & ok[None, :], other=float("-inf")).to(tl.float32)
    if SCORING == 1:
        rmax = tl.where(tmask, tl.max(s, 1), 0.0)
        p = tl.exp(s - rmax[:, None])
        score = tl.math.div_rn(p, tl.where(tmask, tl.sum(p, 1), 1.0)[:, None])
    elif SCORING == 2:
        score = tl.math.div_rn(tl.full([BT, W], 1.0, tl.float32), 1.0 + tl.exp(-s))
    else:
        score = s
    if ROUND:  # as a router computing them in the logits' dtype does (LFM2-MoE)
        score = cast_to(score, s_ptr.dtype.element_ty, INTERPRET).to(tl.float32)
    choice = score
    if HAS_BIAS:
        choice += tl.load(bias_ptr + expert, mask=ok, other=0.0).to(tl.float32)[None, :]
    key = tl.where(ok[None, :], _score_keys(choice), _SENTINEL)
    if G > 1:  # (one group: every expert stays)
        key3 = tl.reshape(key, [BT, GP, EGP])
        ing3 = tl.arange(0, EGP)[None, None, :]
        best = tl.max(key3, 2)  # [BT, GP]
        group_score = _key_value(best)
        if EG > 1 and GBEST == 2:
            first = tl.min(tl.where(key3 == best[:, :, None], ing3, EGP), 2)
            group_score += _key_value(tl.max(tl.where(ing3 == first[:, :, None], _SENTINEL,
                                                      key3), 2))
        gcol = tl.arange(0, GP)[None, :]
        gkey = tl.where(gcol < G, _score_keys(group_score), _SENTINEL)
        kept = tl.zeros([BT, GP], tl.int32)
        for _ in tl.static_range(TOPG):
            m = tl.max(gkey, 1)
            hit = gcol == tl.min(tl.where(gkey == m[:, None], gcol, GP), 1)[:, None]
            kept = tl.where(hit, 1, kept)
            gkey = tl.where(hit, _SENTINEL, gkey)
        kept = tl.reshape(tl.broadcast_to(kept[:, :, None], [BT, GP, EGP]), [BT, W])
        key = tl.where(kept != 0, key, _SENTINEL)
    jj = tl.arange(0, KP)[None, :]
    cols = tl.zeros([BT, KP], tl.int32)
    for j in tl.static_range(K):
        m = tl.max(key, 1)
        col = tl.min(tl.where(key == m[:, None], c[None, :], W), 1)
        key = tl.where(c[None, :] == col[:, None], _SENTINEL, key)
        cols = tl.where(jj == j, col[:, None], cols)
    ids = (cols // EGP) * EG + cols % EGP
    w = tl.gather(score, cols, 1)
    if RENORM:
        total = tl.where(tmask, tl.sum(tl.where(jj < K, w, 0.0), 1) + _EPS, 1.0)
        w = tl.math.div_rn(w, total[:, None])
    return ids, w * tl.cast(scaling, tl.float32)


@triton.jit
def _lower_bound(skey, target, P: tl.constexpr):
    """For each target: how many of the P (a power of two) sorted keys are below it; a
    branch-free binary search, log2(P) + 1 gathers."""
    pos = tl.zeros(target.shape, tl.int32)
    for i in tl.static_range(1, 16):
        if (P >> i) > 0:
            pos = tl.where(tl.gather(skey, pos + ((P >> i) - 1), 0) < target, pos + (P >> i), pos)
    return tl.where(tl.gather(skey, pos, 0) < target, pos + 1, pos)


@triton.jit
def _emit(sb, r, raw, w, tok, pair, valid, tot, cap, n_pairs, write_counts, counts_ptr, tok_ptr,
          exp_ptr, w_ptr, nv_ptr, pos_ptr, E: tl.constexpr, NB: tl.constexpr,
          HAS_CAP: tl.constexpr, FROM_SCORES: tl.constexpr):
    """Store pairs (bucket sb, rank r inside the bucket over the whole batch, index ``pair`` =
    t * K + j) at their final positions, and each position at its pair index, given the
    per-bucket totals ``tot`` [NB]; with write_counts, counts and num_valid."""
    nbr = tl.arange(0, NB)
    is_expert = nbr < E
    routed = tl.where(is_expert, tot, 0)
    if HAS_CAP:
        kept = tl.minimum(routed, cap)
    else:
        kept = routed
    dropped = routed - kept
    n_kept = tl.sum(kept, 0)
    sbc = tl.minimum(sb, NB - 1)
    pos = tl.gather(tl.cumsum(kept, 0) - kept, sbc, 0) + r
    if HAS_CAP:
        over = n_kept + tl.gather(tl.cumsum(dropped, 0) - dropped, sbc, 0) + r - cap
        pos = tl.where(r < cap, pos, over)
    if not FROM_SCORES:
        pos = tl.where(sb == E, n_kept + tl.sum(dropped, 0) + r, pos)
    valid = valid & (pos >= 0) & (pos < n_pairs)  # never outside the outputs, whatever the input
    tl.store(tok_ptr + pos, tok, mask=valid)
    tl.store(exp_ptr + pos, raw, mask=valid)
    tl.store(w_ptr + pos, w, mask=valid)
    tl.store(pos_ptr + pair, pos, mask=valid)
    tl.store(counts_ptr + nbr, kept, mask=is_expert & write_counts)
    tl.store(nv_ptr, n_kept, mask=write_counts)


# One program without a capacity places its pairs by counting (_place_by_rank) while it has at
# most RANK_PAIRS pairs and RANK_CELLS bucket x pair cells.
RANK_PAIRS = tl.constexpr(64)
RANK_CELLS = tl.constexpr(8192)


@triton.jit
def _place_by_rank(b, raw, w, lane, n_pairs, counts_ptr, tok_ptr, exp_ptr, w_ptr, nv_ptr,
                   pos_ptr, E: tl.constexpr, K: tl.constexpr, KP: tl.constexpr,
                   NB: tl.constexpr):
    """One block, no capacity: pair p (bucket b [P], NB where it is padding) goes to the number
    of pairs before it in (bucket, pair index) order, and bucket e holds the pairs whose bucket
    is e: what the sort, the searches and _emit give, counted in [P, P] and [NB, P] compares
    (no sort, no gathers, fewer barriers). Pairs past the experts (bucket E: ids outside
    [0, E)) follow every kept pair, as in _emit. H100, CUDA graphs, the routing alone at T = 1..8,
    sorted (e9f8c0a) / counted (results/probe_route_warps_8bb1289.txt), 4 warps: Llama 4 Scout
    (E = 16, top-1) 2.0 / 1.3-1.4 us, Maverick (E = 128, top-1) 2.5-2.6 / 1.8, Mixtral (top-2)
    2.1-2.4 / 1.5-1.7, Qwen3-30B-A3B (top-8) T = 4 3.0 / 2.2, gpt-oss (top-4) T = 1 3.4 / 2.7."""
    earlier = (b[None, :] == b[:, None]) & (lane[None, :] < lane[:, None])
    before = (b[None, :] < b[:, None]) | earlier
    pos = tl.sum(before.to(tl.int32), 1)
    nbr = tl.arange(0, NB)
    counts = tl.sum((nbr[:, None] == b[None, :]).to(tl.int32), 1)
    ok = (b < NB) & (pos < n_pairs)
    tok = (lane // KP).to(tl.int32)
    tl.store(tok_ptr + pos, tok, mask=ok)
    tl.store(exp_ptr + pos, raw, mask=ok)
    tl.store(w_ptr + pos, w, mask=ok)
    tl.store(pos_ptr + tok * K + lane % KP, pos, mask=ok)
    tl.store(counts_ptr + nbr, counts, mask=nbr < E)
    tl.store(nv_ptr, tl.sum(tl.where(nbr < E, counts, 0), 0))


@triton.jit
def _route_kernel(
    src_ptr,  # scores [T, E] (FROM_SCORES) or topk_ids [T, K] int32/int64
    src_stride,  # row stride of src
    win_ptr,  # topk_weights [T, K] (HAS_W only)
    win_stride,
    bias_ptr,  # the choice's bias [E] (GROUPED with HAS_BIAS only)
    counts_ptr, tok_ptr, exp_ptr, w_ptr, nv_ptr, pos_ptr,  # outputs: [E], [A] x3, [1], [A]
    skey_ptr, sid_ptr, sw_ptr, hist_ptr,  # scratch (None when SINGLE): [nb*P] x3, [nb, NB]
    T,  # tokens
    cap,  # capacity per expert (HAS_CAP only)
    scaling,  # weight multiplier (FROM_SCORES only)
    E: tl.constexpr,  # experts
    K: tl.constexpr,  # pairs per token
    KP: tl.constexpr,  # K rounded up to a power of two
    BT: tl.constexpr,  # tokens per block
    BEC: tl.constexpr,  # experts per score chunk in top-k
    NB: tl.constexpr,  # buckets, a power of two > every bucket id (E, or E + 1 with ids)
    FROM_SCORES: tl.constexpr,
    SCORING: tl.constexpr,  # 0 none, 1 softmax, 2 sigmoid
    RENORM: tl.constexpr,
    HAS_W: tl.constexpr,
    HAS_CAP: tl.constexpr,
    GROUPED: tl.constexpr,  # DeepSeek-V3's selection (_grouped_topk) of G groups of EG experts,
    G: tl.constexpr,  # the TOPG best kept; GP and EGP: G and EG rounded up to powers of two
    EG: tl.constexpr,
    GP: tl.constexpr,
    EGP: tl.constexpr,
    TOPG: tl.constexpr,
    GBEST: tl.constexpr,  # a group's score: its GBEST (1 or 2) best choices summed
    HAS_BIAS: tl.constexpr,
    ROUND: tl.constexpr,  # the scores rounded to src's dtype before the choice
    INTERPRET: tl.constexpr,  # (ROUND only) round to bf16 with integer arithmetic
    SINGLE: tl.constexpr,  # one block: place the pairs here (no scratch, no second launch)
    PDL: tl.constexpr,  # launched with programmatic dependent launch (ops/_pdl.py)
):
    chain_start(PDL)
    P: tl.constexpr = BT * KP
    blk = tl.program_id(0)
    t = blk * BT + tl.arange(0, BT)
    jj = tl.arange(0, KP)
    pair_ok = (t < T)[:, None] & (jj < K)[None, :]
    if GROUPED:
        raw2, w2 = _grouped_topk(src_ptr, src_stride, bias_ptr, t, t < T, scaling, K, KP, BT, G,
                                 GP, EG, EGP, TOPG, GBEST, SCORING, RENORM, HAS_BIAS, ROUND,
                                 INTERPRET)
        bucket2 = raw2
    elif FROM_SCORES:
        raw2, w2 = _topk(src_ptr, src_stride, t, t < T, scaling, E, K, KP, BT, BEC, SCORING,
                         RENORM)
        bucket2 = raw2
    else:
        offs = t.to(tl.int64)[:, None] * src_stride + jj[None, :]
        ids = tl.load(src_ptr + offs, mask=pair_ok, other=0)
        raw2 = ids.to(tl.int32)  # what expert_ids holds (int64 ids truncate as torch's .int())
        bucket2 = tl.where((ids >= 0) & (ids < E), raw2, E)
        if HAS_W:
            w2 = tl.load(win_ptr + t.to(tl.int64)[:, None] * win_stride + jj[None, :],
                         mask=pair_ok, other=0.0).to(tl.float32)
        else:
            w2 = tl.full([BT, KP], 1.0, tl.float32)
    valid = tl.reshape(pair_ok, [P])
    bucket = tl.where(valid, tl.reshape(bucket2, [P]), 0)
    raw = tl.reshape(raw2, [P])
    w = tl.reshape(w2, [P])
    lane = tl.arange(0, P)
    if SINGLE and not HAS_CAP and P <= RANK_PAIRS and P * NB <= RANK_CELLS:
        _place_by_rank(tl.where(valid, bucket, NB), raw, w, lane, T * K, counts_ptr, tok_ptr,
                       exp_ptr, w_ptr, nv_ptr, pos_ptr, E, K, KP, NB)
        return
    # Sorting (bucket, pair index) keys orders the block's pairs as the output wants them.
    skey = tl.sort(tl.where(valid, bucket * P + lane, NB * P))
    # Bucket e's keys are [e * P, (e + 1) * P). (tl.histogram overcounted on the GPU: its input
    # here has a linear layout whose lanes repeat values, which its replication count misses.)
    first = tl.arange(0, NB) * P
    starts = _lower_bound(skey, first, P)  # [NB] first sorted position of each bucket
    hist = _lower_bound(skey, first + P, P) - starts  # [NB] pairs per bucket
    if SINGLE:
        sb = skey // P
        sp = skey % P
        rank = lane - tl.gather(starts, tl.minimum(sb, NB - 1), 0)
        tok = (sp // KP).to(tl.int32)
        _emit(sb, rank, tl.gather(raw, sp, 0), tl.gather(w, sp, 0), tok, tok * K + sp % KP,
              sb < NB, hist, cap, T * K, blk == 0, counts_ptr, tok_ptr, exp_ptr, w_ptr, nv_ptr,
              pos_ptr, E, NB, HAS_CAP, FROM_SCORES)
    else:
        base = blk.to(tl.int64) * P
        tl.store(skey_ptr + base + lane, skey)
        tl.store(sid_ptr + base + lane, raw)
        tl.store(sw_ptr + base + lane, w)
        tl.store(hist_ptr + blk.to(tl.int64) * NB + tl.arange(0, NB), hist)


@triton.jit
def _place_kernel(
    counts_ptr, tok_ptr, exp_ptr, w_ptr, nv_ptr, pos_ptr,  # outputs: [E], [A] x3, [1], [A]
    skey_ptr, sid_ptr, sw_ptr, hist_ptr,  # scratch written by _route_kernel
    nb,  # blocks
    per_prog,  # consecutive blocks placed by one program
    A,  # pairs
    cap,  # capacity per expert (HAS_CAP only)
    E: tl.constexpr,
    K: tl.constexpr,
    KP: tl.constexpr,
    BT: tl.constexpr,
    NB: tl.constexpr,
    RB: tl.constexpr,  # histogram table rows read at a time
    FROM_SCORES: tl.constexpr,
    HAS_CAP: tl.constexpr,
    PDL: tl.constexpr,  # launched with programmatic dependent launch (ops/_pdl.py)
):
    chain_start(PDL)
    P: tl.constexpr = BT * KP
    first = tl.program_id(0) * per_prog
    lane = tl.arange(0, P)
    nbr = tl.arange(0, NB)
    # Each program reads the whole [nb, NB] table once (a few KB to 512 KB, from L2): bucket
    # totals, and the pairs of each bucket in blocks before its first one.
    tot = tl.zeros([NB], tl.int32)
    before = tl.zeros([NB], tl.int32)
    r0 = 0
    while r0 < nb:  # (a range() over a runtime bound fails in the interpreter)
        rows = r0 + tl.arange(0, RB)
        tile = tl.load(hist_ptr + rows.to(tl.int64)[:, None] * NB + nbr[None, :],
                       mask=(rows < nb)[:, None], other=0)
        tot += tl.sum(tile, 0)
        before += tl.sum(tl.where((rows < first)[:, None], tile, 0), 0)
        r0 += RB
    blk = first
    while (blk < first + per_prog) & (blk < nb):
        base = blk.to(tl.int64) * P
        skey = tl.load(skey_ptr + base + lane)
        sb = skey // P
        sp = skey % P
        valid = sb < NB
        own = tl.load(hist_ptr + blk.to(tl.int64) * NB + nbr)
        shift = before - (tl.cumsum(own, 0) - own)  # rank = shift[bucket] + sorted position
        rank = tl.gather(shift, tl.minimum(sb, NB - 1), 0) + lane
        raw = tl.load(sid_ptr + base + sp, mask=valid, other=0)
        w = tl.load(sw_ptr + base + sp, mask=valid, other=0.0)
        tok = (blk * BT + sp // KP).to(tl.int32)
        _emit(sb, rank, raw, w, tok, tok * K + sp % KP, valid, tot, cap, A, blk == 0, counts_ptr,
              tok_ptr, exp_ptr, w_ptr, nv_ptr, pos_ptr, E, NB, HAS_CAP, FROM_SCORES)
        before += own
        blk += 1


def _num_buckets(E: int, from_scores: bool) -> int:
    """Buckets: a power of two above every bucket id, at least 32."""
    return max(32, next_power_of_2(E if from_scores else E + 1))


# At most this many place programs: one wave on 132 SMs. The heuristics pass it: a dataclass
# built in a compiled call with a field left to its default makes torch 2.11's Dynamo guard the
# default through dataclasses.fields(), a Python call at every guard check (RouteConfig's cost
# ~20 us a step on an H200 host; benchmarks/probe_guard_lambdas.py finds them).
PLACE_PROGRAMS = 128


# Blocks of routing (not one program) launch in stream order: their kernel never starts beside
# the one before it. Launched with PDL behind a chained kernel (the index_shuffle suite's back-to-
# back calls: place(i), then route(i + 1)) their programs took the SMs early and unevenly: top-8 of
# E = 128 at T = 2048 22.8 us where unchained 11.0, T = 8192 55.7 / 25.8 (H100, CUDA graphs,
# benchmarks/probe_route_chain.py, results/probe_route_chain_9a57ef3.json). They still let
# place launch early (their PDL constexpr) while a block holds at most CHAIN_PAIRS pairs: after
# an ordinary launch (as after the router's GEMM), chained / unchained 0.83-0.90 at 64 to 128
# pairs a block (top-1 E = 128 T = 8192 10.3 / 12.0 us, top-8 T = 2048 11.0 / 12.2), but 1.12 at
# 512 (top-8 T = 8192 30.4 / 27.2).
CHAIN_PAIRS = 256


def chain_keywords(pdl: dict, single: bool, block_pairs: int) -> tuple[dict, dict]:
    """The PDL launch keywords of the route and place kernels from chained()'s for the grid:
    one program as given; blocks launched in stream order, letting place launch early while a
    block holds at most CHAIN_PAIRS pairs (see there), else neither chained."""
    if single:
        return pdl, pdl
    if block_pairs > CHAIN_PAIRS:
        return {"PDL": False}, {"PDL": False}
    return {"PDL": pdl["PDL"]}, pdl


@dataclass(frozen=True)
class RouteConfig:
    """Tiling of one index_shuffle / sort_by_expert call (see route_config)."""

    block_tokens: int  # BT, a power of two
    expert_chunk: int  # BEC: experts per score tile in top-k
    single: bool  # one program does everything (block_tokens >= T)
    num_warps: int
    place_programs: int = PLACE_PROGRAMS


def route_config(T: int, E: int, k: int, from_scores: bool = True, single_pairs: int = 64,
                 single_scores: int = 4096, min_block_pairs: int = 32,
                 max_block_pairs: int = 1024, score_tile: int = 2048) -> RouteConfig:
    """Deterministic heuristic. One program while the padded batch has at most ``single_pairs``
    pairs, or for top-1 at most ``single_scores`` scores (T x E padded): there a second launch
    costs more than one program's top-k and sort. Past that one program's time grows with the
    pairs while the blocks' stays flat (H100, CUDA graphs, probe_route_single at 572b85f, one
    program / blocks, us): Qwen3-30B-A3B (E = 128, top-8) T = 8 5.3 / 5.7, T = 16 6.9 / 5.8,
    T = 64 17.1 / 5.9 (34.5 in the layer's own timeline); Mixtral (E = 8, top-2) T = 128 9.4 /
    4.8; DeepSeek-like (E = 256, top-8) T = 8 7.5 / 6.3; Llama 4 Scout (E = 16, top-1) T = 256
    4.1 / 4.5, Maverick (E = 128) T = 128 5.7 / 5.5. Otherwise blocks of ``min_block_pairs`` to
    ``max_block_pairs`` pairs (the sort of one block stays small), as small as keeps the number
    of blocks near 128 (one wave on 132 SMs). Top-k reads scores in tiles of about
    ``score_tile`` values. Register counts from ptxas (sm_90): a [128, 128] score tile spilled;
    [128, 16] took 76-118 registers with 8 warps, [64, 32] 118 with 4. Warps: 8 from 128 pairs a
    block, or for one program of at least 8 tokens and 1024 scores; 4 from 4 tokens a block;
    else 2 (a warp a row: top-k's reductions cross no warps). H100, CUDA graphs, one program,
    us (benchmarks/probe_route_warps.py, results/probe_route_warps_8bb1289.txt), 2 / 4 / 8
    warps: Qwen3-30B-A3B (top-8) T = 1 3.13 / 3.70 / 3.78, T = 2 2.43 / 3.18 / 3.58, T = 4
    3.67 / 2.24 / 3.48, T = 8 6.51 / 4.32 / 3.29; gpt-oss (top-4) T = 8 3.21 / 2.48 / 2.14, T =
    16 6.57 / 3.86 / 3.46; Maverick (E = 128, top-1, 16-token block) T = 1 2.30 / 1.80 / 1.71;
    Scout (E = 16) 1.37 / 1.31 / 1.48; Mixtral (E = 8, top-2) T = 8 1.59 / 1.50 / 1.57;
    DeepSeek-V3's grouped top-8 T = 1 6.01 / 8.37 / 7.60, T = 2 4.28 / 6.05 / 5.66, T = 4
    5.98 / 4.09 / 5.75 (its 256-wide rows: 4 tokens, 4 warps)."""
    kp = next_power_of_2(k)
    be = max(16, next_power_of_2(E)) if from_scores else 16
    t2 = next_power_of_2(max(T, 1))
    single = t2 * kp <= single_pairs or (kp == 1 and t2 * be <= single_scores)
    if single:
        bt = max(t2, 16 // kp)
    else:
        pairs = max(min_block_pairs, next_power_of_2(cdiv(T * kp, 128)), kp)
        bt = min(pairs, max_block_pairs) // kp
    bec = min(be, max(16, score_tile // bt))
    wide = bt * kp >= 128 or (single and bt >= 8 and bt * bec >= 1024)
    return RouteConfig(bt, bec, single, 8 if wide else 4 if bt >= 4 else 2, PLACE_PROGRAMS)


def invariant_route_config(T: int, E: int, k: int, block_pairs: int = 64) -> RouteConfig:
    """batch_invariant: the tiling that computes a row's weights (block_tokens, expert_chunk,
    num_warps; they set the order of the softmax and renormalization sums) fixed whatever T, at
    ``block_pairs`` pairs a block; only ``single`` follows T, and it changes no value. 64 pairs
    beat 256 at every T = 1..2048 measured (H100, benchmarks/results/probe_bi_route_ab92b7b.txt,
    CUDA graphs, us): Qwen3-30B-A3B T = 1 6.3 against 13.8, T = 2048 13.4 / 14.8; Scout 4.0 /
    5.4 and 6.7 / 7.6; Mixtral 4.8 / 11.0 and 7.1 / 13.3; gpt-oss 6.2 / 11.0 and 10.0 / 13.2;
    each token's pairs the same bits alone and in every batch at each size."""
    kp = next_power_of_2(k)
    bt = max(1, block_pairs // kp)
    bec = min(max(16, next_power_of_2(E)), max(16, 2048 // bt))
    return RouteConfig(bt, bec, T <= bt, 8, PLACE_PROGRAMS)


# Scores one block of the grouped selection holds (its rows whole, groups padded to powers of two)
GROUPED_TILE = 1024


def grouped_config(T: int, E: int, k: int, n_group: int, batch_invariant: bool = False
                   ) -> RouteConfig:
    """The tiling of a grouped selection (DeepSeek-V3): route_config's, or with batch_invariant
    invariant_route_config's, for rows W = pow2(n_group) * pow2(E / n_group) wide, with at most
    GROUPED_TILE // W tokens a block (at least one; one program keeps route_config's floor of
    16 pairs), since _grouped_topk holds each row whole.
    DeepSeek-V3 (E = 256, 8 groups, top-8): one program to T = 4, then blocks of 4 tokens; Kimi
    K2-like (E = 384, one group): one program to T = 2, then blocks of 2. Routing alone in CUDA
    graphs (H200, benchmarks/probe_grouped_route.py --tiles, results/
    probe_grouped_route_tiles_8072c62_h200.json), us, one program / blocks of 4096 // W / 1024 //
    W (/ blocks of one): DeepSeek-V3 T = 4 5.4 / - / 7.4, T = 8 8.7 / - / 7.3, T = 16 - / 7.4 /
    7.4; Kimi K2-like T = 4 13.1 / - / 11.0, T = 8 31.1 / - / 11.2, T = 16 - / 14.0 / 11.6;
    GLM-4.5-like (E = 160, one group) T = 8 10.2 / - / 7.7; DeepSeek-V2-like (8 groups of 20,
    top-6, softmax) T = 8 13.3 / - / 10.0 (/ 7.2)."""
    W = next_power_of_2(n_group) * next_power_of_2(E // n_group)
    pairs = next_power_of_2(k) * max(1, GROUPED_TILE // W)
    if batch_invariant:
        return invariant_route_config(T, W, k, block_pairs=min(64, pairs))
    return route_config(T, W, k, single_pairs=min(64, pairs), single_scores=GROUPED_TILE,
                        max_block_pairs=min(1024, pairs))


@kernel_op(
    "route",
    mutates_args=("counts", "token_ids", "expert_ids", "weights", "num_valid", "positions",
                  "scratch_i", "scratch_w", "hist"))
def _route_op(src: Tensor, topk_weights: Optional[Tensor], bias: Optional[Tensor],
              counts: Tensor, token_ids: Tensor, expert_ids: Tensor, weights: Tensor,
              num_valid: Tensor, positions: Tensor, scratch_i: Optional[Tensor],
              scratch_w: Optional[Tensor], hist: Optional[Tensor], num_experts: int, top_k: int,
              from_scores: bool, scoring: int, renormalize: bool, scaling: float,
              capacity: Optional[int], n_group: int, topk_group: int, group_best: int,
              round_scores: bool, block_tokens: int,
              expert_chunk: int, single: bool, num_warps: int, place_programs: int) -> None:
    T = src.shape[0]
    if T == 0:
        counts.zero_()
        num_valid.zero_()
        return
    E, k = num_experts, top_k
    kp = next_power_of_2(k)
    nb = cdiv(T, block_tokens)
    nbins = _num_buckets(E, from_scores)
    cap = 0 if capacity is None else capacity
    meta = dict(E=E, NB=nbins, FROM_SCORES=from_scores, HAS_CAP=capacity is not None)
    win = topk_weights if topk_weights is not None else src
    g = max(n_group, 1)  # (0: not grouped)
    groups = dict(GROUPED=n_group > 0, G=g, EG=E // g, GP=next_power_of_2(g),
                  EGP=next_power_of_2(E // g), TOPG=topk_group, GBEST=group_best,
                  HAS_BIAS=bias is not None, ROUND=round_scores,
                  INTERPRET=round_scores and interpreting())
    # With PDL the next kernel launches as this one starts: at decode (one program) the fused
    # decode kernels' programs that need no routing (a shared expert) run beside it.
    route_pdl, pdl = chain_keywords(chained(src, (nb,)), single, block_tokens * kp)
    skey, sid = (None, None) if scratch_i is None else (scratch_i[0], scratch_i[1])
    launch(_route_kernel, (nb,),
        src, src.stride(0), win, win.stride(0), bias, counts, token_ids, expert_ids, weights,
        num_valid, positions, skey, sid, scratch_w, hist, T, cap, scaling,
        K=k, KP=kp, BT=block_tokens, BEC=expert_chunk, SCORING=scoring, RENORM=renormalize,
        HAS_W=topk_weights is not None, SINGLE=single, num_warps=num_warps, **meta, **groups,
        **route_pdl)
    if not single:
        # At most one wave of place programs; each reads the histogram table once.
        per_prog = cdiv(nb, min(nb, place_programs))
        launch(_place_kernel, (cdiv(nb, per_prog),),
            counts, token_ids, expert_ids, weights, num_valid, positions, scratch_i[0],
            scratch_i[1], scratch_w, hist, nb, per_prog, T * k, cap, K=k, KP=kp, BT=block_tokens,
            RB=max(1, min(64, 8192 // nbins)), num_warps=4 if block_tokens * kp <= 256 else 8,
            **meta, **pdl)


def _route(src: Tensor, topk_weights: Tensor | None, E: int, k: int, from_scores: bool,
           scoring: str, renormalize: bool, scaling: float, capacity: int | None,
           config: RouteConfig, groups: tuple[int, int] | None = None,
           bias: Tensor | None = None, group_best: int = 2,
           round_scores: bool = False) -> Routing:
    T = src.shape[0]
    A, dev = T * k, src.device
    if A >= 2**31:
        raise ValueError(f"T * k = {A} pairs: Routing indexes pairs with int32 (< 2**31)")
    # The kernel reads rows with a stride (any, int64-safe) and columns at unit stride.
    if src.shape[1] > 1 and src.stride(1) != 1:
        src = src.contiguous()
    if topk_weights is not None and topk_weights.shape[1] > 1 and topk_weights.stride(1) != 1:
        topk_weights = topk_weights.contiguous()
    if bias is not None and E > 1 and bias.stride(0) != 1:
        bias = bias.contiguous()
    if config.single and config.block_tokens < T:
        raise ValueError(f"a single-program config needs block_tokens >= T={T}")
    counts = torch.empty(E, dtype=torch.int32, device=dev)
    token_ids = torch.empty(A, dtype=torch.int32, device=dev)
    expert_ids = torch.empty(A, dtype=torch.int32, device=dev)
    weights = torch.empty(A, dtype=torch.float32, device=dev)
    num_valid = torch.empty(1, dtype=torch.int32, device=dev)
    positions = torch.empty(A, dtype=torch.int32, device=dev)
    # Scratch only for blocks: one program (decode) allocates none (compiled, each allocation
    # is a call in Inductor's wrapper, empty or not)
    scratch_i = scratch_w = hist = None
    if not config.single:
        pairs = cdiv(T, config.block_tokens) * config.block_tokens * next_power_of_2(k)
        scratch_i = torch.empty(2, pairs, dtype=torch.int32, device=dev)
        scratch_w = torch.empty(pairs, dtype=torch.float32, device=dev)
        hist = torch.empty(cdiv(T, config.block_tokens), _num_buckets(E, from_scores),
                           dtype=torch.int32, device=dev)
    _route_op(
        src, topk_weights, bias, counts, token_ids, expert_ids, weights, num_valid, positions,
        scratch_i, scratch_w, hist, E, k, from_scores, SCORING_IDS[scoring], renormalize,
        float(scaling), capacity, *(groups or (0, 0)), group_best, round_scores,
        config.block_tokens, config.expert_chunk,
        config.single, config.num_warps, config.place_programs)
    # all_routed passed, not left to its default: see PLACE_PROGRAMS
    return Routing(counts, token_ids, expert_ids, weights, num_valid, positions, False)


def index_shuffle(scores: Tensor, top_k: int, scoring: str, renormalize: bool, scaling: float,
                  capacity: int | None, config: RouteConfig | None = None,
                  batch_invariant: bool = False, groups: tuple[int, int] | None = None,
                  bias: Tensor | None = None, group_score: str = "top2",
                  round_scores: bool = False) -> Routing:
    """scores [T, E] -> Routing (A = T * top_k pairs). Arguments were checked by the public
    function; ``config`` overrides route_config (tests, tuning); batch_invariant: the tiling
    of invariant_route_config; groups (n_group, topk_group), bias, group_score and
    round_scores: DeepSeek-V3's selection (_grouped_topk), each block's rows whole
    (grouped_config)."""
    T, E = scores.shape
    if config is None:
        if groups is not None:
            config = grouped_config(T, E, top_k, groups[0], batch_invariant)
        elif batch_invariant:
            config = invariant_route_config(T, E, top_k)
        else:
            config = route_config(T, E, top_k)
    return _route(scores, None, E, top_k, True, scoring, renormalize, scaling, capacity, config,
                  groups, bias, GROUP_BEST[group_score], round_scores)


def sort_by_expert(topk_ids: Tensor, num_experts: int, topk_weights: Tensor | None,
                   capacity: int | None, ids_valid: bool = False,
                   config: RouteConfig | None = None) -> Routing:
    """topk_ids [T, k] (ids outside [0, E) are not routed), topk_weights [T, k] | None -> Routing.
    ids_valid (every id known in [0, E)) changes nothing here: the kernel checks each id anyway."""
    T, k = topk_ids.shape
    return _route(topk_ids, topk_weights, num_experts, k, False, "none", False, 1.0, capacity,
                  config or route_config(T, num_experts, k, False))
