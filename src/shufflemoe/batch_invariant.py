"""Batch-invariant mode (``MoEConfig(batch_invariant=True)``): each output row is the same bits
whatever else is in the batch (its size, the other rows, the row's position).

A row's result changes with the batch wherever a reduction's order depends on it:
| where                 | default                                          | batch-invariant            |
| --------------------- | ------------------------------------------------ | -------------------------- |
| router logits         | kernel tiles follow T; past them F.linear, whose | the kernel's 8-token tile  |
|                       | blocking BLAS / cuBLAS pick by M                 | at every T                 |
| routing weights       | index_shuffle's tiles follow T                   | fixed tiles (kernel)       |
| expert GEMMs          | tile configuration follows M and G               | the same; above 64 rows    |
|                       |                                                  | one per (N, K, dtype)      |
| combine (k > 1)       | atomic adds in arrival order, one rounding each  | token-major, ascending     |
|                       |                                                  | position (= expert id)     |
| shared expert, gate   | F.linear / torch.mm                              | grouped GEMM, one group    |
Gather, SwiGLU and fp8 quantization work row by row already; top-k selection is exact. A
grouped-GEMM tile's width, K step and operand roles do not change how an element is summed
(ascending k16 MMA steps in fp32; grouped_gemm.configs says how that was measured), so small
batches keep the fast decode tiles; the kernel has no split-K, whose order would follow M. The
mode needs the Triton kernels (the torch references multiply through BLAS), the ``shuffled``
strategy and local dispatch (an all-reduce's or all-to-all's order follows the message size),
and no capacity factor (MoEConfig refuses it: dropping depends on the batch by definition).
It runs eagerly and in CUDA graphs (graph.graphed); under torch.compile the mode's scope (a
context variable the grouped GEMM's launcher reads) breaks the graph.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import Tensor

from .config import MoEConfig
from .ops import grouped_gemm, silu_mul
from .ops._impl import resolve
from .ops.grouped_gemm import configs

DISPATCHERS = ("local",)  # dispatchers whose result does not depend on the batch


def supports(cfg: MoEConfig, experts, dispatch) -> tuple[bool, str]:
    """(ok, reason): can this strategy and dispatcher keep cfg.batch_invariant's promise?"""
    if not cfg.batch_invariant:
        return True, ""
    if not getattr(experts, "batch_invariant", False):
        return False, f"MoEConfig.batch_invariant needs experts='shuffled', got {experts.name!r}"
    if dispatch.name not in DISPATCHERS:
        return False, f"MoEConfig.batch_invariant needs local dispatch, got {dispatch.name!r}"
    return True, ""


@contextlib.contextmanager
def scope(cfg: MoEConfig, x: Tensor) -> Iterator[None]:
    """The layer's forward runs inside: in batch-invariant mode, fixed grouped-GEMM tiles."""
    if not cfg.batch_invariant:
        yield
        return
    if resolve(None, x) != "triton":
        raise ValueError(
            "MoEConfig.batch_invariant needs the Triton kernels: CUDA tensors, or on the CPU "
            "TRITON_INTERPRET=1 with shufflemoe.ops.use_impl('triton') (the torch references "
            "multiply through BLAS, whose blocking depends on the batch)")
    with configs.batch_invariant():
        yield


def linear(x: Tensor, w: Tensor, out: Tensor | None = None) -> Tensor:
    """x [T, K] @ w [N, K]^T -> [T, N] in x's dtype (into out when given), each row computed the
    same way whatever T: the grouped GEMM with one group, a configuration fixed by (N, K, dtype)."""
    m_sizes = torch.full((1,), x.shape[0], dtype=torch.int32, device=x.device)
    with configs.batch_invariant():
        return grouped_gemm(x.contiguous(), w.contiguous().unsqueeze(0), m_sizes, out=out)


def shared_expert(x: Tensor, w13: Tensor, w2: Tensor, gate: Tensor | None, out: Tensor) -> Tensor:
    """out [T, D] = SwiGLU(x) through shared w13 [2Is, D], w2 [D, Is] (times sigmoid(x @ gate^T),
    gate [1, D], Qwen2-MoE), every product in ``linear``."""
    linear(silu_mul(linear(x, w13)), w2, out=out)
    if gate is not None:
        out.mul_(torch.sigmoid(linear(x, gate)))
    return out
