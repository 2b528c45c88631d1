"""The router's logits in torch: F.linear (cuBLAS on a GPU)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def router_logits(x: Tensor, w: Tensor, bias: Tensor | None,
                  dtype: torch.dtype | None = None) -> Tensor:
    """x [T, D], w [E, D], bias [E] | None -> logits [T, E]: F.linear of them cast to ``dtype``
    (default: x's)."""
    dtype = dtype or x.dtype
    return F.linear(x.to(dtype), w.to(dtype), None if bias is None else bias.to(dtype))
