"""shufflemoe: Mixture-of-Experts inference the MetaShuffling way.

    import shufflemoe
    layer = shufflemoe.MoE(shufflemoe.preset("qwen3-30b-a3b"), experts="shuffled").cuda()
    y = layer(x)                                   # x [T, D] or [B, S, D]
    fast = shufflemoe.graphed(layer)               # CUDA-graph decode, any routing
"""

from .config import MoEConfig
from .dispatch import DISPATCHERS
from .experts import EXPERTS
from .graph import graphed
from .layer import MoE
from .parallel import expert_parallel, parallel_mesh, parallelize, tensor_parallel
from .presets import preset
from .reference import naive_moe
from .routing import route
from .types import ExpertWeights, Routing

__version__ = "0.1.0"

__all__ = [
    "DISPATCHERS",
    "EXPERTS",
    "ExpertWeights",
    "MoE",
    "MoEConfig",
    "Routing",
    "expert_parallel",
    "graphed",
    "naive_moe",
    "parallel_mesh",
    "parallelize",
    "preset",
    "route",
    "tensor_parallel",
]
