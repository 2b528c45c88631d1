"""Does asking L2 for down's weights while gate_up runs shorten a fused decode call? One GPU call:
for each preset, format and T, the layer in CUDA graphs (weights and inputs rotating, as the
layer suite does) with the table's plan, the same plan with DecodeConfig.prefetch (a prefetch a line,
or one bulk prefetch a program), and bulk with PDL forced on (prefetch needs down's programs resident while gate_up runs); the variants
interleaved over ROUNDS rounds, each plan's result checked against float64 once.

    PYTHONPATH=src python benchmarks/probe_prefetch.py --out $OUT [--budget 540]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import torch

from shufflemoe import preset
from shufflemoe.bench.report import metadata
from shufflemoe.ops.moe_decode import configs

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from probe_combine import _check, _graph_us, _layers  # noqa: E402

PRESETS = {"scout-tp8": preset("llama4-scout", tp=8),
           "maverick-tp8": preset("llama4-maverick", tp=8),
           "qwen3-30b-a3b": preset("qwen3-30b-a3b"),
           "mixtral-tp2": preset("mixtral-8x7b", tp=2)}
VARIANTS = {"table": {}, "lines": dict(prefetch=True), "bulk": dict(prefetch="bulk"),
            "pdl+bulk": dict(pdl=True, prefetch="bulk")}
ROUNDS = 2
N_SETS = 8


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=pathlib.Path)
    p.add_argument("--budget", type=float, default=540.0)
    p.add_argument("--formats", nargs="+", default=["none", "fp8_rowwise"])
    p.add_argument("--presets", nargs="+", default=list(PRESETS))
    p.add_argument("--tokens", nargs="+", type=int, default=[1, 2, 4, 8, 64])
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    deadline = time.time() + args.budget
    meta, rows = metadata(), []
    # T first: the small-T rows matter most and are the ones the budget must not cut
    for T, name, fmt in [(t, n, f) for t in args.tokens for n in args.presets
                         for f in args.formats]:
        if time.time() > deadline:
            rows.append(dict(preset=name, format=fmt, T=T, note="skipped: time budget"))
            continue
        cfg = PRESETS[name].replace(quantization=fmt)
        layers = _layers(cfg, "cuda", False)
        xs = [torch.randn(T, cfg.hidden_size, device="cuda", dtype=cfg.dtype)
              for _ in range(N_SETS)]

        def plan_of(changes, fmt=fmt):
            def plan(key):
                base = (configs._w8a16(*key) if fmt == "fp8_w8a16" else configs._choose(*key))
                return base.with_(**changes)
            return plan

        row = dict(preset=name, format=fmt, T=T, us={v: [] for v in VARIANTS}, check={})
        with torch.no_grad():
            for v, changes in VARIANTS.items():
                with configs.override(plan_of(changes)):
                    row["check"][v] = _check(layers[0], xs[0])
            for _ in range(ROUNDS):
                for v, changes in VARIANTS.items():
                    with configs.override(plan_of(changes)):
                        row["us"][v].append(_graph_us(layers, xs, False)["us"])
        best = {v: min(u) for v, u in row["us"].items()}
        row["speedup"] = {v: round(best["table"] / b, 3) for v, b in best.items()}
        rows.append(row)
        print(json.dumps(row), flush=True)
        del layers
        torch.cuda.empty_cache()
    meta["seconds"] = round(time.time() - deadline + args.budget)
    (args.out / "probe_prefetch.json").write_text(json.dumps(dict(meta=meta, rows=rows),
                                                             indent=1))


if __name__ == "__main__":
    main()
