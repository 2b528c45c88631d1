"""SwiGLU's non-linearity in Triton: a = silu(h[:, :I]) * h[:, I:] for rows below num_valid,
optionally fused with fp8 quantization, one scale per row or per group of 128 columns (the input
of the second grouped GEMM). Variants are constexpr flags of the same kernels: ACT "silu" or
"swiglu_oai" (gpt-oss: (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g), g = min(gate,
limit)), HAS_LIMIT (clamp gate above and up on both sides at ``limit`` first).

Computed in float32 as x / (1 + exp(-x)) * up, like torch's CPU and CUDA kernels; the exp differs
from torch's by an ulp or two, so the result matches the reference within the dtype tolerance
(not bit for bit). The quantized path rounds exactly as quantize_fp8_rowwise would round this
kernel's float32 product. Rows at or past num_valid are neither read nor written.

The quantized kernel needs a row's amax before it can scale any value. It either holds the row in
registers (one pass) or reads it twice (the second read an L2 hit); the launch (Fp8Launch) is a
deterministic function of I, fp8_launch(I), and fp8_variants(I) names the launches that
benchmarks/probe_layer.py times and the tests run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from .._common import cdiv, next_power_of_2
from .._impl import interpreting, kernel_op
from .._launch import launch
from .._pdl import chain_start, chained
from ..quantize.kernel import cast_to, fp8_target, row_scales, store_fp8, store_fp8_group
from ..quantize.reference import FP8_BLOCK, FP8_DTYPE, QUANTIZE_MODES


@triton.jit
def _load_pair(src, offs, I, mask):
    """(gate, up) at columns offs of the rows starting at src ([gate | up]), in h's dtype."""
    g = tl.load(src + offs, mask=mask, other=0.0)
    u = tl.load(src + I + offs, mask=mask, other=0.0)
    return g, u


@triton.jit
def glu_f32(g, u, ACT: tl.constexpr, HAS_LIMIT: tl.constexpr, alpha, limit):
    """float32 act(gate, up): silu(g) * u, or gpt-oss's (u + 1) * g * sigmoid(alpha * g); with
    HAS_LIMIT, g = min(g, limit) and u = clamp(u, -limit, limit) first. alpha and limit are
    cast to float32 here: Inductor passes Python floats as float64."""
    g = g.to(tl.float32)
    u = u.to(tl.float32)
    alpha = tl.cast(alpha, tl.float32)
    limit = tl.cast(limit, tl.float32)
    if HAS_LIMIT:
        g = tl.minimum(g, limit)
        u = tl.clamp(u, -limit, limit)
    if ACT == "swiglu_oai":
        a = tl.math.div_rn(g, 1.0 + tl.exp(-alpha * g)) * (u + 1.0)
    else:
        a = tl.math.div_rn(g, 1.0 + tl.exp(-g)) * u
    return a


@triton.jit
def _silu_mul_chunk(src, offs, I, mask, ACT: tl.constexpr, HAS_LIMIT: tl.constexpr, alpha,
                    limit):
    """float32 act(gate, up) for columns offs of the rows starting at src ([gate | up])."""
    g, u = _load_pair(src, offs, I, mask)
    return glu_f32(g, u, ACT, HAS_LIMIT, alpha, limit)


@triton.jit
def _row_valid(nv_ptr, row, HAS_NV: tl.constexpr):
    if HAS_NV:
        valid = row < tl.load(nv_ptr)
    else:
        valid = row >= 0
    return valid


@triton.jit
def _silu_mul_kernel(
    h_ptr,  # [A, 2I] gate columns then up columns
    nv_ptr,  # [1] number of valid rows (unused when not HAS_NV)
    out_ptr,  # [A, I] output in h's dtype, or e4m3 (uint8 view when INTERPRET) with GROUPS
    scale_ptr,  # [A, cdiv(I, BLOCK)] float32 group scales (GROUPS)
    I,  # intermediate size
    alpha, limit,  # swiglu_oai's alpha; the clamp limit (HAS_LIMIT)
    HAS_NV: tl.constexpr,
    INTERPRET: tl.constexpr,  # round with integer arithmetic (interpreter casts are wrong)
    BLOCK: tl.constexpr,  # columns per program (grid axis 1 covers I); the group with GROUPS
    GROUPS: tl.constexpr,  # quantize each program's BLOCK columns to e4m3 with their own scale
    ACT: tl.constexpr, HAS_LIMIT: tl.constexpr,
    PDL: tl.constexpr,  # launched with programmatic dependent launch (ops/_pdl.py)
):
    chain_start(PDL)
    row = tl.program_id(0)
    valid = _row_valid(nv_ptr, row, HAS_NV)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = (offs < I) & valid
    a = _silu_mul_chunk(h_ptr + row.to(tl.int64) * (2 * I), offs, I, mask, ACT, HAS_LIMIT, alpha,
                        limit)
    dst = out_ptr + row.to(tl.int64) * I + offs
    if GROUPS:
        scale = store_fp8_group(dst, a, mask, INTERPRET)
        tl.store(scale_ptr + row.to(tl.int64) * tl.num_programs(1) + tl.program_id(1), scale,
                 mask=valid)
    else:
        tl.store(dst, cast_to(a, out_ptr.dtype.element_ty, INTERPRET), mask=mask)


@triton.jit
def _one_pass(src, dst, valid, I, alpha, limit, INTERPRET: tl.constexpr, BLOCK: tl.constexpr,
              BLOCK_B: tl.constexpr, ACT: tl.constexpr, HAS_LIMIT: tl.constexpr):
    """Quantize a [1, I] row held in registers as two power-of-two pieces, columns [0, BLOCK)
    and [BLOCK, BLOCK + BLOCK_B) (BLOCK_B = 0: none), every load issued before the amax; returns
    the row scale [1]."""
    offs_a = tl.arange(0, BLOCK)[None, :]
    mask_a = valid[:, None] & (offs_a < I)
    g_a, u_a = _load_pair(src, offs_a, I, mask_a)
    if BLOCK_B > 0:
        offs_b = BLOCK + tl.arange(0, BLOCK_B)[None, :]
        mask_b = valid[:, None] & (offs_b < I)
        g_b, u_b = _load_pair(src, offs_b, I, mask_b)
    a_a = glu_f32(g_a, u_a, ACT, HAS_LIMIT, alpha, limit)
    amax = tl.max(tl.abs(a_a), 1)
    if BLOCK_B > 0:
        a_b = glu_f32(g_b, u_b, ACT, HAS_LIMIT, alpha, limit)
        amax = tl.maximum(amax, tl.max(tl.abs(a_b), 1))
    inv, scale = row_scales(amax)
    store_fp8(dst + offs_a, a_a, inv[:, None], mask_a, INTERPRET)
    if BLOCK_B > 0:
        store_fp8(dst + offs_b, a_b, inv[:, None], mask_b, INTERPRET)
    return scale


@triton.jit
def _two_pass(src, dst, valid, I, alpha, limit, INTERPRET: tl.constexpr, BLOCK: tl.constexpr,
              CHUNKS: tl.constexpr, ACT: tl.constexpr, HAS_LIMIT: tl.constexpr):
    """Quantize a row in CHUNKS = cdiv(I, BLOCK) chunks: pass 1 takes the amax, pass 2 recomputes
    the same float32 values from h (an L2 hit) and stores them; returns the row scale."""
    offs = tl.arange(0, BLOCK)[None, :]
    amax = tl.zeros([1, BLOCK], tl.float32)
    for k in range(0, CHUNKS):  # a constexpr bound: the interpreter runs it too
        cols = k * BLOCK + offs
        mask = valid[:, None] & (cols < I)
        amax = tl.maximum(amax, tl.abs(_silu_mul_chunk(src, cols, I, mask, ACT, HAS_LIMIT, alpha,
                                                       limit)))
    inv, scale = row_scales(tl.max(amax, 1))
    for k in range(0, CHUNKS):
        cols = k * BLOCK + offs
        mask = valid[:, None] & (cols < I)
        a = _silu_mul_chunk(src, cols, I, mask, ACT, HAS_LIMIT, alpha, limit)
        store_fp8(dst + cols, a, inv[:, None], mask, INTERPRET)
    return scale


@triton.jit
def _silu_mul_fp8_kernel(
    h_ptr,  # [A, 2I] gate columns then up columns
    nv_ptr,  # [1] number of valid rows (unused when not HAS_NV)
    q_ptr,  # [A, I] e4m3 output (uint8 view when INTERPRET)
    scale_ptr,  # [A] float32 row scales
    I,  # intermediate size
    alpha, limit,  # swiglu_oai's alpha; the clamp limit (HAS_LIMIT)
    HAS_NV: tl.constexpr,
    INTERPRET: tl.constexpr,  # round with integer arithmetic (interpreter casts are wrong)
    ONE_PASS: tl.constexpr,  # the row is held in registers and read once
    BLOCK: tl.constexpr,  # ONE_PASS: first piece of the row; else the chunk width
    BLOCK_B: tl.constexpr,  # ONE_PASS: second piece of the row, 0 when BLOCK covers I
    CHUNKS: tl.constexpr,  # two passes: cdiv(I, BLOCK)
    ACT: tl.constexpr, HAS_LIMIT: tl.constexpr,
    PDL: tl.constexpr,  # launched with programmatic dependent launch (ops/_pdl.py)
):
    chain_start(PDL)
    rows = tl.program_id(0) + tl.arange(0, 1)  # [1]: one row a program, as a 1-row tile
    valid = _row_valid(nv_ptr, rows, HAS_NV)
    src = h_ptr + rows[:, None].to(tl.int64) * (2 * I)
    dst = q_ptr + rows[:, None].to(tl.int64) * I
    if ONE_PASS:
        scale = _one_pass(src, dst, valid, I, alpha, limit, INTERPRET, BLOCK, BLOCK_B, ACT,
                          HAS_LIMIT)
    else:
        scale = _two_pass(src, dst, valid, I, alpha, limit, INTERPRET, BLOCK, CHUNKS, ACT,
                          HAS_LIMIT)
    tl.store(scale_ptr + rows, scale, mask=valid)


def _block(I: int) -> int:
    """Columns per program: the largest power of two <= 2048 dividing I (5120 -> 1024), >= 256."""
    block = 2048
    while block > 256 and I % block:
        block //= 2
    return min(block, next_power_of_2(I))


@kernel_op("silu_mul", mutates_args=("out",))
def _silu_mul_op(h: Tensor, num_valid: Optional[Tensor], out: Tensor, act: str, alpha: float,
                 limit: Optional[float]) -> None:
    A, I = out.shape
    if A == 0 or I == 0:
        return
    block = _block(I)
    grid = (A, cdiv(I, block))
    launch(_silu_mul_kernel, grid,
        h, num_valid, out, None, I, alpha, 0.0 if limit is None else limit,
        HAS_NV=num_valid is not None, INTERPRET=interpreting(), BLOCK=block, GROUPS=False,
        ACT=act, HAS_LIMIT=limit is not None, num_warps=4 if block <= 1024 else 8,
        **chained(h, grid))


@kernel_op("silu_mul_fp8_groups", mutates_args=("q", "scale"))
def _silu_mul_groups_op(h: Tensor, num_valid: Optional[Tensor], q: Tensor, scale: Tensor,
                        act: str, alpha: float, limit: Optional[float]) -> None:
    A, I = q.shape
    if A == 0 or I == 0:
        return
    target, interpret = fp8_target(q)
    launch(_silu_mul_kernel, (A, scale.shape[1]),
        h, num_valid, target, scale, I, alpha, 0.0 if limit is None else limit,
        HAS_NV=num_valid is not None, INTERPRET=interpret, BLOCK=FP8_BLOCK, GROUPS=True,
        ACT=act, HAS_LIMIT=limit is not None, num_warps=1, **chained(h, (A, scale.shape[1])))


@dataclass(frozen=True)
class Fp8Launch:
    """How _silu_mul_fp8_kernel covers a row (one program a row): its tiling and warps."""

    one_pass: bool  # hold the row in registers and read h once, else two passes
    block: int  # one pass: first piece of the row; two passes: chunk width
    block_b: int = 0  # one pass: second piece, 0 when block covers I
    chunks: int = 0  # two passes: cdiv(I, block)
    num_warps: int = 4


def _pieces(I: int) -> tuple[int, int]:
    """The row as two power-of-two pieces with few wasted lanes: the largest power of two <= I,
    then the next power of two of the rest (5120 -> 4096 + 1024, 768 -> 512 + 256,
    1100 -> 1024 + 128, 1024 -> 1024 + 0); at least 16 lanes each."""
    if I <= 16:
        return 16, 0
    a = 1 << (I.bit_length() - 1)
    return a, (max(16, next_power_of_2(I - a)) if I > a else 0)


def _one_pass_launch(I: int, num_warps: int | None = None) -> Fp8Launch:
    """One pass over two pieces; by default 4 warps up to 4096 lanes, 8 above."""
    a, b = _pieces(I)
    if num_warps is None:
        num_warps = min(8, max(4, next_power_of_2(a + b) // 1024))
    return Fp8Launch(one_pass=True, block=a, block_b=b, num_warps=num_warps)


def _two_pass_launch(I: int, block: int = 1024) -> Fp8Launch:
    """Two passes over chunks of at most ``block`` columns (at least two chunks when I >= 32)."""
    block = max(16, min(block, 1 << (max(I // 2, 1).bit_length() - 1)))
    return Fp8Launch(one_pass=False, block=block, chunks=cdiv(I, block))


def fp8_variants(I: int) -> dict[str, Fp8Launch]:
    """The launches benchmarks/probe_layer.py times and the tests run, by name."""
    return {"one_pass": _one_pass_launch(I), "one_pass_w4": _one_pass_launch(I, 4),
            "one_pass_w8": _one_pass_launch(I, 8), "one_pass_w16": _one_pass_launch(I, 16),
            "two_pass": _two_pass_launch(I)}


def fp8_launch(I: int) -> Fp8Launch:
    """The launch for rows of I values. Measured on an H100 (benchmarks/notes/layer.md), % of the
    copy bandwidth at A = 2048 / 16384 rows: I = 5120 one pass over 4096 + 1024 lanes, 8 warps
    81 / 97 (16 warps 72 / 86, 32 warps 70 / 82); two passes of 1024 columns 57 / 76 (each row a
    serial chain of dependent loads, silu computed twice; pipelined or prefetched loops 53-55 /
    68-75). I = 768 (512 + 256, 4 warps) 80 at 16384 rows, 8 warps 61. Wider rows than 8192
    would spill: two passes."""
    if I <= 8192:
        return _one_pass_launch(I)
    return _two_pass_launch(I)


def launch_silu_mul_fp8(h: Tensor, num_valid: Optional[Tensor], q: Tensor, scale: Tensor,
                        variant: Fp8Launch | str | None = None,
                        act: tuple[str, float, float | None] = ("silu", 1.0, None)) -> None:
    """q [A, I] e4m3, scale [A] float32 <- silu_mul(h [A, 2I]) with a given launch variant (an
    Fp8Launch, a name from fp8_variants(I), or None: fp8_launch(I)); act = (activation, alpha,
    limit)."""
    A, I = q.shape
    if A == 0 or I == 0:
        return
    if variant is None:
        variant = fp8_launch(I)
    elif isinstance(variant, str):
        variant = fp8_variants(I)[variant]
    target, interpret = fp8_target(q)
    c = variant
    kind, alpha, limit = act
    launch(_silu_mul_fp8_kernel, (A,),
        h, num_valid, target, scale, I, alpha, 0.0 if limit is None else limit,
        HAS_NV=num_valid is not None, INTERPRET=interpret, ONE_PASS=c.one_pass, BLOCK=c.block,
        BLOCK_B=c.block_b, CHUNKS=c.chunks, ACT=kind, HAS_LIMIT=limit is not None,
        num_warps=c.num_warps, **chained(h, (A,)))


@kernel_op("silu_mul_fp8", mutates_args=("q", "scale"))
def _silu_mul_fp8_op(h: Tensor, num_valid: Optional[Tensor], q: Tensor, scale: Tensor, act: str,
                     alpha: float, limit: Optional[float]) -> None:
    launch_silu_mul_fp8(h, num_valid, q, scale, act=(act, alpha, limit))


def silu_mul(
    h: Tensor,
    num_valid: Tensor | None,
    quantize: bool | str,
    out: Tensor | tuple[Tensor, Tensor] | None,
    act: tuple[str, float, float | None] = ("silu", 1.0, None),
    fp8_variant: Fp8Launch | str | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """h [A, 2I] -> a [A, I] in h's dtype, or (q [A, I] e4m3, scale [A] float32) with quantize
    "rowwise", or (q, scale [A, ceil(I / 128)]) with "groups"; act = (activation, alpha, limit).
    Arguments were checked by the public function. fp8_variant (tests and probes) picks the
    rowwise launch, bypassing the custom op."""
    A, I = h.shape[0], h.shape[1] // 2
    quantize = QUANTIZE_MODES[quantize]
    if quantize != "none":
        if out is None:
            scale_shape = (A,) if quantize == "rowwise" else (A, cdiv(I, FP8_BLOCK))
            out = (torch.empty(A, I, dtype=FP8_DTYPE, device=h.device),
                   torch.empty(scale_shape, dtype=torch.float32, device=h.device))
        if quantize == "groups":
            _silu_mul_groups_op(h, num_valid, out[0], out[1], *act)
        elif fp8_variant is None:
            _silu_mul_fp8_op(h, num_valid, out[0], out[1], *act)
        else:
            launch_silu_mul_fp8(h, num_valid, out[0], out[1], fp8_variant, act)
        return out
    if out is None:
        out = torch.empty(A, I, dtype=h.dtype, device=h.device)
    _silu_mul_op(h, num_valid, out, *act)
    return out
