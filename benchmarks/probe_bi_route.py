"""Probe (written 2026-11-28, not run yet): batch-invariant routing's block size.

Batch-invariant mode routes with invariant_route_config: blocks of ``block_pairs`` = 256 pairs
whatever T (the block's tile fixes the order of a row's softmax and renormalization sums), so
at Qwen3-30B-A3B T = 1 one program tiles 32 tokens (31 masked) and sorts 256 pairs: 14 us
against the default's 5 (probe_timeline --batch-invariant). Smaller blocks cost less at decode
and more programs (and a larger histogram for the place kernel) at prefill. For each router
shape and block_pairs in BLOCK_PAIRS: the routing's time at each T (CUDA graphs over 4 rotated
score sets) beside the default route_config's, and whether every token's (expert, weight) pairs
are the same bits alone, in a small batch and in the largest batch (the mode's promise: a
block size whose bits follow T must not be taken).

Writes $OUT/probe_bi_route.json. PYTHONPATH=src python benchmarks/probe_bi_route.py"""
import json, os

import torch

from shufflemoe.bench.timing import time_fn
from shufflemoe.ops.index_shuffle.kernel import index_shuffle, invariant_route_config

# name: (E, k, scoring, renormalize)
ROUTERS = {"qwen3": (128, 8, "softmax", True), "scout": (16, 1, "sigmoid", False),
           "mixtral": (8, 2, "softmax", True), "gpt-oss": (128, 4, "softmax", True),
           "deepseek-like": (256, 8, "softmax", True)}
TS = (1, 8, 64, 512, 2048)
BLOCK_PAIRS = (16, 32, 64, 128, 256)
ROWS = [0, 5, 7]


def pairs_of(routing, T: int, k: int) -> torch.Tensor:
    """[T, k, 2] (expert, weight bits) of each token's pairs, sorted by expert."""
    pos = routing.positions.long()
    experts = routing.expert_ids[pos].view(T, k)
    weights = routing.weights[pos].view(T, k).view(torch.int32)
    order = experts.argsort(1)
    return torch.stack([experts.gather(1, order), weights.gather(1, order)], 2)


rows = []
for name, (E, k, scoring, renorm) in ROUTERS.items():
    big = torch.randn(max(TS), E, device="cuda", dtype=torch.bfloat16)
    for bp in (None, *BLOCK_PAIRS):
        label = "default" if bp is None else f"block_pairs {bp}"
        r = dict(router=name, E=E, k=k, variant=label)

        def route(scores):
            cfg = None if bp is None else invariant_route_config(scores.shape[0], E, k, bp)
            return index_shuffle(scores, k, scoring, renorm, 1.0, None, config=cfg)

        if bp is not None:
            whole = pairs_of(route(big), max(TS), k)[ROWS]
            alone = torch.stack([pairs_of(route(big[i:i + 1]), 1, k)[0] for i in ROWS])
            small = pairs_of(route(big[:8]), 8, k)[ROWS]
            r["same_bits"] = bool(torch.equal(whole, alone) and torch.equal(whole, small))
        for T in TS:
            sets = [torch.randn(T, E, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
            r[f"T={T} us"] = time_fn(lambda i: route(sets[i]), 4, graph=True, reps=30).median_us
        rows.append(r)
        print({a: (round(b, 1) if isinstance(b, float) else b) for a, b in r.items()}, flush=True)

json.dump(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
               commit=os.environ.get("SHUFFLEMOE_COMMIT", "?"), rows=rows),
          open(os.path.join(os.environ.get("OUT", "/tmp"), "probe_bi_route.json"), "w"), indent=1)
