"""The shared expert in the routed experts' two fused decode launches (MoE._merged, Switch.
shared_max_tokens) against it in its own two launches beside them (on a side stream in a
graph, in one launch plan eagerly), for presets with a shared expert of the routed width
(Qwen3-Next's is gated), bf16, T = 1, 2, 4, 8: the GPU time of CUDA-graph replays (weights
and inputs rotating, as the layer suite does; interleaved A B A), the host time of eager calls, every output checked against the
float64 reference; and at T = 1 one replay's kernels (start, duration) per variant.

--formats fp8_rowwise fp8_w8a16 mxfp4 --tokens 1 2 --presets scout-tp8 maverick-tp8: the routed
experts stored quantized beside a bf16 shared expert; "separate" is the default Switch without
merging (fp8 rowwise at k = 1: the unfused routed path), "merged" the default with it (fp8
rowwise: the fused path forced, Switch.fp8), "fused separate" (fp8 rowwise) the fused routed
path without merging.

    PYTHONPATH=src python benchmarks/probe_merged.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from shufflemoe import preset
from shufflemoe.bench.report import metadata
from shufflemoe.ops.moe_decode import configs

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from probe_combine import _check, _eager_host_us, _graph_us, _layers  # noqa: E402

PRESETS = {"scout-tp8": preset("llama4-scout", tp=8),
           "maverick-tp8": preset("llama4-maverick", tp=8),
           "deepseek-v3-tp8": preset("deepseek-v3", tp=8),
           "qwen3-next": preset("qwen3-next-80b-a3b")}  # a gated shared expert, k = 10
VARIANTS = {"separate": configs.Switch(shared_max_tokens=0),
            "merged": configs.Switch(shared_max_tokens=16)}
FP8_VARIANTS = {"separate": configs.Switch(shared_max_tokens=0),
                "merged": configs.Switch(shared_max_tokens=16, fp8=True),
                "fused separate": configs.Switch(shared_max_tokens=0, fp8=True)}
N_SETS = 8


def kernels(layer, x) -> list[tuple[str, float, float]]:
    """One graph replay's kernels: (name, start us from the first, duration us)."""
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        layer(x)
        with torch.cuda.graph(g):
            layer(x)
    torch.cuda.current_stream().wait_stream(s)
    g.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        g.replay()
        torch.cuda.synchronize()
    ev = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                key=lambda e: e.time_range.start)
    t0 = ev[0].time_range.start if ev else 0
    return [(e.name[:40], round(e.time_range.start - t0, 1),
             round(e.time_range.end - e.time_range.start, 1)) for e in ev]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, type=pathlib.Path)
    p.add_argument("--budget", type=float, default=300.0)
    p.add_argument("--formats", nargs="+", default=["none"])
    p.add_argument("--tokens", nargs="+", type=int, default=[1, 2, 4, 8])
    p.add_argument("--presets", nargs="+", default=list(PRESETS))
    p.add_argument("--no-host", action="store_true", help="skip the eager host times")
    args = p.parse_args()
    deadline = time.time() + args.budget
    rows = []
    for name, quant in ((n, q) for q in args.formats for n in args.presets):
        cfg = PRESETS[name].replace(quantization=quant)
        variants = FP8_VARIANTS if quant == "fp8_rowwise" else VARIANTS
        layers = _layers(cfg, "cuda", False)
        for T in args.tokens:
            if time.time() > deadline:
                rows.append(dict(preset=name, format=quant, T=T, note="skipped: time budget"))
                continue
            xs = [torch.randn(T, cfg.hidden_size, device="cuda", dtype=cfg.dtype)
                  for _ in range(N_SETS)]
            row = dict(preset=name, format=quant, T=T)
            for label in [*variants, *(f"{v}_again" for v in variants)]:
                with configs.override(variants[label.removesuffix("_again")]):
                    if not label.endswith("again"):
                        row[f"check_{label}"] = _check(layers[0], xs[0])
                    row[label] = _graph_us(layers, xs, False)
            for label in variants:
                with configs.override(variants[label]):
                    if not args.no_host:
                        row[f"{label}_host"] = _eager_host_us(layers, xs, False)
                    if T == 1:
                        row[f"{label}_kernels"] = kernels(layers[0], xs[0])
            sep = min(row["separate"]["us"], row["separate_again"]["us"])
            mer = min(row["merged"]["us"], row["merged_again"]["us"])
            row["separate_over_merged"] = sep / mer
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if not k.endswith("kernels")}),
                  flush=True)
        del layers
        torch.cuda.empty_cache()
    meta = metadata()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "probe_merged.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))


if __name__ == "__main__":
    main()
