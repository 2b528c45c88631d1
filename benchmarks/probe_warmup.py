"""Do the first replays of a freshly captured graph run slow, and for how long? probe_bimodal found
the first 16-25 of 200 replays of Maverick TP8 T = 64 (every format) 8-10% slower than the rest,
in one unbroken run: the layer suite times 40 replays right after one, so its medians fall on
either side. This probe idles the GPU (0, 0.5, 2 s), then times 400 replays one by one and says
how many lead above the steady time (the median of the last 200) and how much GPU time they
took, for a short graph (T = 1) and a long one (T = 64). One GPU call, ~1 min; writes
$OUT/probe_warmup.json.

    PYTHONPATH=src:benchmarks python benchmarks/probe_warmup.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import time

import torch

from probe_bimodal import _graph
from probe_combine import N_SETS, _check, _layers
from shufflemoe import preset
from shufflemoe.bench.ceilings import read_clocks
from shufflemoe.bench.report import metadata
from shufflemoe.bench.timing import _elapsed_us

CASES = (("none", "qwen3-30b-a3b", 1, 1), ("none", "llama4-scout", 8, 1),
         ("fp8_rowwise", "llama4-maverick", 8, 64), ("none", "mixtral-8x7b", 2, 8))
IDLE_S = (0.0, 0.5, 2.0)


def _trace(g, n_sets: int, reps: int) -> dict:
    us = [_elapsed_us(g.replay) / n_sets for _ in range(reps)]
    steady = statistics.median(us[reps // 2:])
    slow = 0
    while slow < len(us) and us[slow] > 1.04 * steady:
        slow += 1
    return dict(steady=steady, first=us[0], slow_lead=slow,
                slow_lead_ms=sum(us[:slow]) * n_sets / 1e3,
                median_first_40=statistics.median(us[:40]),
                blocks_of_20=[round(statistics.median(us[i:i + 20]), 2) for i in range(0, reps, 20)])


def _one(quant: str, name: str, tp: int, T: int, reps: int) -> dict:
    cfg = preset(name, tp=tp).replace(quantization=quant)
    layers = _layers(cfg, "cuda", False)
    xs = [torch.randn(T, cfg.hidden_size, device="cuda", dtype=cfg.dtype) for _ in range(N_SETS)]
    run = lambda i: layers[i % len(layers)](xs[i])  # noqa: E731
    row = dict(quant=quant, preset=name, tp=tp, T=T, copies=len(layers))
    with torch.no_grad():
        row["check"] = _check(layers[0], xs[0])
        g = _graph(run, list(range(N_SETS)))
        for idle in IDLE_S:
            time.sleep(idle)
            before = read_clocks()  # the GPU idles through this too
            row[f"idle_{idle}"] = dict(_trace(g, N_SETS, reps), clocks_before=before,
                                       clocks_after=read_clocks())
        del g
    return row


def measure(out: pathlib.Path, reps: int) -> None:
    rows = []
    for case in CASES:
        row = _one(*case, reps)
        torch.cuda.empty_cache()
        rows.append(row)
        print(json.dumps(row), flush=True)
    (out / "probe_warmup.json").write_text(json.dumps(dict(meta=metadata(), rows=rows), indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=pathlib.Path, required=True)
    ap.add_argument("--reps", type=int, default=400)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    measure(args.out, args.reps)


if __name__ == "__main__":
    main()
