"""Whether two source trees differ in e2e_hf's torch.compile decode row (one GPU call, ~3-4 min)

    PYTHONPATH=src python benchmarks/probe_compile_ab.py --out $OUT --trees src,.ab_old/src [--rounds 2]

e2e_hf's "shufflemoe + torch.compile" row (Llama 4 Scout shape, 4 layers, decode b1) is bound by
the host and noisy: 2.98 ms [2.42, 4.31] at 9ae6b19 against 4.00 [3.56, 4.18] at 3a17f93 (H200),
with transformers' compiled row at 4.58 and 4.77 in the same runs. This probe runs each tree in
its own process (PYTHONPATH=<tree>), in turns ABAB... (--rounds each); a process builds the model,
compiles transformers' model and the patched twin as e2e_hf does (torch.compile defaults) and
times both in turns (REPEATS samples of STEPS steps), so every process reports its own ratio.
It also reports Dynamo's counters (graph breaks, recompiles, graphs) and the host time of one
compiled call. Writes $OUT/probe_compile_ab.json and a CPU-time profile of 16 steps of ours per
tree ($OUT/probe_compile_ab_<n>.txt).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

STEPS, REPEATS = 16, 9
WARMUP, HOST_CALLS = 3, 20


def child(shape_name: str, out: pathlib.Path, tag: str) -> dict:
    import torch
    from torch._dynamo.utils import counters
    from torch.profiler import ProfilerActivity, profile

    from shufflemoe.bench.report import metadata
    from shufflemoe.bench.suites import e2e_paths
    from shufflemoe.bench.suites.e2e_hf import SHAPES, _twin
    from shufflemoe.integrations.transformers.models import build_model

    shape = next(s for s in SHAPES if s.name == shape_name)
    with torch.no_grad():
        base = build_model(shape.config(False), torch.bfloat16, "cuda")
        models = {"transformers": base, "shufflemoe": _twin(base, "auto")}
        decs, host = {}, {}
        for name, m in models.items():
            call = torch.compile(m)
            steps = WARMUP + REPEATS * STEPS + HOST_CALLS + STEPS  # the last STEPS: ours profiled
            decs[name] = e2e_paths.Decoder(m, 1, steps, graph=False, step_call=call)
            for _ in range(WARMUP):
                decs[name].advance()
        dyn = {k: dict(v) for k, v in counters.items() if k in ("graph_break", "recompiles", "stats")}
        samples = {name: [] for name in models}
        for _ in range(REPEATS):
            for name, dec in decs.items():
                samples[name].append(e2e_paths.elapsed_ms(lambda: [dec.advance() for _ in range(STEPS)]) / STEPS)
        for name, dec in decs.items():
            torch.cuda.synchronize()
            t = []
            for _ in range(HOST_CALLS):
                t0 = time.perf_counter()
                dec.advance()
                t.append((time.perf_counter() - t0) * 1e6)
            torch.cuda.synchronize()
            host[name] = statistics.median(t)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(STEPS):
                decs["shufflemoe"].advance()
            torch.cuda.synchronize()
        (out / f"probe_compile_ab_{tag}.txt").write_text(
            prof.key_averages().table(sort_by="cpu_time_total", row_limit=40, max_name_column_width=80))
    med = {n: statistics.median(s) for n, s in samples.items()}
    ratios = [a / b for a, b in zip(samples["transformers"], samples["shufflemoe"])]
    return dict(meta=metadata(), samples_ms=samples, median_ms=med, host_us_per_call=host,
                ratio_median=statistics.median(ratios), ratio_spread=(min(ratios), max(ratios)), dynamo=dyn)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=pathlib.Path)
    p.add_argument("--trees", default="src,.ab_old/src")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--shape", default="llama4-scout")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.child:
        print("RESULT " + json.dumps(child(args.shape, args.out, args.child), default=str))
        return
    runs = []
    for r in range(args.rounds):
        for i, tree in enumerate(args.trees.split(",")):
            tag = f"{i}_{r}"
            env = dict(os.environ, PYTHONPATH=tree)
            proc = subprocess.run([sys.executable, __file__, "--out", str(args.out), "--shape", args.shape,
                                   "--child", tag], env=env, capture_output=True, text=True)
            line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
            res = json.loads(line[0][7:]) if line else dict(error=proc.stderr[-3000:])
            res.update(tree=tree, round=r)
            runs.append(res)
            print(tree, r, {k: res.get(k) for k in ("median_ms", "host_us_per_call", "ratio_median",
                                                    "ratio_spread", "dynamo", "error")}, flush=True)
    (args.out / "probe_compile_ab.json").write_text(json.dumps(dict(shape=args.shape, runs=runs), indent=1))


if __name__ == "__main__":
    main()
