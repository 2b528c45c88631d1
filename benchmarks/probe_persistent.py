"""One persistent kernel for a whole T = 1 decode call, against the layer's four launches (router,
index_shuffle, gate_up, down), both in CUDA graphs on rotating weights, with per-program
global-timer stamps at each phase boundary (eager calls, one at a time).

    PYTHONPATH=src python benchmarks/probe_persistent.py --out $OUT        (a GPU, ~1 min)
    TRITON_INTERPRET=1 PYTHONPATH=src python benchmarks/probe_persistent.py --check   (CPU; CI)

notes/layer.md ("Why T = 1 stays near 28 us in every format") puts ~20 us of a 28 us Llama 4
Scout call in four dependent kernels' ramps and drains. Here 2-4 programs an SM do it all:

  1. router: programs take a part of a router row each (the rows cut in up to 8 parts, fp32
     partial dots); they store the partials and arrive on a word;
  2. gate_up: the shared expert's row items, on the first programs (they need no routing); a
     wait for the router's arrivals; each program's own top-k of the E logits (the partials
     summed and rounded once to x's dtype, as the router kernel rounds); the pairs' row items
     of the chosen experts' w13 on the next programs (x times the pair's weight first where
     the router weight goes on the input); SwiGLU in fp32, a rounded to x's dtype; every
     program arrives on a second word;
  3. down: each program loads its first K step of down's weights (the shared expert's and the
     chosen experts' rows, one [segments, rows, K] tile) before it waits for gate_up, then
     streams its rows (one step ahead) and sums the segments in fp32, rounding once.

Items are rows of the weights cut so that every program gets at most one a phase. Every program
must be resident for the waits: per_sm checks the compiled kernel's registers and shared
memory, and the cooperative variant has the driver refuse a grid that cannot be; a wait gives
up after 2^20 polls and raises a flag instead of hanging. The last program to leave resets the
words (CUDA-graph safe). Under the interpreter (--check) the phases run as three launches
(PHASE), the same code without waits. T = 1, bf16, SwiGLU, routers top-k over softmax /
sigmoid / none (no logits bias, no group limit), a shared expert of the routed experts' width
or none. Writes $OUT/probe_persistent.json.

The variants measured on the way (notes/layer.md, results/probe_persistent_<commit>.json) are
in this script's history: K loops (one program an SM, unrolled, MMA against a 16-wide tile, a
step loaded ahead), waits (plain loads, a go word a program, group words), top-k by ranks,
balanced and staged shared items, and down's rows asked of L2 early. One word a barrier,
polled by one thread's acquire atomics, was the fastest wait.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib

import torch
import triton
import triton.language as tl

from shufflemoe import MoE, preset
from shufflemoe.ops.index_shuffle.kernel import SCORING_IDS, _SENTINEL, _key_value, _score_keys
from shufflemoe.ops.quantize.kernel import cast_to
from shufflemoe.ops.silu_mul.kernel import glu_f32



@triton.jit
def _arrive(word_ptr):
    tl.debug_barrier()  # every thread's stores precede the release
    tl.atomic_add(word_ptr, 1, sem="release", scope="gpu")


@triton.jit
def _await(word_ptr, target, flag_ptr):
    """Wait until *word_ptr >= target: one thread's acquire atomics (plain loads by every
    thread of 500 programs queued behind the arrivals: 2-4 us a wait, H100)."""
    n = tl.atomic_add(word_ptr, 0, sem="acquire", scope="gpu")
    polls = 0
    while (n < target) & (polls < 1048576):
        n = tl.atomic_add(word_ptr, 0, sem="acquire", scope="gpu")
        polls += 1
    if n < target:
        tl.store(flag_ptr, 1)
    tl.debug_barrier()


@triton.jit
def _stamp(times_ptr, pid, i: tl.constexpr, TIMES: tl.constexpr):
    """times[pid, i] = the global timer (ns), where TIMES."""
    if TIMES:
        t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64,
                                      is_pure=False, pack=1)
        tl.store(times_ptr + pid * 8 + i, t)


@triton.jit
def _logits(part_ptr, E: tl.constexpr, EP: tl.constexpr, RS: tl.constexpr, DTYPE: tl.constexpr,
            INTERPRET: tl.constexpr):
    """The E logits [EP] in fp32: each expert's RS fp32 partial dot products summed (a fixed
    order) and rounded once to the activations' dtype (as the router kernel rounds); -inf past
    E.
    (Cached in L1: this SM has not read them before they were final.)"""
    cols = tl.arange(0, EP)
    q = tl.arange(0, RS)
    part = tl.load(part_ptr + cols[:, None] * RS + q[None, :], mask=(cols < E)[:, None],
                   other=0.0)
    s = cast_to(tl.sum(part, 1), DTYPE, INTERPRET).to(tl.float32)
    return tl.where(cols < E, s, float("-inf"))


@triton.jit
def _pick(logit_ptr, scaling, E: tl.constexpr, EP: tl.constexpr, K: tl.constexpr,
          KP: tl.constexpr, SCORING: tl.constexpr, RENORM: tl.constexpr, RS: tl.constexpr,
          DTYPE: tl.constexpr, INTERPRET: tl.constexpr):
    """Top-k of the E logits: (ids [KP], weights [KP]); ties go to the lower expert, as
    index_shuffle's. Top-1: one max of (key << 32 | EP - 1 - expert); else one descending sort
    of those and its first k (Qwen3's top-8 of 128: ~2 us; ranks from [128, 32] comparisons
    took 3-3.6 us, k rounds of block reductions ~3)."""
    cols = tl.arange(0, EP)
    jj = tl.arange(0, KP)
    s = _logits(logit_ptr, E, EP, RS, DTYPE, INTERPRET)
    key = tl.where(cols < E, _score_keys(s), _SENTINEL)
    packed = (key.to(tl.int64) << 32) | (EP - 1 - cols).to(tl.int64)
    if K == 1:
        top = tl.full([KP], tl.max(packed, 0), tl.int64)
    else:
        top = tl.gather(tl.sort(packed, descending=True), tl.minimum(jj, EP - 1), 0)
    ids = (EP - 1) - (top & 0xFFFFFFFF).to(tl.int32)
    vals = _key_value((top >> 32).to(tl.int32))
    if SCORING == 1:
        rmax = tl.max(s, 0)
        w = tl.math.div_rn(tl.exp(vals - rmax), tl.sum(tl.exp(s - rmax), 0))
    elif SCORING == 2:
        w = tl.math.div_rn(tl.full([KP], 1.0, tl.float32), 1.0 + tl.exp(-vals))
    else:
        w = vals
    if RENORM:
        w = tl.math.div_rn(w, tl.sum(tl.where(jj < K, w, 0.0), 0))
    return ids, w * tl.cast(scaling, tl.float32)


@triton.jit
def _gate_up_rows(x_ptr, w_ptr, a_ptr, n0, n_stop, half, xw, SCALE_X: tl.constexpr,
                  D: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, INTERPRET: tl.constexpr):
    """a[n0 .. n_stop) = silu(x . w[n]) * (x . w[half + n]) rounded to a's dtype, w: [2 * half,
    D] rows (gate, then up), x times xw rounded to x's dtype first where SCALE_X. A K step loads
    both row sets' tiles, then reduces them on the CUDA cores in fp32 (loading the next step's
    before reducing this one's was never faster: 789cb13, 4fb0df0)."""
    n = n0 + tl.arange(0, BN)
    ok = n < n_stop
    gate = w_ptr + n.to(tl.int64)[:, None] * D
    up = w_ptr + (half + n).to(tl.int64)[:, None] * D
    g = tl.zeros([BN], tl.float32)
    u = tl.zeros([BN], tl.float32)
    for k0 in range(0, D, BK):
        k = k0 + tl.arange(0, BK)
        kok = k < D
        wg = tl.load(gate + k[None, :], mask=ok[:, None] & kok[None, :], other=0.0)
        wu = tl.load(up + k[None, :], mask=ok[:, None] & kok[None, :], other=0.0)
        x = tl.load(x_ptr + k, mask=kok, other=0.0)
        if SCALE_X:
            x = cast_to(x.to(tl.float32) * xw, x_ptr.dtype.element_ty, INTERPRET)
        x = x.to(tl.float32)[None, :]
        g += tl.sum(wg.to(tl.float32) * x, 1)
        u += tl.sum(wu.to(tl.float32) * x, 1)
    a = glu_f32(g, u, "silu", False, 1.0, 0.0)
    tl.store(a_ptr + n, cast_to(a, a_ptr.dtype.element_ty, INTERPRET), mask=ok)


@triton.jit
def _down_tiles(w2_ptr, sw2_ptr, it, kk, e_seg, seg_ok, shared_seg, D: tl.constexpr,
                I: tl.constexpr, D_RC: tl.constexpr, D_BN: tl.constexpr, D_BK: tl.constexpr):
    """Down's weight tiles [SP, D_BN, D_BK] of item it (rows it * D_RC ..) at K columns kk
    ([D_BK]): segment s is the shared expert's w2 where shared_seg, else expert e_seg[s]'s."""
    d = it * D_RC + tl.arange(0, D_BN)
    dok = (d < it * D_RC + D_RC) & (d < D)
    off = d.to(tl.int64)[None, :, None] * I + kk[None, None, :]
    routed = w2_ptr + e_seg.to(tl.int64)[:, None, None] * (D * I) + off
    ptr = tl.where(shared_seg[:, None, None], sw2_ptr + off, routed)
    ok = seg_ok[:, None, None] & dok[None, :, None] & (kk < I)[None, None, :]
    return tl.load(ptr, mask=ok, other=0.0)


@triton.jit
def _persistent_kernel(x_ptr, wr_ptr, w13_ptr, w2_ptr, sw13_ptr, sw2_ptr, logit_ptr, a_ptr,
                       sync_ptr, flag_ptr, out_ptr, times_ptr, scaling,
                       D: tl.constexpr, I: tl.constexpr, IS: tl.constexpr, E: tl.constexpr,
                       EP: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, NP: tl.constexpr,
                       SCORING: tl.constexpr, RENORM: tl.constexpr, ON_INPUT: tl.constexpr,
                       RBD: tl.constexpr, G_RC: tl.constexpr, G_BN: tl.constexpr,
                       G_BK: tl.constexpr, D_RC: tl.constexpr, D_BN: tl.constexpr,
                       D_BK: tl.constexpr, SP: tl.constexpr, RS: tl.constexpr,
                       DC: tl.constexpr, PHASE: tl.constexpr, INTERPRET: tl.constexpr,
                       TIMES: tl.constexpr = False):
    pid = tl.program_id(0)
    _stamp(times_ptr, pid, 0, TIMES)
    XT: tl.constexpr = x_ptr.dtype.element_ty
    ALL: tl.constexpr = PHASE == 0
    HS: tl.constexpr = 1 if IS > 0 else 0  # segments of a and of down: the shared expert's
    # first (IS = I), then each pair's, at a[s * I]
    # 1. router parts r = pid, pid + NP, ... (row r // RS, part r % RS)
    if ALL or PHASE == 1:
        r = pid
        while r < E * RS:  # (the interpreter takes no range() over a program id)
            e = r // RS
            c0 = (r % RS) * DC
            acc = tl.zeros([RBD], tl.float32)
            for k0 in range(0, DC, RBD):
                k = c0 + k0 + tl.arange(0, RBD)
                kok = (k < c0 + DC) & (k < D)
                x = tl.load(x_ptr + k, mask=kok, other=0.0).to(tl.float32)
                w = tl.load(wr_ptr + e.to(tl.int64) * D + k, mask=kok, other=0.0).to(tl.float32)
                acc += x * w
            tl.store(logit_ptr + r, tl.sum(acc, 0))
            r += NP
        _stamp(times_ptr, pid, 1, TIMES)
        if ALL:
            if pid < E * RS:  # only the programs with router parts arrive
                _arrive(sync_ptr)
    # 2. gate_up: the shared expert's row items on programs 0 .. NS - 1 (no routing needed),
    # the pairs' items numbered on from there (item NS + r on program (NS + r) % NP)
    NS: tl.constexpr = (IS + G_RC - 1) // G_RC
    NR: tl.constexpr = (I + G_RC - 1) // G_RC
    if ALL or PHASE == 2:
        it = pid
        while it < NS:
            _gate_up_rows(x_ptr, sw13_ptr, a_ptr, it * G_RC, tl.minimum(it * G_RC + G_RC, IS),
                          IS, 1.0, False, D, G_BN, G_BK, INTERPRET)
            it += NP
        _stamp(times_ptr, pid, 2, TIMES)
        if ALL:
            _await(sync_ptr, E * RS if E * RS < NP else NP, flag_ptr)
        _stamp(times_ptr, pid, 7, TIMES)
        jj = tl.arange(0, KP)
        ids, ws = _pick(logit_ptr, scaling, E, EP, K, KP, SCORING, RENORM, RS, XT, INTERPRET)
        _stamp(times_ptr, pid, 3, TIMES)
        it = ((pid - NS) % NP + NP) % NP
        while it < K * NR:
            j = it // NR
            c = it % NR
            e = tl.sum(tl.where(jj == j, ids, 0), 0)
            xw = tl.sum(tl.where(jj == j, ws, 0.0), 0)
            _gate_up_rows(x_ptr, w13_ptr + e.to(tl.int64) * (2 * I * D), a_ptr + IS + j * I,
                          c * G_RC, tl.minimum(c * G_RC + G_RC, I), I, xw, ON_INPUT, D, G_BN,
                          G_BK, INTERPRET)
            it += NP
        _stamp(times_ptr, pid, 4, TIMES)
        if ALL:
            _arrive(sync_ptr + 1)
    # 3. down: items of D_RC rows; every segment's tile of a K step loaded at once, the first
    # step's weights before the wait for gate_up (they do not depend on it)
    if ALL or PHASE == 3:
        if not ALL:
            ids, ws = _pick(logit_ptr, scaling, E, EP, K, KP, SCORING, RENORM, RS, XT, INTERPRET)
            jj = tl.arange(0, KP)
        seg = tl.arange(0, SP)
        seg_ok = seg < K + HS
        pair = seg - HS
        shared_seg = seg < HS
        hitp = pair[:, None] == jj[None, :]
        e_seg = tl.sum(tl.where(hitp, ids[None, :], 0), 1)
        if ON_INPUT:
            coef = tl.where(seg_ok, 1.0, 0.0)
        else:
            coef = tl.where(shared_seg, 1.0, tl.sum(tl.where(hitp, ws[None, :], 0.0), 1))
        ND: tl.constexpr = (D + D_RC - 1) // D_RC
        kk = tl.arange(0, D_BK)
        it = pid
        w = _down_tiles(w2_ptr, sw2_ptr, it, kk, e_seg, seg_ok & (it < ND), shared_seg, D, I,
                        D_RC, D_BN, D_BK)
        if ALL:
            _await(sync_ptr + 1, NP, flag_ptr)
            _stamp(times_ptr, pid, 5, TIMES)
        while it < ND:
            acc = tl.zeros([SP, D_BN], tl.float32)
            for k0 in range(0, I, D_BK):
                k = k0 + kk
                nxt = _down_tiles(w2_ptr, sw2_ptr, it, k + D_BK, e_seg, seg_ok, shared_seg, D,
                                  I, D_RC, D_BN, D_BK)
                av = tl.load(a_ptr + seg[:, None] * I + k[None, :],
                             mask=seg_ok[:, None] & (k < I)[None, :], other=0.0,
                             cache_modifier=".cg")
                acc += tl.sum(w.to(tl.float32) * av.to(tl.float32)[:, None, :], 2)
                w = nxt
            y = tl.sum(acc * coef[:, None], 0)
            d = it * D_RC + tl.arange(0, D_BN)
            dok = (d < it * D_RC + D_RC) & (d < D)
            tl.store(out_ptr + d, cast_to(y, out_ptr.dtype.element_ty, INTERPRET), mask=dok)
            it += NP
            w = _down_tiles(w2_ptr, sw2_ptr, it, kk, e_seg, seg_ok & (it < ND), shared_seg, D,
                            I, D_RC, D_BN, D_BK)
        _stamp(times_ptr, pid, 6, TIMES)
        if ALL:  # the last program out puts the words back to zero
            tl.debug_barrier()
            if tl.atomic_add(sync_ptr + 2, 1, sem="acq_rel", scope="gpu") == NP - 1:
                tl.store(sync_ptr + tl.arange(0, 4), tl.zeros([4], tl.int32))


def _items(rows: list[int], programs: int) -> int:
    """Rows an item: the fewest that cut every segment (rows) into at most ``programs`` items
    in all (one item a segment where there are more segments than programs)."""
    if len(rows) >= programs:
        return max(rows)
    rc = max(1, -(-sum(rows) // programs))
    while sum(-(-r // rc) for r in rows) > programs:
        rc += 1
    return rc


class Persistent:
    """layer (T = 1, bf16, SwiGLU, plain shared expert or none) as one launch."""

    def __init__(self, layer: MoE, programs: int, warps: int = 8, router_split: int = 0,
                 cooperative: bool = False, tile: int | None = None):
        cfg = layer.config
        D, I, E, K = cfg.hidden_size, cfg.intermediate_size, cfg.num_experts, cfg.top_k
        IS = cfg.shared_intermediate_size if layer.shared_w13 is not None else 0
        if IS not in (0, I):
            raise ValueError("the probe takes a shared expert of the routed experts' width")
        # a cooperative launch: refused, not hung, where the grid cannot be resident
        self.np, self.warps, self.cooperative = programs, warps, cooperative
        if not router_split:  # router rows cut in up to 8 parts, one a program
            most = max(1, programs // E)
            router_split = min(8, 1 << (most.bit_length() - 1))
        tile = tile or 1024 * warps  # values of one tile a K step: 32 a thread
        g_rc = _items(([IS] if IS else []) + [I] * K, programs)
        sp = triton.next_power_of_2(K + (IS > 0))
        d_rc = _items([D], programs)
        g_bn, d_bn = triton.next_power_of_2(g_rc), triton.next_power_of_2(d_rc)
        self.meta = dict(
            D=D, I=I, IS=IS, E=E, EP=max(16, triton.next_power_of_2(E)), K=K,
            KP=triton.next_power_of_2(K), NP=programs, SCORING=SCORING_IDS[cfg.scoring],
            RENORM=cfg.renormalize, ON_INPUT=cfg.apply_router_weight_on_input,
            RBD=min(triton.next_power_of_2(-(-D // router_split)), tile), G_RC=g_rc, G_BN=g_bn,
            G_BK=min(triton.next_power_of_2(D), max(16, tile // g_bn)), D_RC=d_rc, D_BN=d_bn,
            D_BK=min(triton.next_power_of_2(I), max(16, tile // (sp * d_bn))), SP=sp,
            RS=router_split, DC=-(-D // router_split))
        dev = layer.w13.device
        self.logits = torch.empty(E, router_split, dtype=torch.float32, device=dev)  # partials
        self.a = torch.empty(IS + K * I, dtype=cfg.dtype, device=dev)
        self.sync = torch.zeros(4, dtype=torch.int32, device=dev)
        self.flag = torch.zeros(1, dtype=torch.int32, device=dev)
        self.times = torch.zeros(programs, 8, dtype=torch.int64, device=dev)
        self.scaling = float(cfg.routed_scaling_factor)
        none = layer.w13[:0]
        self.args = (layer.router_weight, layer.w13, layer.w2,
                     none if not IS else layer.shared_w13, none if not IS else layer.shared_w2)

    def per_sm(self, x: torch.Tensor, times: bool = False) -> tuple[int, int, int]:
        """(programs an SM can hold, registers a thread, shared bytes) of the compiled kernel
        (with the stamps where ``times``): the waits need every program resident."""
        k = _persistent_kernel.warmup(
            x, *self.args, self.logits, self.a, self.sync, self.flag, torch.empty_like(x),
            self.times, self.scaling, **self.meta, PHASE=0, INTERPRET=False, num_warps=self.warps,
            grid=(self.np,), TIMES=times)
        k._init_handles()
        regs, smem = k.n_regs, k.metadata.shared
        warp_regs = -(-regs * 32 // 256) * 256
        fit = min(65536 // (warp_regs * self.warps), (227 << 10) // max(smem, 1),
                  64 // self.warps, 32)
        return fit, regs, smem

    def __call__(self, x: torch.Tensor, phased: bool = False, times: bool = False
                 ) -> torch.Tensor:
        out = torch.empty_like(x)
        for phase in ((1, 2, 3) if phased else (0,)):
            _persistent_kernel[(self.np,)](
                x, *self.args, self.logits, self.a, self.sync, self.flag, out, self.times,
                self.scaling, TIMES=times,
                **self.meta, PHASE=phase, INTERPRET=os.environ.get("TRITON_INTERPRET") == "1",
                num_warps=self.warps,
                **({"launch_cooperative_grid": True} if self.cooperative and not phased else {}))
        return out


def reference(layer: MoE, x: torch.Tensor) -> torch.Tensor:
    """The probe's arithmetic in torch (float32 sums, the same roundings)."""
    cfg = layer.config
    f = torch.float32
    logits = (x.to(f) @ layer.router_weight.to(f).t()).to(x.dtype).to(f)[0]
    ids = sorted(range(cfg.num_experts), key=lambda e: (-logits[e].item(), e))[:cfg.top_k]
    if cfg.scoring == "softmax":
        w = torch.softmax(logits, 0)[ids]
    elif cfg.scoring == "sigmoid":
        w = torch.sigmoid(logits[ids])
    else:
        w = logits[ids]
    if cfg.renormalize:
        w = w / w.sum()
    w = w * cfg.routed_scaling_factor

    def expert(xin, w13, w2):
        h = xin.to(f) @ w13.to(f).t()
        g, u = h.chunk(2, -1)
        return ((torch.nn.functional.silu(g) * u).to(x.dtype).to(f) @ w2.to(f).t())

    out = torch.zeros(1, cfg.hidden_size, dtype=f, device=x.device)
    if layer.shared_w13 is not None:
        out += expert(x, layer.shared_w13, layer.shared_w2)
    for j, e in enumerate(ids):
        if cfg.apply_router_weight_on_input:
            out += expert((x.to(f) * w[j]).to(x.dtype), layer.w13[e], layer.w2[e])
        else:
            out += expert(x, layer.w13[e], layer.w2[e]) * w[j]
    return out.to(x.dtype)


def check_small() -> None:
    """Interpreter: small layers of each router kind, phased, against ``reference``."""
    torch.manual_seed(0)
    shapes = [dict(hidden_size=96, intermediate_size=40, num_experts=16, top_k=1,
                   shared_intermediate_size=40, router="llama4", scoring="sigmoid",
                   apply_router_weight_on_input=True),
              dict(hidden_size=64, intermediate_size=24, num_experts=40, top_k=8,
                   renormalize=True),
              dict(hidden_size=80, intermediate_size=56, num_experts=8, top_k=2,
                   renormalize=True, shared_intermediate_size=56)]
    from shufflemoe import MoEConfig

    for fields in shapes:
        layer = MoE(MoEConfig(**fields, dtype=torch.bfloat16))
        with torch.no_grad():  # tied logits: the lower expert goes first
            layer.router_weight[5] = layer.router_weight[2]
        for programs, rs in ((3, 1), (7, 2), (5, 0), (4, 4)):
            p = Persistent(layer, programs, warps=4, router_split=rs, tile=512)
            for _ in range(2):
                x = torch.randn(1, fields["hidden_size"], dtype=torch.bfloat16)
                got, want = p(x, phased=True).float(), reference(layer, x).float()
                err = ((got - want).abs().max() / want.abs().max()).item()
                print(fields["num_experts"], fields["top_k"], programs, p.meta["G_RC"],
                      p.meta["D_RC"], f"rel err {err:.2e}", flush=True)
                assert err <= 2.0**-8, err  # one bf16 step at the largest output


STAMPS = ("start", "router done", "shared gate_up done", "routing known", "gate_up done",
          "all gate_up seen", "down done", "router wait over")


def phases(ps: list[Persistent], xs: list[torch.Tensor]) -> dict:
    """Per stamp: (min, median, max) over programs of its time after the first program's
    start, us, the median of each over calls (eager, one at a time)."""
    fit = ps[0].per_sm(xs[0], times=True)[0]
    if fit * torch.cuda.get_device_properties(0).multi_processor_count < ps[0].np:
        return {"not resident with the stamps": fit}
    per_call = []
    for i, x in enumerate(xs * 4):
        p = ps[i % len(ps)]
        p(x, times=True)
        torch.cuda.synchronize()
        t = p.times.double()
        t = (t - t[:, 0].min()) / 1e3
        per_call.append(torch.stack([t.min(0).values, t.median(0).values, t.max(0).values], 1))
    med = torch.stack(per_call).median(0).values[:len(STAMPS)]
    return {name: [round(v, 2) for v in med[i].tolist()] for i, name in enumerate(STAMPS)}


CASES = [("llama4-scout", 8), ("qwen3-30b-a3b", 1), ("llama4-maverick", 8), ("mixtral-8x7b", 2)]
# (programs an SM, warps, launched as a cooperative grid)
VARIANTS = [(2, 8, False), (2, 8, True), (4, 4, False), (4, 4, True)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=pathlib.Path)
    ap.add_argument("--check", action="store_true", help="interpreter check on small shapes")
    args = ap.parse_args()
    if args.check:
        check_small()
        return
    from shufflemoe.bench.ceilings import measure_ceilings
    from shufflemoe.bench.report import metadata
    from shufflemoe.bench.suites.layer import N_SETS, _copies, expert_bytes, fixed_bytes
    from shufflemoe.bench.timing import time_fn

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    ceil = measure_ceilings()
    rows = []
    for name, tp in CASES:
        cfg = preset(name, tp=tp)
        torch.manual_seed(0)
        first = MoE(cfg, device="cuda")
        activated = expert_bytes(first) * cfg.top_k + fixed_bytes(first)
        layers = [first] + [MoE(cfg, device="cuda") for _ in range(
            _copies(first, activated) - 1)]
        xs = [torch.randn(1, cfg.hidden_size, device="cuda", dtype=cfg.dtype)
              for _ in range(N_SETS)]
        floor_us = activated / (ceil.read_gbps * 1e3)
        for pps, warps, coop in VARIANTS:
            ps = [Persistent(L, sms * pps, warps=warps, cooperative=coop) for L in layers]
            fit, regs, smem = ps[0].per_sm(xs[0])
            if fit < pps:
                print(name, pps, warps, f"not resident: {fit} a SM ({regs} registers, "
                      f"{smem} B shared)", flush=True)
                continue
            worst, flags = 0.0, 0
            for i, x in enumerate(xs):
                L, p = layers[i % len(layers)], ps[i % len(ps)]
                want = L(x).float()
                got = p(x).float()
                worst = max(worst, ((got - want).abs().max() / want.abs().max()).item())
            torch.cuda.synchronize()
            flags = sum(int(p.flag.item()) for p in ps)
            if flags:
                print(name, pps, warps, "a wait timed out", flush=True)
                continue
            runs = {"layer": lambda i, L=layers: L[i % len(L)](xs[i]),
                    "persistent": lambda i, P=ps: P[i % len(P)](xs[i])}
            t = {}
            for rnd in range(2):  # interleaved rounds; each path's better median is kept
                for k, fn in runs.items():
                    got = time_fn(fn, len(xs), graph=True, reps=30)
                    if k not in t or got.median_us < t[k].median_us:
                        t[k] = got
            torch.cuda.synchronize()
            flags += sum(int(p.flag.item()) for p in ps)
            row = dict(preset=f"{name}-tp{tp}" if tp > 1 else name, T=1,
                       router_split=ps[0].meta["RS"], cooperative=coop, programs_per_sm=pps,
                       warps=warps, registers=regs, shared_bytes=smem,
                       meta=ps[0].meta, copies=len(layers), floor_us=floor_us,
                       rel_err_vs_layer=worst, timeouts=flags,
                       **{f"{k}_us": v.median_us for k, v in t.items()},
                       **{f"{k}_p20_p80": [v.p20_us, v.p80_us] for k, v in t.items()})
            row["pct_read"] = {k: 100 * floor_us / v.median_us for k, v in t.items()}
            row["phases_us"] = phases(ps, xs)
            rows.append(row)
            print({k: v for k, v in row.items() if k != "meta"}, flush=True)
            if args.out:  # after every row: a call cut short keeps what it measured
                args.out.mkdir(parents=True, exist_ok=True)
                (args.out / "probe_persistent.json").write_text(json.dumps(
                    dict(meta=metadata(), read_gbps=ceil.read_gbps, rows=rows), indent=1,
                    default=str))
        layers = ps = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
