"""A transformers model across processes: MoE blocks tensor- or expert-parallel, everything else
(attention, embeddings, norms, lm_head) replicated on every rank.

    dist.init_process_group()                                  # under torchrun
    model = AutoModelForCausalLM.from_pretrained(path)          # every rank loads the same weights
    patch_distributed(model, "tp")                              # or "ep_alltoall", "ep_allgather"
    model.generate(...)

"tp": every rank runs the same prompts; each MoE block holds I / tp of every expert and
all-reduces its output, so every rank computes the same tokens. "ep_alltoall" / "ep_allgather":
each rank may run its own prompts (data-parallel attention, as expert parallelism is served);
tokens travel to the rank of their experts. An (ep, tp) mesh gives the hybrid. Every rank must
run the same number of forwards (each MoE block is a collective): generate with
min_new_tokens = max_new_tokens, or stop every rank together. Blocks are sharded at their first
forward (collective: the ranks' weights are checked identical there). examples/
distributed_generate.py checks the greedy tokens against one process.
"""

from __future__ import annotations

import functools

from torch import nn

from ...dispatch import DISPATCHERS
from ...dispatch.mesh import as_mesh
from ...parallel import parallelize
from .patch import DEFAULT_EXPERTS, ShuffleMoEBlock, drop_layer, patch

MODEL_DISPATCHERS = ("tp", "ep_alltoall", "ep_allgather")


def patch_distributed(model: nn.Module, dispatch: str, mesh=None, *,
                      experts: str = DEFAULT_EXPERTS, graph_buckets: tuple[int, ...] | None = None,
                      **options) -> nn.Module:
    """patch(model), then every MoE block runs as this rank's part of ``dispatch`` on ``mesh``
    (default: every rank along the dispatcher's dimension). options go to the dispatcher
    (max_tokens, dedup, redundant). Collective; returns ``model``."""
    DISPATCHERS.get(dispatch)
    if dispatch not in MODEL_DISPATCHERS:
        raise ValueError(f"patch_distributed runs {MODEL_DISPATCHERS} (attention replicated); "
                         f"{dispatch!r} needs sequence-parallel attention")
    mesh = as_mesh(mesh, "tp" if dispatch == "tp" else "ep")
    patch(model, experts, graph_buckets)
    transform = functools.partial(parallelize, dispatch=dispatch, mesh=mesh, **options)
    for module in model.modules():
        if isinstance(module, ShuffleMoEBlock):
            module.__dict__["_shufflemoe"].transform = transform
            drop_layer(module)  # rebuilt, sharded, at the next forward
    return model
