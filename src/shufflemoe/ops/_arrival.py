"""Arrival words: int32 counters in persistent zeroed buffers, on which the programs of one launch
count their arrival so that the last one can finish the launch's work (a split-K fixup, a
combine, the routing after the router's logits), without a memset launch and without a host
sync. A kernel puts every word it counted on back to zero, so the buffers are zero between
launches and a CUDA graph may replay them.

One buffer per (device, workspace) serves every call in stream order; calls that may run at
the same time on two streams take two workspaces:

| workspace | used by                                                              |
| --------- | -------------------------------------------------------------------- |
| 0         | the fused decode kernels (ops/moe_decode)                            |
| 1         | ... running the layer's shared expert beside the routed ones (layer) |
| 2         | ... their shared-expert handshake (moe_decode FLAG_WORKSPACE)        |
| 3         | the router with the routing in its launch (ops/router ROUTE_WORKSPACE) |
"""

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


_WORDS: dict[tuple[torch.device, int], list[Tensor]] = {}


def arrival_words(like: Tensor, n: int, workspace: int = 0,
                  held: Tensor | None = None) -> Tensor:
    """n zeroed int32 arrival words on ``like``'s device, from the buffer of ``workspace``. Old
    buffers are kept alive: a captured CUDA graph may still point at them. Inside a capture a
    new buffer cannot be zeroed before the replay, so warm up (as graphed() does) or reserve
    first. ``held``: the buffer held_words gave the op (a graph input when compiled), used when
    large enough; traced by torch.compile without one: fresh zeros in the graph (a fill kernel
    each call)."""
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
