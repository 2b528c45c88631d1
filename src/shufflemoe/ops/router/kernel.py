"""The router's logits at decode sizes in one Triton launch: a program per expert row (past
PROGRAMS programs, per block of experts) and block of up to 8 tokens, every token's dot product
with it summed in fp32 and rounded once to x's dtype (as cuBLAS does, in another order), plus
the bias (gpt-oss) before the rounding. Where
uses_kernel says no (more tokens x experts), F.linear. H100, CUDA graphs
(benchmarks/probe_router.py, the router alone at T = 1 / 8, us): Llama 4 Scout (E = 16, D =
5120) 6.6 / 6.4 for cuBLAS (a split-K GEMM and its reduction) against 2.7 / 3.5; Qwen3-30B-A3B
(128, 2048) 5.4 / 5.4 against 2.5 / 3.3; DeepSeek-V3 (256, 7168) 6.7 / 6.8 against 3.4 / 5.9.
Past 8 tokens: ops/router/__init__.py."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor
from triton.language.extra.cuda import gdc_launch_dependents

from .._common import cdiv, next_power_of_2, on_device, traced
from .._impl import interpreting, kernel_op
from .._launch import launch
from ..quantize.kernel import cast_to
from . import uses_kernel

# (columns of x a step, warps) by tokens, from the probe above: about 4-16 K values a step
_TILES = {1: (4096, 8), 2: (2048, 8), 4: (2048, 4), 8: (2048, 8)}
# Past 8 tokens a program takes a block of TOKEN_BLOCK tokens (a second grid axis) with the
# 8-token tile: E x T / 8 programs share the reads of x that one program per expert would make
# alone (blocks of 16 and 32 tokens, and narrower steps, were slower: probe_router_tokens).
TOKEN_BLOCK = 8
# Batch-invariant mode (batch_invariant.router_logits): the 8-token tile at every T. A row's sum
# then runs through the same registers, lanes and warps whatever T and wherever the row sits in
# its block (masked rows add nothing to it), so its bits do not depend on the batch.
INVARIANT_TILE = (TOKEN_BLOCK, *_TILES[TOKEN_BLOCK])
# experts_per_program: past PROGRAMS programs a program takes up to EXPERTS_MAX experts. H100,
# the invariant tile alone in CUDA graphs (benchmarks/probe_bi_router.py), against one expert a
# program, us: Qwen3-30B-A3B (E = 128, D = 2048) T = 64 10.3 -> 7.3, T = 2048 222 -> 120-125,
# T = 8192 871 -> 461; Llama 4 Scout (16, 5120) T = 2048 80 -> 54; DeepSeek-V3 (256, 7168) T =
# 2048 1008 with 256 experts a program (256 programs), 923 with 32.
PROGRAMS = 256
EXPERTS_MAX = 32


@triton.jit
def _store_logits(s, b_ptr, out_ptr, ts, t_ok, e, e_ok, E, HAS_BIAS: tl.constexpr,
                  INTERPRET: tl.constexpr):
    """out[ts, e] = s (+ b[e]), rounded once to out's dtype."""
    if HAS_BIAS:
        s += tl.load(b_ptr + e, mask=e_ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + ts.to(tl.int64) * E + e, cast_to(s, out_ptr.dtype.element_ty, INTERPRET),
             mask=t_ok & e_ok)


@triton.jit(do_not_specialize=("experts",))
def _router_kernel(x_ptr, w_ptr, b_ptr, out_ptr, T, D, E, experts, x_stride, w_stride,
                   HAS_BIAS: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
                   ONE_STEP: tl.constexpr, INTERPRET: tl.constexpr, PDL: tl.constexpr):
    """out[t, e] = x[t] . w[e] (+ b[e]) for the tokens t of this program's block (axis 1, BLOCK_T
    tokens) and the `experts` experts e of its block (axis 0), one after another, each summed
    by the same instructions (so a logit's bits do not depend on `experts`, which is a runtime
    value: one binary serves every count). ONE_STEP (D <= BLOCK_D): the block's rows are loaded
    and converted to fp32 once for all its experts; else each expert walks D in BLOCK_D steps
    and loads the rows again (from cache after the first expert). PDL: let a next kernel launched with
    programmatic dependent launch (index_shuffle's) start at once; it waits for this one before
    it reads the logits."""
    if PDL:
        gdc_launch_dependents()
    ts = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    t_ok = ts < T
    e = tl.program_id(0) * experts
    e_end = e + experts
    if ONE_STEP:
        ds = tl.arange(0, BLOCK_D)
        d_ok = ds < D
        x = tl.load(x_ptr + ts.to(tl.int64)[:, None] * x_stride + ds[None, :],
                    mask=t_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
        while e < e_end:
            e_ok = e < E
            w = tl.load(w_ptr + e.to(tl.int64) * w_stride + ds, mask=d_ok & e_ok, other=0.0)
            s = tl.sum(x * w.to(tl.float32)[None, :], 1)
            _store_logits(s, b_ptr, out_ptr, ts, t_ok, e, e_ok, E, HAS_BIAS, INTERPRET)
            e += 1
    else:
        while e < e_end:
            e_ok = e < E
            row = w_ptr + e.to(tl.int64) * w_stride
            acc = tl.zeros([BLOCK_T, BLOCK_D], tl.float32)
            d0 = 0
            while d0 < D:
                ds = d0 + tl.arange(0, BLOCK_D)
                d_ok = ds < D
                w = tl.load(row + ds, mask=d_ok & e_ok, other=0.0)
                x = tl.load(x_ptr + ts.to(tl.int64)[:, None] * x_stride + ds[None, :],
                            mask=t_ok[:, None] & d_ok[None, :], other=0.0)
                acc += x.to(tl.float32) * w.to(tl.float32)[None, :]
                d0 += BLOCK_D
            _store_logits(tl.sum(acc, 1), b_ptr, out_ptr, ts, t_ok, e, e_ok, E, HAS_BIAS,
                          INTERPRET)
            e += 1


def experts_per_program(T: int, E: int) -> int:
    """How many experts a program takes: 1 until the grid would pass PROGRAMS programs (decode:
    a program per expert and token block streams the router's weights on every SM), then the
    power of two that keeps it near PROGRAMS, at most EXPERTS_MAX, so that at prefill a block's
    rows of x are loaded once per that many experts instead of once per expert."""
    n = E * cdiv(T, TOKEN_BLOCK) // PROGRAMS
    return min(next_power_of_2(E), EXPERTS_MAX, 1 << max(n.bit_length() - 1, 0))


@kernel_op("router_logits", mutates_args=("out",))
def _router_op(x: Tensor, w: Tensor, bias: Optional[Tensor], out: Tensor,
               invariant: bool = False) -> None:
    """out [T, E] <- x [T, D] @ w [E, D]^T (+ bias [E]; rows of x and w at any stride, unit
    column strides). Meant for decode T; any T works (blocks of TOKEN_BLOCK tokens). invariant:
    INVARIANT_TILE whatever T."""
    (T, D), E = x.shape, w.shape[0]
    if T == 0 or E == 0:
        return
    if invariant:
        block_t, block_d, warps = INVARIANT_TILE
    else:
        block_t = min(next_power_of_2(T), TOKEN_BLOCK)
        block_d, warps = _TILES[block_t]
    block_d = min(block_d, next_power_of_2(D))
    experts = experts_per_program(T, E)
    interpret = interpreting()
    with on_device(x):
        launch(_router_kernel, (cdiv(E, experts), cdiv(T, block_t)), x, w, bias, out, T, D, E,
               experts, x.stride(0), w.stride(0),
               HAS_BIAS=bias is not None, BLOCK_T=block_t, BLOCK_D=block_d,
               ONE_STEP=D <= block_d, INTERPRET=interpret,
               PDL=x.is_cuda and not interpret and not traced((x,)), num_warps=warps)


def invariant_router_logits(x: Tensor, w: Tensor, bias: Tensor | None,
                            dtype: torch.dtype | None = None) -> Tensor:
    """router_logits with INVARIANT_TILE at every T (any T: no F.linear): each row's logits the
    same bits whatever the batch. Rows of x at unit column stride (else copied)."""
    x, w = (t if t.stride(-1) == 1 else t.contiguous() for t in (x, w))
    out = torch.empty(x.shape[0], w.shape[0], dtype=dtype or x.dtype, device=x.device)
    _router_op(x, w, None if bias is None else bias.contiguous(), out, True)
    return out


def router_logits(x: Tensor, w: Tensor, bias: Tensor | None,
                  dtype: torch.dtype | None = None) -> Tensor:
    """x [T, D], w [E, D], bias [E] | None -> logits [T, E] in ``dtype`` (default: x's), as
    F.linear of them cast to it: one launch where uses_kernel(T, E) (and the columns of x and
    w, and bias, are at unit stride), which sums exact fp32 upcasts of them as stored, so
    nothing is cast; else F.linear (of the casts)."""
    dtype = dtype or x.dtype
    if (not uses_kernel(x.shape[0], w.shape[0]) or x.stride(1) != 1 or w.stride(1) != 1
            or (bias is not None and bias.stride(0) != 1)):
        return F.linear(x.to(dtype), w.to(dtype), None if bias is None else bias.to(dtype))
    out = torch.empty(x.shape[0], w.shape[0], dtype=dtype, device=x.device)
    _router_op(x, w, bias, out)
    return out
