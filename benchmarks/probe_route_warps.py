"""index_shuffle at decode sizes with 1, 2, 4 and 8 warps (one GPU call, under a minute).

    PYTHONPATH=src python benchmarks/probe_route_warps.py --out $OUT

At T = 1 the routing kernel is one program over a [BT, E] score tile (route_config: 4 warps
below 128 pairs); its k argmax rounds and the sort are reductions that cross warps through
shared memory. The layer's timeline (probe_timeline, H100) had it at 2.3 us (Llama 4 Scout,
E = 16, top-1) and 4.4 us (Qwen3-30B-A3B, E = 128, top-8, softmax). For each router shape and
T = 1..16 (DeepSeek-V3's grouped top-8 with its bias too, tiled by grouped_config): every warp
count's Routing against the one route_config picks (counts, ids, positions equal; weights within
float32 rounding), then CUDA-graph replays of 64 calls on rotating scores; where one program
holds 1-2 tokens, also the block padded to 4 tokens with 4 warps (bt4).
Writes $OUT/probe_route_warps.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib

import torch

from shufflemoe.bench.report import metadata
from shufflemoe.bench.timing import time_fn
from shufflemoe.ops.index_shuffle.kernel import grouped_config, index_shuffle, route_config

SHAPES = {  # name: (E, k, scoring, renormalize[, (n_group, topk_group): grouped, with a bias])
    "llama4 (E=16, top-1, sigmoid)": (16, 1, "sigmoid", False),
    "llama4-maverick (E=128, top-1, sigmoid)": (128, 1, "sigmoid", False),
    "qwen3 (E=128, top-8, softmax)": (128, 8, "softmax", True),
    "mixtral (E=8, top-2, softmax)": (8, 2, "softmax", True),
    "gpt-oss (E=128, top-4, softmax)": (128, 4, "softmax", True),
    "deepseek-v3 (E=256, 8 groups, 4 kept, top-8, sigmoid)": (256, 8, "sigmoid", True, (8, 4)),
}
TOKENS = (1, 2, 4, 8, 16)
WARPS = (1, 2, 4, 8)
SETS = 64


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=pathlib.Path)
    args = p.parse_args()
    rows = []
    for name, (E, k, scoring, renorm, *grouped) in SHAPES.items():
        groups = grouped[0] if grouped else None
        bias = torch.randn(E, device="cuda") if groups else None
        for T in TOKENS:
            scores = [torch.randn(T, E, device="cuda", dtype=torch.bfloat16) for _ in range(SETS)]
            base = grouped_config(T, E, k, groups[0]) if groups else route_config(T, E, k)
            row = dict(shape=name, T=T, default_warps=base.num_warps)

            def route(s, cfg):
                return index_shuffle(s, k, scoring, renorm, 1.0, None, cfg, groups=groups,
                                     bias=bias)

            want = route(scores[0], base)
            variants = {f"w{w}": dataclasses.replace(base, num_warps=w) for w in WARPS}
            if base.single and base.block_tokens < 4:  # padded to 4 tokens: a warp a row
                variants["bt4"] = dataclasses.replace(base, block_tokens=4, num_warps=4)
            for v, cfg in variants.items():
                got = route(scores[0], cfg)
                same = all(torch.equal(getattr(got, f), getattr(want, f)) for f in
                           ("counts", "token_ids", "expert_ids", "num_valid", "positions"))
                close = torch.allclose(got.weights, want.weights, rtol=1e-6, atol=0)
                row[f"{v}_ok"] = same and close
                row[f"{v}_bits"] = torch.equal(got.weights, want.weights)
                row[f"{v}_us"] = time_fn(
                    lambda i: route(scores[i], cfg),
                    SETS, graph=True, reps=30).median_us
            rows.append(row)
            print(name, T, " ".join(f"{v} {row[f'{v}_us']:.2f}us"
                                    f"{'' if row[f'{v}_ok'] else ' WRONG'}" for v in variants),
                  flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "probe_route_warps.json").write_text(json.dumps(dict(meta=metadata(), rows=rows),
                                                                indent=1, default=str))


if __name__ == "__main__":
    main()
