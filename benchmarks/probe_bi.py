"""Batch-invariant mode at decode: narrower grouped-GEMM tiles at small M, and whether a row's
bits survive them (one GPU call, a few minutes).

    PYTHONPATH=src python benchmarks/probe_bi.py --out $OUT

Batch-invariant mode uses one grouped-GEMM tile per (N, K, dtype): 64 x 128, no split-K, so at
T = 1 Llama 4 Scout TP8's GEMM13 (one expert, N = 2048) streams 21 MB through 16 programs and
the layer takes 1.87x the default. An element's sum is fixed by the K steps and the MMA's
operand roles (tokens as the M side, weights as N); the tile's width only changes how many
columns one program computes. So the tiles may narrow at small M if the bits stay the same: for
each variant (block_n, K step and stages for M <= 64 rows, or the default mode's tiles there;
64 x 128 above), the rows of a 96-token batch
alone, in a batch of 8 and in the whole batch (above 64 rows: the wide tiles) compared bit for
bit, and the layer timed in CUDA graphs at T = 1, 8 and 64 against the default mode.
Writes $OUT/probe_bi.json. Measured at bac0332 and cb3de92, when "(now)" was the mode's only
tile; since e3a3473 the mode takes the "heuristic" variant (grouped_gemm.configs).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from decode_check import inputs, layers_for, weight_sets  # noqa: E402
from tune_decode import PRESETS  # noqa: E402

from shufflemoe.bench.report import metadata  # noqa: E402
from shufflemoe.bench.timing import time_fn  # noqa: E402
from shufflemoe.ops.grouped_gemm import configs  # noqa: E402

NAMES = ("scout-tp8", "qwen3-30b-a3b")
# label -> (block_n, K step in multiples of the wide tile's, stages), or "heuristic": the default
# mode's tiles at M <= 64 (swap_ab: the weights become the MMA's M side)
VARIANTS = {"64x128 s4 (now)": (128, 1, 4), "64x128 k x2 s4": (128, 2, 4),
            "64x64 k x4 s3": (64, 4, 3), "64x32 k x4 s3": (32, 4, 3),
            "64x64 k x2 s6": (64, 2, 6), "heuristic": "heuristic"}
TOKENS = (1, 8, 64)
SETS = 8


def rule(variant):
    """select() under batch-invariant mode with the variant at M <= 64 rows."""
    def choose(key):
        M, N, K, G, dtype = key
        wide = configs.batch_invariant_config(N, K, dtype)
        if M > 64 or dtype == torch.float32:
            return wide
        if variant == "heuristic":
            return configs._heuristic(*key)
        block_n, k_times, stages = variant
        return wide.with_(block_n=block_n, block_k=wide.block_k * k_times, num_stages=stages)
    return choose


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=pathlib.Path)
    args = p.parse_args()
    rows = []
    for name in NAMES:
        cfg = PRESETS[name]
        n = weight_sets(cfg, 1)
        base = layers_for(cfg, n, "cuda")
        bi = layers_for(cfg.replace(batch_invariant=True), n, "cuda")  # the same weights
        big = inputs(cfg, 96, "cuda", 1)[0]
        for label, variant in VARIANTS.items():
            try:
                row = measure(name, label, variant, base, bi, big, cfg)
            except Exception as e:  # e.g. out of shared memory: the other variants still run
                row = dict(preset=name, variant=label, error=f"{type(e).__name__}: {e}"[:300])
            print(json.dumps(row), flush=True)
            rows.append(row)
        del base, bi
        torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "probe_bi.json").write_text(json.dumps(
        dict(meta=dict(metadata(), device=torch.cuda.get_device_name()), rows=rows), indent=1))


def measure(name, label, variant, base, bi, big, cfg) -> dict:
    """One variant: bits of rows 0, 5, 95 alone, in 8 tokens, in all 96; the layer's times."""
    pick = [0, 5, 95]
    with configs.override(rule(variant)):
        alone = torch.cat([bi[0](big[i:i + 1]) for i in pick])
        small = bi[0](big[:8])[[0, 5]]
        whole = bi[0](big)[pick]
        row = dict(preset=name, variant=label,
                   same_bits=torch.equal(alone[:2], small) and torch.equal(alone, whole))
        for T in TOKENS:
            xs = inputs(cfg, T, "cuda", SETS)
            row[f"T{T}_us"] = time_fn(lambda i: bi[i % len(bi)](xs[i]), SETS, graph=True,
                                      reps=30).median_us
            if label.endswith("(now)"):
                row[f"T{T}_default_us"] = time_fn(lambda i: base[i % len(base)](xs[i]), SETS,
                                                  graph=True, reps=30).median_us
    return row


if __name__ == "__main__":
    main()
