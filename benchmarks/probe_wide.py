"""The layer at the e2e suite's widths (no tensor parallelism): where a decode step's MoE time goes
(one GPU call, about two minutes).

    PYTHONPATH=src python benchmarks/probe_wide.py --out $OUT

e2e_hf runs Llama 4 Scout and Qwen3-30B-A3B at full width; at batch 64 the step graph is
1.35x its bytes floor (Scout) while the layer suite's TP8 rows are 86-91% of the read ceiling.
For each model's layer at T = 1, 8 and 64, in CUDA graphs over rotated weights: the fused decode
path (where A = T * k allows it) and the unfused one, % of the read ceiling for the bytes the
routing activates, and each kernel's share of one replay (torch.profiler). Writes
$OUT/probe_wide.json.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from decode_check import inputs, layers_for, weight_sets  # noqa: E402

from shufflemoe import preset  # noqa: E402
from shufflemoe.bench.ceilings import measure_ceilings  # noqa: E402
from shufflemoe.bench.report import metadata  # noqa: E402
from shufflemoe.bench.timing import time_fn  # noqa: E402
from shufflemoe.ops.moe_decode import configs  # noqa: E402
from shufflemoe.planner import must_read_bytes  # noqa: E402

MODELS = ("llama4-scout", "qwen3-30b-a3b")
TOKENS = (1, 8, 64)
SETS = 4


def kernels(fn) -> list[dict]:
    """GPU time per kernel name over one CUDA-graph replay of fn (us, largest first)."""
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fn()
        torch.cuda.synchronize()
        with torch.cuda.graph(g):
            fn()
    g.replay()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            g.replay()
        torch.cuda.synchronize()
    out: dict[str, float] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            out[e.name[:90]] = out.get(e.name[:90], 0.0) + e.device_time / 5
    return [dict(kernel=k, us=round(v, 1)) for k, v in sorted(out.items(), key=lambda x: -x[1])]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=pathlib.Path)
    args = p.parse_args()
    read_gbps = measure_ceilings().as_dict()["read_gbps"]
    rows = []
    for model in MODELS:
        cfg = preset(model)
        layers = layers_for(cfg, min(weight_sets(cfg, 1), 2), "cuda")
        for T in TOKENS:
            xs = inputs(cfg, T, "cuda", SETS)
            active = sum(int((layers[i % len(layers)].route(x).counts > 0).sum())
                         for i, x in enumerate(xs)) / len(xs)
            nbytes = must_read_bytes(cfg, active)
            row = dict(model=model, T=T, A=T * cfg.top_k, active_experts=active,
                       must_read_mb=nbytes / 1e6,
                       default_fused=configs.use_fused(T * cfg.top_k, cfg.top_k))
            for label, switch in (("fused", configs.ALWAYS), ("unfused", configs.NEVER)):
                if label == "fused" and T * cfg.top_k > 256:
                    continue
                with configs.override(switch):
                    t = time_fn(lambda i: layers[i % len(layers)](xs[i]), SETS, graph=True,
                                reps=20)
                    row[f"{label}_us"] = t.median_us
                    row[f"{label}_p20_p80"] = [t.p20_us, t.p80_us]
                    row[f"{label}_pct_read"] = 100 * nbytes / t.median_us / 1e3 / read_gbps
                    row[f"{label}_kernels"] = kernels(lambda: layers[0](xs[0]))[:12]
            print(json.dumps({k: v for k, v in row.items() if not k.endswith("kernels")}),
                  flush=True)
            for label in ("fused", "unfused"):
                for k in row.get(f"{label}_kernels", []):
                    print(f"  {label} {k['us']:8.1f} us  {k['kernel']}", flush=True)
            rows.append(row)
        del layers
        torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "probe_wide.json").write_text(json.dumps(
        dict(meta=dict(metadata(), device=torch.cuda.get_device_name()), read_gbps=read_gbps,
             rows=rows), indent=1))


if __name__ == "__main__":
    main()
