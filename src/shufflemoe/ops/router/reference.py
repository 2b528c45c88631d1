"""The router's logits in torch: F.linear (cuBLAS on a GPU)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def router_logits(x: Tensor, w: Tensor, bias: Tensor | None) -> Tensor:
    """x [T, D], w [E, D], bias [E] | None -> logits [T, E] in x's dtype."""
    return F.linear(x, w, bias)
