"""Arrival words: how the programs of one launch hand a tile's split-K parts to the last of them
without a memset launch or a wait.

Each part stores its fp32 sums to a workspace, then (after a CTA barrier, so every thread's
stores precede the release) adds one to its tile's arrival word with acq_rel (``arrive``). The
program that sees ``expected - 1`` is last: it adds the parts in part order (``partials_sum``: a
fixed order, so the result does not depend on which program came last), runs the epilogue and
puts the word back to 0, so the words are zero between launches (CUDA-graph safe). The
interpreter runs programs one after another; the same code is then trivially ordered.

The words live in one persistent buffer per (device, workspace) (``arrival_words``). Launches
that may run at the same time use different workspaces: the fused decode kernels' routed (0)
and shared-expert (1) launches, their handshake (2, moe_decode.kernel.FLAG_WORKSPACE) and the
grouped GEMM's split last wave (3, grouped_gemm.kernel.SPLIT_WORKSPACE)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._common import traced
from ._launch import persistent_zeros


@triton.jit
def arrive(word_ptr, expected):
    """After this program's stores: count its arrival; True for the last of ``expected``, which
    also puts the word back to zero (after it, nobody else touches the word in this launch)."""
    tl.debug_barrier()  # every thread's stores happen before the release below
    last = tl.atomic_add(word_ptr, 1, sem="acq_rel") == expected - 1
    if last:
        tl.atomic_xchg(word_ptr, 0)
    return last


@triton.jit
def partials_sum(part_ptr, at, mask, split, stride_split):
    """Sum of the split partials at ``at`` in split order (a fixed order: the result does not
    depend on which program arrived last); .cg: they were written by other programs."""
    acc = tl.zeros(at.shape, tl.float32)
    j = 0
    while j < split:  # split is a runtime value: one compiled kernel serves every split > 1
        acc += tl.load(part_ptr + at + j * stride_split, mask=mask, other=0.0,
                       cache_modifier=".cg")
        j += 1
    return acc


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
        raise RuntimeError("a kernel needs a larger arrival buffer inside a CUDA graph capture; "
                           "run the layer once at this size before capturing")
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
