"""Ours against torch's grouped GEMMs past the sweep's batches (one GPU call, <= 7 min)

    PYTHONPATH=src python benchmarks/probe_prefill_vs_torch.py --out $OUT

Issue 23 asks that no preset or T be slower than torch._grouped_mm / torch._scaled_grouped_mm;
the grouped_gemm_sweep suite covers spec 002's batches 1..4096 (two models) and is met there.
probe_compute_tail timed single input sets at larger T and found ours at 0.94-1.01x torch
(Scout TP8 T = 4096 and 16384, bf16), but a single set leaves x in L2 between replays (Scout's
x at T = 4096 is 42 MB; the sweep rotates input sets and has ours 1.19x there). This runs the
sweep's own measurement (bench.suites.grouped_gemm.measure: rotated input sets, CUDA graphs,
ours checked against torch's output on every set) at T = 16384 then 8192, top-k routing drawn
as the sweep draws it, for Llama 4 Scout TP8, Maverick TP8, Qwen3-30B-A3B, Qwen2-57B-A14B TP4
and Mixtral TP2, gemm13 (N = 2I, K = D) and gemm2 (N = D, K = I), bf16 and fp8 rowwise, until
its time budget. Writes $OUT/probe_prefill_vs_torch.json (rows as the suite's) and prints
each pair's ratio (torch's time / ours). Results at 839b239: results/
probe_prefill_vs_torch_839b239.json (slower at 1 of 40: Mixtral TP2 gemm13 bf16 T = 16384).

    PYTHONPATH=src python benchmarks/probe_prefill_vs_torch.py --tiles --out $OUT

times the compute-bound bf16 points nearest parity (and the grouped_gemm suite's one prefill
miss, equal groups G = 16 M = 1024 gate_up) under each grouped_gemm.configs.PREFILL_CANDIDATES
tile, the same way; writes $OUT/probe_prefill_tiles_vs_torch.json. Results at 07a313c:
results/probe_prefill_tiles_vs_torch_07a313c.json (the heuristic 0.985-1.055x torch, no
candidate better across the points; benchmarks/notes/layer.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
import time

import torch

from shufflemoe.bench.report import metadata
from shufflemoe.bench.suites.grouped_gemm import SWEEP_MODELS, Case, measure, topk_m_sizes
from shufflemoe.ops.grouped_gemm import configs

MODELS = {  # name: (experts, top_k, [(gemm, N, K)])
    **SWEEP_MODELS,
    "llama4-maverick-tp8": (128, 1, [("gemm13", 2048, 5120), ("gemm2", 5120, 1024)]),
    "qwen3-30b-a3b": (128, 8, [("gemm13", 1536, 2048), ("gemm2", 2048, 768)]),
    "mixtral-8x7b-tp2": (8, 2, [("gemm13", 14336, 4096), ("gemm2", 4096, 7168)]),
}


# The compute-bound bf16 points nearest parity at 839b239 (torch's time / ours 0.985-1.01x), for
# --tiles: (model, gemm, T); and the spec shape the grouped_gemm suite misses (G = 16, M = 1024).
NEAR_PARITY = [("mixtral-8x7b-tp2", "gemm13", 16384), ("llama4-scout-tp8", "gemm13", 16384),
               ("llama4-scout-tp8", "gemm2", 16384), ("mixtral-8x7b-tp2", "gemm2", 16384)]


def _measure(case: Case, label: str, **extra) -> list[dict]:
    pair = measure(case, None, reps=20, label=label, **extra)
    ours, peer = pair[0], pair[1] if len(pair) > 1 else None
    print(json.dumps(dict(label=label, dtype=case.dtype, **extra, ours_us=ours["us"],
                          peer_us=peer and peer["us"], ratio=peer and peer["us"] / ours["us"],
                          check=ours["check"], config=ours["config"])), flush=True)
    return pair


def sweep(budget: float) -> list[dict]:
    start, rows = time.time(), []
    for T in (16384, 8192):
        for model, (E, k, gemms) in MODELS.items():
            for gemm, N, K in gemms:
                for dtype in ("bf16", "fp8"):
                    if time.time() - start > budget:
                        print(json.dumps(dict(skipped=f"{model} {gemm} {dtype} T={T}")))
                        continue
                    rows += _measure(Case(dtype, topk_m_sizes(T, E, k, seed=T), N, K),
                                     f"{model} {gemm} T={T}", model=model, gemm=gemm, batch=T)
    return rows


def tiles(budget: float) -> list[dict]:
    """The NEAR_PARITY points and the spec shape bf16 G = 16 M = 1024 N = 2048 K = 5120 under
    every configs.PREFILL_CANDIDATES tile (ours re-timed beside torch each time)."""
    cases = []
    for model, gemm, T in NEAR_PARITY:
        E, k, gemms = MODELS[model]
        N, K = next((n, kk) for g, n, kk in gemms if g == gemm)
        cases.append((f"{model} {gemm} T={T}", Case("bf16", topk_m_sizes(T, E, k, seed=T), N, K)))
    cases.append(("G=16 M=1024 N=2048 K=5120", Case("bf16", [1024] * 16, 2048, 5120)))
    start, rows = time.time(), []
    for label, case in cases:
        for name in ("heuristic", *configs.PREFILL_CANDIDATES):
            if time.time() - start > budget:
                print(json.dumps(dict(skipped=f"{label} {name}")))
                continue
            tile = None if name == "heuristic" else configs.prefill_candidate(name, torch.bfloat16)
            with configs.override(tile) if tile else contextlib.nullcontext():
                try:
                    rows += _measure(case, label, tile=name)
                except Exception as e:  # a tile past the shared memory: say so, go on
                    print(json.dumps(dict(label=label, tile=name, error=str(e)[:200])))
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=pathlib.Path)
    p.add_argument("--budget", type=float, default=380.0, help="seconds")
    p.add_argument("--tiles", action="store_true",
                   help="the near-parity points under each prefill candidate tile instead")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = tiles(args.budget) if args.tiles else sweep(args.budget)
    name = "probe_prefill_tiles_vs_torch.json" if args.tiles else "probe_prefill_vs_torch.json"
    (args.out / name).write_text(json.dumps(dict(meta=metadata(), rows=rows), indent=1))


if __name__ == "__main__":
    main()
