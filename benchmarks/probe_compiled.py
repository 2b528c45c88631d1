"""Why the torch.compile'd layer costs more per call than the eager one (one GPU call, ~2 min).

    PYTHONPATH=src python benchmarks/probe_compiled.py --out $OUT

The layer suite at 4a20cbf: Llama 4 Scout TP8 bf16 at T = 1, launched from Python, eager
98.1 us a call, torch.compile (default mode) 288.9 us; the suite compiles ``_call(layer, x)``
once and rotates layer copies through it. For Scout TP8 and Qwen3-30B-A3B at T = 1: host time
a call (back-to-back calls, then one sync) of the eager layer, of torch.compile over one layer
(a closure) and over rotated copies passed as an argument (as the suite), Dynamo's counters
(graph breaks, recompiles), and torch.profiler's top host ops for the rotated compiled calls.
Writes $OUT/probe_compiled.json and the profiler tables to $OUT/probe_compiled.txt.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from decode_check import inputs, layers_for  # noqa: E402
from tune_decode import PRESETS  # noqa: E402

from shufflemoe.bench.report import metadata  # noqa: E402

CALLS = 200
COPIES = 4


def host_us(fn, n: int) -> float:
    """Median over 5 rounds of n back-to-back calls (one sync a round), us a call."""
    fn(0)
    torch.cuda.synchronize()
    rounds = []
    for _ in range(5):
        t0 = time.perf_counter()
        for i in range(n):
            fn(i)
        torch.cuda.synchronize()
        rounds.append((time.perf_counter() - t0) * 1e6 / n)
    return sorted(rounds)[2]


def call(layer, x):
    return layer(x)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=pathlib.Path)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    text = []
    rows = []
    for name in ("scout-tp8", "qwen3-30b-a3b"):
        cfg = PRESETS[name]
        layers = layers_for(cfg, COPIES, "cuda")
        xs = inputs(cfg, 1, "cuda", COPIES)
        row = dict(preset=name, T=1)
        with torch.no_grad():
            row["eager_us"] = host_us(lambda i: layers[i % COPIES](xs[i % COPIES]), CALLS)
            torch._dynamo.reset()
            torch._dynamo.utils.counters.clear()
            one = torch.compile(lambda x: layers[0](x))
            row["compiled_one_layer_us"] = host_us(lambda i: one(xs[i % COPIES]), CALLS)
            row["counters_one"] = {k: dict(v) for k, v in torch._dynamo.utils.counters.items()}
            torch._dynamo.reset()
            torch._dynamo.utils.counters.clear()
            rot = torch.compile(call)
            row["compiled_rotated_us"] = host_us(lambda i: rot(layers[i % COPIES], xs[i % COPIES]),
                                                 CALLS)
            row["counters_rotated"] = {k: dict(v) for k, v in
                                       torch._dynamo.utils.counters.items()}
            for label, fn in (("eager", lambda i: layers[i % COPIES](xs[i % COPIES])),
                              ("compiled one layer", lambda i: one(xs[i % COPIES])),
                              ("compiled rotated", lambda i: rot(layers[i % COPIES],
                                                                 xs[i % COPIES]))):
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                        torch.profiler.ProfilerActivity.CUDA]) as prof:
                    for i in range(20):
                        fn(i)
                    torch.cuda.synchronize()
                kernels = sum(e.count for e in prof.key_averages()
                              if e.device_type == torch.autograd.DeviceType.CUDA)
                row[f"{label} kernels a call"] = kernels / 20
                text.append(f"== {name} T=1 {label}: 20 calls, {kernels / 20:.1f} GPU ops a call")
                text.append(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
        print(json.dumps(row, default=str), flush=True)
        rows.append(row)
        del layers
        torch.cuda.empty_cache()
    (args.out / "probe_compiled.txt").write_text("\n".join(text))
    (args.out / "probe_compiled.json").write_text(json.dumps(
        dict(meta=dict(metadata(), device=torch.cuda.get_device_name()), rows=rows), indent=1,
        default=str))


if __name__ == "__main__":
    main()
