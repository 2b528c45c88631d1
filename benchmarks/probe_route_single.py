"""index_shuffle in one program or in blocks, at the token counts where the layer leaves the fused
decode path (one GPU call, about a minute).

    PYTHONPATH=src python benchmarks/probe_route_single.py --out $OUT

route_config routed in one program while the padded batch had at most 512 pairs. The layer's
timeline (probe_timeline --tokens 64,128 at 3c9b2f2, H100) had that one program at 34.7 us for
Qwen3-30B-A3B at T = 64 (512 pairs, E = 128, top-8), against 3.1 + 2.7 us for the two block
launches at T = 128, and 10.0 us for Mixtral at T = 128 (256 pairs). For each router shape and
T: the one-program Routing against the blocks' (counts, ids, positions equal; weights within
float32 rounding: the block's softmax sums run over other tiles), then CUDA-graph replays of 64
calls on rotating scores, both ways. Writes $OUT/probe_route_single.json. Its run at 572b85f set
route_config's rule (at most 64 pairs, or top-1 over at most 4096 scores). Back to back in one
graph the one program timed lower than alone in the layer (Qwen3 T = 64: 17.1 us here, 34.5 in
the layer's timeline at 732ba68): the layer suite judges the rule.
"""

from __future__ import annotations

import argparse
import json
import pathlib

import torch

from shufflemoe.bench.report import metadata
from shufflemoe.bench.timing import time_fn
from shufflemoe.ops.index_shuffle.kernel import index_shuffle, route_config

SHAPES = {  # name: (E, k, scoring, renormalize)
    "llama4-scout (E=16, top-1, sigmoid)": (16, 1, "sigmoid", False),
    "llama4-maverick (E=128, top-1, sigmoid)": (128, 1, "sigmoid", False),
    "qwen3 (E=128, top-8, softmax)": (128, 8, "softmax", True),
    "mixtral (E=8, top-2, softmax)": (8, 2, "softmax", True),
    "gpt-oss (E=128, top-4, softmax)": (128, 4, "softmax", True),
    "deepseek-like (E=256, top-8, sigmoid)": (256, 8, "sigmoid", True),
}
TOKENS = (4, 8, 16, 32, 64, 128, 256)
SETS = 64
FIELDS = ("counts", "token_ids", "expert_ids", "num_valid", "positions")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=pathlib.Path)
    args = p.parse_args()
    rows = []
    for name, (E, k, scoring, renorm) in SHAPES.items():
        for T in TOKENS:
            scores = [torch.randn(T, E, device="cuda", dtype=torch.bfloat16) for _ in range(SETS)]
            cfgs = {"single": route_config(T, E, k, single_pairs=1 << 30),
                    "blocks": route_config(T, E, k, single_pairs=0, single_scores=0)}
            row = dict(shape=name, T=T, pairs=T * k,
                       default="single" if route_config(T, E, k).single else "blocks")
            want = index_shuffle(scores[0], k, scoring, renorm, 1.0, None, cfgs["blocks"])
            got = index_shuffle(scores[0], k, scoring, renorm, 1.0, None, cfgs["single"])
            row["same_routing"] = all(torch.equal(getattr(got, f), getattr(want, f))
                                      for f in FIELDS)
            row["weights_close"] = torch.allclose(got.weights, want.weights, rtol=1e-6, atol=0)
            for way, cfg in cfgs.items():
                row[f"{way}_cfg"] = f"bt={cfg.block_tokens} bec={cfg.expert_chunk} w{cfg.num_warps}"
                row[f"{way}_us"] = time_fn(
                    lambda i: index_shuffle(scores[i], k, scoring, renorm, 1.0, None, cfg),
                    SETS, graph=True, reps=30).median_us
            rows.append(row)
            print(f"{name} T={T} pairs={T * k} default={row['default']} single "
                  f"{row['single_us']:.2f} us ({row['single_cfg']}) blocks {row['blocks_us']:.2f} us "
                  f"({row['blocks_cfg']}) same={row['same_routing']} close={row['weights_close']}",
                  flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "probe_route_single.json").write_text(
        json.dumps(dict(meta=metadata(), rows=rows), indent=1, default=str))


if __name__ == "__main__":
    main()
