"""The router's logits in torch: F.linear (cuBLAS on a GPU); router_route: the routing from them."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from ...types import Routing
from ..index_shuffle.reference import index_shuffle


def router_logits(x: Tensor, w: Tensor, bias: Tensor | None) -> Tensor:
    """x [T, D], w [E, D], bias [E] | None -> logits [T, E] in x's dtype."""
    return F.linear(x, w, bias)


def router_route(x: Tensor, w: Tensor, bias: Tensor | None, top_k: int, scoring: str,
                 renormalize: bool, scaling: float, capacity: int | None) -> Routing:
    """index_shuffle of router_logits (see the kernel's router_route)."""
    return index_shuffle(router_logits(x, w, bias), top_k, scoring, renormalize, scaling, capacity)
