"""Programmatic dependent launch (Hopper, CUDA graphs and eager streams alike) for the ops'
kernels: a kernel launched with it may be scheduled while the kernel before it on the stream
still runs, once that one's programs have all started and let it (griddepcontrol), and it
waits before it touches memory. So each launch's scheduling and prologue overlap the previous
kernel's tail instead of following its last store: the unfused path's gather, GEMMs, SwiGLU
and combine, and index_shuffle, are chains of short launches at decode. Off in the interpreter
(no griddepcontrol) and while torch.compile traces (Inductor's analysis of a user kernel stops
at the inline asm and then takes every argument for written: see moe_decode/kernel.py's
_pdl)."""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ._common import traced
from ._impl import interpreting


@triton.jit
def pdl_start(PDL: tl.constexpr):
    """A kernel's first step: let the next kernel launch (its programs wait in turn), then wait
    for the previous kernel's memory. Nothing may be read or written before it."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()


def pdl_on(like: Tensor) -> bool:
    """Whether a kernel over ``like`` launches with PDL: on a GPU, not traced."""
    return like.is_cuda and not interpreting() and not traced((like,))


def pdl_options(on: bool) -> dict:
    """The launch option that goes with PDL=on."""
    return {"launch_pdl": True} if on else {}
