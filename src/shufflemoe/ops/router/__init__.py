"""The router's logits at decode sizes: logits [T, E] = x [T, D] @ w [E, D]^T (+ bias [E]) in one
launch (kernel.py), where cuBLAS takes one or two (a split-K GEMM and its reduction); and up to
ROUTE_MAX_TOKENS tokens the routing from them (index_shuffle) in the same launch."""

from __future__ import annotations

import torch
from torch import Tensor

from .._impl import triton_available

GEMV_MAX_TOKENS = 8  # one launch up to this many tokens (kernel.py), F.linear above
ROUTE_MAX_TOKENS = GEMV_MAX_TOKENS  # router_route: the routing in that launch up to this T


def reserve(w: Tensor) -> None:
    """Allocate router_route's arrival word on the router weight w's device now: the layer calls
    it when it gathers its weights on a GPU, outside any CUDA-graph capture and compile trace
    (a capture cannot zero a new buffer; compiled, the buffer is a graph input)."""
    if w.is_cuda and triton_available() and not torch.cuda.is_current_stream_capturing():
        from .._arrival import arrival_words  # the kernels' modules: they need triton
        from .kernel import ROUTE_WORKSPACE

        arrival_words(w, 1, ROUTE_WORKSPACE)
