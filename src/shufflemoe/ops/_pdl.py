"""Programmatic dependent launch (PDL) for the small kernels of the unfused path's chain:
routing and placing the pairs, gathering (and quantizing) their rows, the activation, the
combine. Launched with PDL, a kernel's programs may start as soon as every program of the kernel
before it has started, so its launch and ramp overlap that kernel's work instead of following
its last store. Each of its programs first lets the next kernel launch the same way, then waits
(griddepcontrol.wait) until the kernel before it has completed and its memory is visible, and
only then touches memory. Waiting first keeps every order a stream gives: a kernel reads and
writes nothing until its predecessor is done, which waited for its own, however far back a
buffer was written or read. Where nothing launched with PDL follows, or no kernel came before,
the instructions do nothing. Not under the interpreter, nor when torch.compile traces a launch.

The grouped GEMMs keep ordinary launches. Launched early, their persistent programs (two an SM)
sat on the SMs beside the kernel before, and a GEMM with its GLU lost 8%: Mixtral TP2 bf16 at T
= 64, GEMM13 304 -> 329 us, the layer 484 -> 507 (and with the GEMMs' own next kernel launched
only at their last tile, or at their exit: 506). The fused decode kernels have their own PDL
(moe_decode/kernel.py). H100, the layer in CUDA graphs (benchmarks/probe_one_pair.py, results/
probe_one_pair_chain_*.jsonl; before -> the small kernels chained, us): Qwen3-30B-A3B fp8 T =
16 / 64 / 128 153.7 -> 151.6, 227.3 -> 223.9, 234.4 -> 231.2, bf16 269.7 -> 267.7, 405.7 ->
403.0, 414.2 -> 411.6; Llama 4 Scout TP8 fp8 86.5 -> 85.2, 113.6 -> 111.7, 122.2 -> 119.3;
Mixtral TP2 fp8 T = 64 267.0 -> 263.7; the other rows within 0.5%. Only small grids
(MAX_PROGRAMS): at prefill sizes chaining lost."""

from __future__ import annotations

import math

import triton
import triton.language as tl
from torch import Tensor
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ._common import traced
from ._impl import interpreting


# Chained only up to this many programs: decode's grids (at most 1024 at T <= 128, Qwen3's
# silu_mul_fp8 at T = 128 the largest). Past them the layer suite at f5f8864 (every grid chained)
# lost at prefill, where these kernels run tens of thousands of small programs: T = 2048 fp8_block
# (gather and activation quantized per 128-column group, one warp a program: 360 K programs)
# Qwen3-30B-A3B 604.8 -> 822.5 us, Llama 4 Scout TP8 324.6 -> 382.6, Maverick TP8 871.0 -> 927.9;
# Qwen3 bf16 576.8 -> 608.4, fp8_w8a16 597.5 -> 618.4, mxfp4 636.2 -> 661.8
# (results/layer_chain_f5f8864.md against layer.md at 5edc05d).
MAX_PROGRAMS = 1024


def chained(like: Tensor, grid: tuple[int, ...]) -> dict:
    """The launch keywords of a chained kernel that runs on ``like``'s device over ``grid``: PDL
    (the kernel's constexpr, passed to chain_start) and Triton's launch_pdl where it runs
    compiled on CUDA and the grid holds at most MAX_PROGRAMS programs, PDL=False elsewhere."""
    if (like.is_cuda and not interpreting() and not traced((like,))
            and math.prod(grid) <= MAX_PROGRAMS):
        return {"PDL": True, "launch_pdl": True}
    return {"PDL": False}


@triton.jit
def chain_start(PDL: tl.constexpr):
    """A chained kernel's first statement: let the next kernel launch, then wait for the one
    before (see the module docstring)."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
