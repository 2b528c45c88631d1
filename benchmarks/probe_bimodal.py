"""Maverick TP8 at T = 64 in fp8_w8a16 and fp8_block reads 235 or 255 us a call in the layer
suite (p20 / p80 of 40 replays, both modes in two runs), fp8 rowwise at the same shape within
1.5 us. Each sample there is one replay of a graph over every input set, so a mode is a whole
replay. This probe times each replay (CUDA events) and says whether the slow mode follows time
(a run of slow replays: clocks, power), alternates, or follows one input set or weight copy (a
graph per set: the same set always slow). One GPU call, ~1 min; writes $OUT/probe_bimodal.json.

    PYTHONPATH=src:benchmarks python benchmarks/probe_bimodal.py --out $OUT [--reps 200]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics

import torch

from probe_combine import N_SETS, _check, _layers
from shufflemoe import preset
from shufflemoe.bench.report import metadata
from shufflemoe.bench.timing import _elapsed_us

FORMATS = ("fp8_w8a16", "fp8_block", "fp8_rowwise")


def _graph(run, sets: list[int]) -> torch.cuda.CUDAGraph:
    """One CUDA graph of run(i) for i in sets, captured on a side stream after a warm-up."""
    for i in sets:
        run(i)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.cuda.graph(g):
        for i in sets:
            run(i)
    torch.cuda.current_stream().wait_stream(side)
    g.replay()
    torch.cuda.synchronize()
    return g


def _summary(us: list[float]) -> dict:
    """Median, the split at the middle of min and max, the share of replays above it, and the
    mean length of runs of replays on one side (about 2 when the sides alternate at random)."""
    cut = (min(us) + max(us)) / 2
    slow = [u > cut for u in us]
    runs = 1 + sum(a != b for a, b in zip(slow, slow[1:]))
    return dict(median=statistics.median(us), min=min(us), max=max(us), cut=cut,
                slow_share=sum(slow) / len(us), mean_run=len(us) / runs)


def _one(quant: str, reps: int, T: int) -> dict:
    cfg = preset("llama4-maverick", tp=8).replace(quantization=quant)
    layers = _layers(cfg, "cuda", False)
    xs = [torch.randn(T, cfg.hidden_size, device="cuda", dtype=cfg.dtype) for _ in range(N_SETS)]
    run = lambda i: layers[i % len(layers)](xs[i])  # noqa: E731
    row = dict(quant=quant, T=T, copies=len(layers), sets=N_SETS)
    with torch.no_grad():
        row["check"] = _check(layers[0], xs[0])
        g = _graph(run, list(range(N_SETS)))
        us = [_elapsed_us(g.replay) / N_SETS for _ in range(reps)]
        row["all_sets"] = dict(_summary(us), replays=[round(u, 2) for u in us])
        del g
        per_set = []
        for i in range(N_SETS):  # a graph per set: does one set (routing, copy) hold the mode?
            g = _graph(run, [i])
            us = [_elapsed_us(g.replay) for _ in range(max(reps // 4, 20))]
            per_set.append(dict(_summary(us), set=i, copy=i % len(layers)))
            del g
        row["per_set"] = per_set
    return row


def measure(out: pathlib.Path, reps: int, T: int) -> None:
    rows = []
    for quant in FORMATS:
        row = _one(quant, reps, T)
        torch.cuda.empty_cache()
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "all_sets"}
                         | {"all_sets": {k: v for k, v in row["all_sets"].items()
                                         if k != "replays"}}), flush=True)
    (out / "probe_bimodal.json").write_text(json.dumps(dict(meta=metadata(), rows=rows), indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=pathlib.Path, required=True)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    measure(args.out, args.reps, args.tokens)


if __name__ == "__main__":
    main()
