"""Where the host time of one eager MoE block call goes, on the GPU machine: cProfile of CALLS
calls of the patched first block (host_cost's one-layer models at real widths), top functions by
own time and by cumulative time, for the shapes named (default: all of host_cost.SHAPES) at
T = 1 (or --tokens T), eager (graph_buckets=None) and replaying per-layer graphs (the default;
none past their 256-token buckets). Each also prints the host time of a call (no sync, the
queue drained before) and its wall time to a sync.

    PYTHONPATH=src python benchmarks/profile_host.py [--tokens 2048] [qwen3-30b-a3b llama4-scout ...]

With --layer, the names are presets (NAME or NAME:TP, e.g. deepseek-v3:8; a suffix +fp32 takes
float32 router logits, as transformers computes DeepSeek-V3's: deepseek-v3:8+fp32) and the MoE
layer itself is profiled eagerly, without a transformers block around it; each also lists the
CUDA kernels and aten ops of one call (torch.profiler).
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time

import torch

from shufflemoe import MoE, preset
from shufflemoe.bench.suites import host_cost
from shufflemoe.ops import _launch
from shufflemoe.integrations.transformers import patch
from shufflemoe.integrations.transformers.models import build_model

CALLS = 300


def _profile(fn, calls: int, label: str) -> None:
    """Host and wall medians of 20 calls, then cProfile of ``calls`` calls, printed."""
    with torch.no_grad():
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
        host, wall = [], []
        for _ in range(20):
            t0 = time.perf_counter()
            fn()
            host.append(time.perf_counter() - t0)
            torch.cuda.synchronize()
            wall.append(time.perf_counter() - t0)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(calls):
            fn()
        prof.disable()
        torch.cuda.synchronize()
    print(f"== {label}: host {1e6 * sorted(host)[10]:.0f} us a call, wall "
          f"{1e6 * sorted(wall)[10]:.0f} us (medians of 20); cProfile of {calls} calls")
    stats = pstats.Stats(prof)
    stats.sort_stats("tottime").print_stats(22)
    stats.sort_stats("cumulative").print_stats(30)


def layers(names: list[str], T: int) -> None:
    """The MoE layers of the presets named (NAME or NAME:TP, +fp32: float32 logits), eager."""
    for name in names:
        spec, fp32, _ = name.partition("+fp32")
        model, _, tp = spec.partition(":")
        cfg = preset(model, tp=int(tp or 1))
        if fp32:
            cfg = cfg.replace(router_logits_dtype=torch.float32)
        layer = MoE(cfg, device="cuda").eval()
        x = torch.randn(T, layer.config.hidden_size, device="cuda", dtype=layer.config.dtype)
        with torch.no_grad():
            for _ in range(3):
                layer(x)
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                    torch.profiler.ProfilerActivity.CUDA]) as prof:
                layer(x)
                torch.cuda.synchronize()
        plans = layer._hot_parts.plans
        print(f"== {name} T={T}: plans {[(k[0], k[1], type(v).__name__) for k, v in plans.items()]}"
              f" (a recording's refusal: {_launch.refusal}); one call's ops and kernels")
        print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=40))
        _profile(lambda: layer(x), CALLS, f"{name} T={T} layer, eager")
        del layer
        torch.cuda.empty_cache()


def main(names: list[str], T: int) -> None:
    calls = CALLS if T <= 64 else 50
    for shape in host_cost.SHAPES:
        if names and shape.name not in names:
            continue
        model = build_model(host_cost.config(shape), torch.bfloat16, "cuda")
        x = torch.randn(1, T, shape.fields["hidden_size"], device="cuda", dtype=torch.bfloat16)
        for mode, buckets in (("eager", None), ("per-layer graphs", "auto"))[:1 if T > 256 else 2]:
            block = host_cost.first_block(patch(model, graph_buckets=buckets))
            _profile(lambda: block(x), calls, f"{shape.name} T={T} {mode}")
        del model, block
        torch.cuda.empty_cache()


if __name__ == "__main__":
    args = sys.argv[1:]
    tokens = 1
    if "--tokens" in args:
        i = args.index("--tokens")
        tokens = int(args[i + 1])
        del args[i:i + 2]
    if "--layer" in args:
        args.remove("--layer")
        layers(args, tokens)
    else:
        main(args, tokens)
