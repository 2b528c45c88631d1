"""Where a compiled-generate decode step's time goes at batch 1 (one GPU call, ~3 minutes)

    PYTHONPATH=src python benchmarks/probe_generate_host.py --out $OUT [--shape qwen3-30b-a3b]

e2e_hf's compiled generate rows (transformers' generate on a static cache, its default compile
config: the decode step compiled with CUDA graphs) sit further from the whole-step graph for
ours than for transformers' (H200 at 9ae6b19, Qwen3-30B-A3B b1: ours 1.90 ms a step against a
1.41 ms step graph; transformers 2.16 against 1.98-2.14). generate reads a stop flag every
step (a sync), so a step is the host's work before the replay is queued, plus the replay, plus
what follows it. This probe splits that for transformers' grouped_mm and batched_mm experts and
the patched model (e2e_hf's "patch" setup, per-layer graphs on; each on its own copy with the
same weights), in ROUNDS turns of a generate of LONG new tokens:
- step_ms: (time of LONG tokens - SHORT tokens) / (LONG - SHORT), as e2e_hf;
- forward_host_us: host time of the compiled forward call (Dynamo's guards, the CUDA-graph
  tree's replay, its outputs), from a wrapper around generate's compiled call;
- forward_gpu_us: CUDA events recorded just before and after that call (the replay's GPU span
  when the device was idle at the call);
- the rest of the step = step_ms - forward_gpu_us: generate's own work that the device waits on.
Then one profiled generate per path (CPU and CUDA), its per-step op table in
$OUT/probe_generate_host_<path>.txt. Writes $OUT/probe_generate_host.json.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from shufflemoe.bench.report import metadata
from shufflemoe.bench.suites import e2e_paths
from shufflemoe.bench.suites.e2e_hf import SHAPES, _twin
from shufflemoe.integrations.transformers.models import build_model

SHORT, LONG, ROUNDS = 8, 40, 7


class Timed:
    """A model whose compiled call (get_compiled_call) is timed: host us and CUDA events."""

    def __init__(self, model):
        self.model, self.host, self.events = model, [], []
        compiled = model.get_compiled_call

        def get(config):
            fn = compiled(config)

            def call(*args, **kwargs):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                t0 = time.perf_counter()
                out = fn(*args, **kwargs)
                self.host.append((time.perf_counter() - t0) * 1e6)
                end.record()
                self.events.append((start, end))
                return out
            return call
        model.get_compiled_call = get

    def clear(self) -> None:
        self.host.clear()
        self.events.clear()

    def forward_us(self) -> tuple[float, float]:
        """(median host us, median GPU us) of the compiled calls since clear()."""
        torch.cuda.synchronize()
        gpu = [s.elapsed_time(e) * 1e3 for s, e in self.events]
        return statistics.median(self.host), statistics.median(gpu)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=pathlib.Path)
    p.add_argument("--shape", default="qwen3-30b-a3b")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    shape = next(s for s in SHAPES if s.name == args.shape)
    with torch.no_grad():
        base = build_model(shape.config(False), torch.bfloat16, "cuda")
        models = {}
        for experts in ("grouped_mm", "batched_mm"):
            m = build_model(base.config, torch.bfloat16, "cuda")
            m.load_state_dict(base.state_dict())
            m.set_experts_implementation(experts)
            models[f"transformers {experts}"] = m
        models["shufflemoe (patch)"] = _twin(base, "auto")
        del base
        timed = {name: Timed(m) for name, m in models.items()}
        gens = {name: e2e_paths.Generator(m, 1, SHORT, LONG) for name, m in models.items()}
        rows = {name: [] for name in models}
        for _ in range(ROUNDS):
            for name, gen in gens.items():
                timed[name].clear()
                step = gen.sample()
                host, gpu = timed[name].forward_us()
                rows[name].append(dict(step_ms=step, forward_host_us=host, forward_gpu_us=gpu))
                print(name, rows[name][-1], flush=True)
        summary = {}
        for name, samples in rows.items():
            med = {k: statistics.median(s[k] for s in samples) for k in samples[0]}
            med["rest_us"] = med["step_ms"] * 1e3 - med["forward_gpu_us"]
            med["spread_step_ms"] = (min(s["step_ms"] for s in samples), max(s["step_ms"] for s in samples))
            summary[name] = med
            print(name, med, flush=True)
        for name, gen in gens.items():
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                gen.run(LONG)
            table = prof.key_averages().table(sort_by="cpu_time_total", row_limit=40, max_name_column_width=70)
            kernels = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=70)
            slug = name.split(" ")[0] + ("_" + name.split(" ")[1] if name.startswith("transformers") else "")
            (args.out / f"probe_generate_host_{slug}.txt").write_text(
                f"{name}: one generate of {LONG} new tokens, profiled\n\nby CPU time\n{table}\n\nby CUDA time\n{kernels}\n")
    out = dict(meta=metadata(), shape=args.shape, short=SHORT, long=LONG, rounds=ROUNDS, samples=rows,
               summary=summary)
    (args.out / "probe_generate_host.json").write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
