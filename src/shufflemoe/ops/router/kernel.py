"""The router's logits at decode sizes in one Triton launch: a program per expert row, every
token's dot product with it summed in fp32 and rounded once to x's dtype (as cuBLAS does, in
another order), plus the bias (gpt-oss) before the rounding. Above GEMV_MAX_TOKENS tokens,
F.linear. H100, CUDA graphs (benchmarks/probe_router.py, the router alone at T = 1 / 8, us):
Llama 4 Scout (E = 16, D = 5120) 6.6 / 6.4 for cuBLAS (a split-K GEMM and its reduction) against
2.7 / 3.5; Qwen3-30B-A3B (128, 2048) 5.4 / 5.4 against 2.5 / 3.3; DeepSeek-V3 (256, 7168) 6.7 /
6.8 against 3.4 / 5.9.

router_route adds the routing to that launch at decode sizes: the last program to store its
logits (counted on an arrival word, ops/_arrival.py) runs index_shuffle's one-block routing on
them (index_shuffle.kernel.route_block), so no second launch waits for the first; the logits
and the Routing are the bits the two launches make."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor
from triton.language.extra.cuda import gdc_launch_dependents

from ...types import Routing
from .._arrival import arrival_words, arrive, held_words
from .._common import next_power_of_2, on_device, traced
from .._impl import interpreting, kernel_op
from .._launch import launch
from ..index_shuffle.kernel import (SCORING_IDS, index_shuffle, num_buckets, route_block,
                                   route_config)
from ..quantize.kernel import cast_to
from . import GEMV_MAX_TOKENS, ROUTE_MAX_TOKENS

ROUTE_WORKSPACE = 3  # the arrival word's buffer (ops/_arrival.py)

# (columns of x a step, warps) by tokens, from the probe above: about 4-16 K values a step
_TILES = {1: (4096, 8), 2: (2048, 8), 4: (2048, 4), 8: (2048, 8)}


@triton.jit
def _router_kernel(x_ptr, w_ptr, b_ptr, out_ptr, T, D, x_stride, w_stride,
                   word_ptr, counts_ptr, tok_ptr, exp_ptr, rw_ptr, nv_ptr, pos_ptr, cap, scaling,
                   E: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_T: tl.constexpr,
                   BLOCK_D: tl.constexpr, INTERPRET: tl.constexpr, PDL: tl.constexpr,
                   ROUTE: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, BT: tl.constexpr,
                   BEC: tl.constexpr, NB: tl.constexpr, SCORING: tl.constexpr,
                   RENORM: tl.constexpr, HAS_CAP: tl.constexpr):
    """out[t, e] = x[t] . w[e] (+ b[e]) for every token t < T, e = this program's expert. PDL:
    let a next kernel launched with programmatic dependent launch (index_shuffle's, or the
    fused decode kernels' with ROUTE) start at once; it waits for this one before it reads
    the logits. ROUTE: the last program to store its logits (an arrival word) routes the
    tokens from them, as index_shuffle's one-block launch does (route_block; K .. HAS_CAP as
    there), into the Routing's outputs counts .. pos."""
    if PDL:
        gdc_launch_dependents()
    e = tl.program_id(0)
    ts = tl.arange(0, BLOCK_T)
    t_ok = ts < T
    row = w_ptr + e.to(tl.int64) * w_stride
    acc = tl.zeros([BLOCK_T, BLOCK_D], tl.float32)
    d0 = 0
    while d0 < D:
        ds = d0 + tl.arange(0, BLOCK_D)
        d_ok = ds < D
        w = tl.load(row + ds, mask=d_ok, other=0.0)
        x = tl.load(x_ptr + ts.to(tl.int64)[:, None] * x_stride + ds[None, :],
                    mask=t_ok[:, None] & d_ok[None, :], other=0.0)
        acc += x.to(tl.float32) * w.to(tl.float32)[None, :]
        d0 += BLOCK_D
    s = tl.sum(acc, 1)
    if HAS_BIAS:
        s += tl.load(b_ptr + e).to(tl.float32)
    tl.store(out_ptr + ts.to(tl.int64) * E + e, cast_to(s, out_ptr.dtype.element_ty, INTERPRET),
             mask=t_ok)
    if ROUTE:
        if arrive(word_ptr, E):
            route_block(out_ptr, E, out_ptr, E, counts_ptr, tok_ptr, exp_ptr, rw_ptr, nv_ptr,
                        pos_ptr, counts_ptr, counts_ptr, counts_ptr, counts_ptr, T, cap, scaling,
                        0, E, K, KP, BT, BEC, NB, True, SCORING, RENORM, False, HAS_CAP, True)


@kernel_op("router_logits", mutates_args=("out",))
def _router_op(x: Tensor, w: Tensor, bias: Optional[Tensor], out: Tensor) -> None:
    """out [T, E] <- x [T, D] @ w [E, D]^T (+ bias [E]; rows of x and w at any stride, unit
    column strides). Meant for decode T; any T works (the token tile holds them all)."""
    if x.shape[0] and w.shape[0]:
        _launch_router(x, w, bias, out, {})


@kernel_op("router_route", mutates_args=("out", "counts", "token_ids", "expert_ids", "weights",
                                         "num_valid", "positions", "words"))
def _router_route_op(x: Tensor, w: Tensor, bias: Optional[Tensor], out: Tensor, counts: Tensor,
                     token_ids: Tensor, expert_ids: Tensor, weights: Tensor, num_valid: Tensor,
                     positions: Tensor, words: Optional[Tensor], top_k: int, scoring: int,
                     renormalize: bool, scaling: float, capacity: Optional[int]) -> None:
    """_router_op's logits, and from them the Routing's outputs as index_shuffle's one-block
    launch makes them (T <= ROUTE_MAX_TOKENS), in the same launch. words: held_words."""
    (T, _), E = x.shape, w.shape[0]
    if T == 0:
        counts.zero_()
        num_valid.zero_()
        return
    cfg = route_config(T, E, top_k)
    _launch_router(x, w, bias, out, dict(
        word_ptr=arrival_words(x, 1, ROUTE_WORKSPACE, words), counts_ptr=counts,
        tok_ptr=token_ids, exp_ptr=expert_ids, rw_ptr=weights, nv_ptr=num_valid,
        pos_ptr=positions, cap=0 if capacity is None else capacity, scaling=scaling, ROUTE=True,
        K=top_k, KP=next_power_of_2(top_k), BT=cfg.block_tokens, BEC=cfg.expert_chunk,
        NB=num_buckets(E, True), SCORING=scoring, RENORM=renormalize,
        HAS_CAP=capacity is not None))


def _launch_router(x: Tensor, w: Tensor, bias: Tensor | None, out: Tensor, route: dict) -> None:
    """One program per expert; ``route``: the routing arguments of _router_kernel (ROUTE), or
    none."""
    (T, D), E = x.shape, w.shape[0]
    block_t = next_power_of_2(T)
    block_d, warps = _TILES.get(block_t, (max(64, 16384 // block_t), 8))  # beyond: any T
    interpret = interpreting()
    if not route:
        route = dict(word_ptr=None, counts_ptr=None, tok_ptr=None, exp_ptr=None, rw_ptr=None,
                     nv_ptr=None, pos_ptr=None, cap=0, scaling=1.0, ROUTE=False, K=1, KP=1,
                     BT=1, BEC=1, NB=1, SCORING=0, RENORM=False, HAS_CAP=False)
    with on_device(x):
        launch(_router_kernel, (E,), x, w, bias, out, T, D, x.stride(0), w.stride(0), E=E,
               HAS_BIAS=bias is not None, BLOCK_T=block_t,
               BLOCK_D=min(block_d, next_power_of_2(D)), INTERPRET=interpret,
               PDL=x.is_cuda and not interpret and not traced((x,)), num_warps=warps, **route)


def router_logits(x: Tensor, w: Tensor, bias: Tensor | None) -> Tensor:
    """x [T, D], w [E, D], bias [E] | None -> logits [T, E] in x's dtype: one launch while
    T <= GEMV_MAX_TOKENS (and the columns of x and w, and bias, are at unit stride), else
    F.linear."""
    if not _gemv(x, w, bias):
        return F.linear(x, w, bias)
    out = torch.empty(x.shape[0], w.shape[0], dtype=x.dtype, device=x.device)
    _router_op(x, w, bias, out)
    return out


def _gemv(x: Tensor, w: Tensor, bias: Tensor | None) -> bool:
    """Whether router_logits takes the kernel."""
    return (x.shape[0] <= GEMV_MAX_TOKENS and x.stride(1) == 1 and w.stride(1) == 1
            and (bias is None or bias.stride(0) == 1))


def router_route(x: Tensor, w: Tensor, bias: Tensor | None, top_k: int, scoring: str,
                 renormalize: bool, scaling: float, capacity: int | None) -> Routing:
    """index_shuffle(router_logits(x, w, bias), top_k, scoring, renormalize, scaling, capacity)
    (the same bits): in one launch while T <= ROUTE_MAX_TOKENS (and router_logits would take
    its kernel), else those two calls."""
    T, E = x.shape[0], w.shape[0]
    if T > ROUTE_MAX_TOKENS or not _gemv(x, w, bias) or not route_config(T, E, top_k).single:
        return index_shuffle(router_logits(x, w, bias), top_k, scoring, renormalize, scaling,
                             capacity)
    A, dev = T * top_k, x.device
    out = torch.empty(T, E, dtype=x.dtype, device=dev)
    r = Routing(*(torch.empty(n, dtype=torch.int32, device=dev) for n in (E, A, A)),
                torch.empty(A, dtype=torch.float32, device=dev),
                *(torch.empty(n, dtype=torch.int32, device=dev) for n in (1, A)))
    _router_route_op(x, w, bias, out, r.counts, r.token_ids, r.expert_ids, r.weights,
                     r.num_valid, r.positions, held_words(x, ROUTE_WORKSPACE), top_k,
                     SCORING_IDS[scoring], renormalize, float(scaling), capacity)
    return r
