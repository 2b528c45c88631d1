"""Why tune_decode's layer phase and the layer suite disagree (one GPU call): Llama 4 Scout TP8
fp8_w8a16 at T = 8 took 86.6 us in tune_decode's layer phase and 63.7 us in the layer suite
(H100, 4ed1445 / 0ea446d; T = 1 and Qwen3 agree). The same layer, timed the same way
(shufflemoe.bench.timing.time_fn, CUDA graphs over 8 input sets), built by each harness
(the suite: MoE copies and device randn inputs; tune_decode: decode_check.layers_for and its
seeded host inputs), with and without tune_decode's overrides (a Switch equal to the default,
and a tile function returning configs.planned). Writes $OUT/probe_harness.json.

    PYTHONPATH=src python benchmarks/probe_harness.py --out $OUT
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from decode_check import inputs, layers_for, weight_sets  # noqa: E402

from shufflemoe import MoE, preset  # noqa: E402
from shufflemoe.bench.report import metadata  # noqa: E402
from shufflemoe.bench.suites.layer import N_SETS, _copies, expert_bytes, fixed_bytes  # noqa: E402
from shufflemoe.bench.timing import time_fn  # noqa: E402
from shufflemoe.ops.moe_decode import configs  # noqa: E402

CASES = [("llama4-scout", "fp8_w8a16", 8), ("llama4-scout", "fp8_w8a16", 1),
         ("llama4-maverick", "fp8_w8a16", 8), ("llama4-scout", "none", 8),
         ("qwen3-30b-a3b", "fp8_w8a16", 8)]


def suite_harness(cfg, T: int):
    torch.manual_seed(0)
    first = MoE(cfg, device="cuda")
    copies = _copies(first, expert_bytes(first) * cfg.top_k + fixed_bytes(first))
    layers = [first] + [MoE(cfg, device="cuda") for _ in range(copies - 1)]
    xs = [torch.randn(T, cfg.hidden_size, device="cuda", dtype=cfg.dtype) for _ in range(N_SETS)]
    return layers, xs


def tune_harness(cfg, T: int):
    layers = layers_for(cfg, weight_sets(cfg, 1), "cuda")
    return layers, inputs(cfg, T, "cuda", N_SETS)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/probe_harness")
    args = ap.parse_args()
    rows = []
    for name, fmt, T in CASES:
        tp = 1 if name.startswith("qwen3") else 8
        cfg = preset(name, tp=tp).replace(quantization=fmt)
        for harness, build in (("suite", suite_harness), ("tune", tune_harness)):
            layers, xs = build(cfg, T)
            active = sum(int((layers[i % len(layers)].route(x).counts > 0).sum())
                         for i, x in enumerate(xs)) / len(xs)
            for variant in ("none", "switch", "tiles", "switch+tiles", "warmup3"):
                with contextlib.ExitStack() as stack:
                    if "switch" in variant:
                        stack.enter_context(configs.override(configs.Switch()))
                    if "tiles" in variant:
                        stack.enter_context(configs.override(
                            lambda k: configs.planned(k, cfg.quantization)))
                    t = time_fn(lambda i, L=layers, X=xs: L[i % len(L)](X[i]), len(xs),
                                graph=True, reps=30, warmup=3 if variant == "warmup3" else 1)
                row = dict(preset=name, tp=tp, format=fmt, T=T, harness=harness,
                           copies=len(layers), active=active, variant=variant,
                           us=t.median_us)
                rows.append(row)
                print(row, flush=True)
            del layers, xs
            torch.cuda.empty_cache()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "probe_harness.json").write_text(json.dumps(dict(meta=dict(
        metadata(), device=torch.cuda.get_device_name()), rows=rows), indent=1))


if __name__ == "__main__":
    main()
