"""The routing in the router's launch (ops.router_route, MoE._routing at decode T) against the
router's logits and index_shuffle in two launches, on one GPU in one call: the layer's GPU time
in CUDA-graph replays (weights and inputs rotating, as the layer suite does; interleaved A B A)
and the host time of eager calls (back-to-back, no sync), for Llama 4 Scout and Maverick TP8,
Qwen3-30B-A3B, Mixtral TP2 and gpt-oss-120b TP4, bf16 and fp8 rowwise, T = 1, 2, 4, 8. Both
paths must give the same bits; the fused one is checked against float64. A --timeline pass
prints one replay's kernels per preset at T = 1 (start, duration).

    PYTHONPATH=src python benchmarks/probe_router_route.py --out $OUT [--budget 300]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from shufflemoe import graphed, preset
from shufflemoe import layer as moe_layer
from shufflemoe.bench.report import metadata
from shufflemoe.bench.timing import time_fn
from shufflemoe.ops.router import kernel as router_kernel

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from probe_combine import _check, _eager_host_us, _graph_us, _layers  # noqa: E402

PRESETS = {"scout-tp8": preset("llama4-scout", tp=8),
           "maverick-tp8": preset("llama4-maverick", tp=8),
           "qwen3-30b-a3b": preset("qwen3-30b-a3b"),
           "mixtral-tp2": preset("mixtral-8x7b", tp=2),
           "gpt-oss-120b-tp4": preset("gpt-oss-120b", tp=4)}
N_SETS = 8


@contextlib.contextmanager
def separate(layers, on: bool):
    """Inside: the layers route in two launches (as before router_route), their gathered state
    and the shared launch templates dropped on the way in and out."""
    saved = moe_layer.shuffle_args
    if on:
        moe_layer.shuffle_args = lambda cfg: None
    for layer in layers:
        layer.__dict__["_hot_parts"] = None
    moe_layer._TEMPLATES.clear()
    try:
        yield
    finally:
        moe_layer.shuffle_args = saved
        for layer in layers:
            layer.__dict__["_hot_parts"] = None
        moe_layer._TEMPLATES.clear()


def routing_us(layer, xs) -> float:
    """The routing alone (MoE._routing: the router's launch, and index_shuffle's where separate)
    in CUDA-graph replays, median us."""
    hot = layer._hot()
    return round(time_fn(lambda i: layer._routing(hot, xs[i]), len(xs), graph=True,
                         reps=40).median_us, 2)


def timeline(layer, x) -> list[tuple[str, float, float]]:
    decode = graphed(layer, (x.shape[0],))
    for _ in range(3):
        decode(x)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        decode(x)
        torch.cuda.synchronize()
    ev = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                 and "memcpy" not in e.name.lower()), key=lambda e: e.time_range.start)
    t0 = ev[0].time_range.start
    return [(e.name[:40], round(e.time_range.start - t0, 1),
             round(e.time_range.end - e.time_range.start, 1)) for e in ev]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=pathlib.Path)
    p.add_argument("--budget", type=float, default=300.0)
    p.add_argument("--tokens", nargs="+", type=int, default=[1, 2, 4, 8])
    p.add_argument("--presets", nargs="+", default=list(PRESETS))
    p.add_argument("--formats", nargs="+", default=["none", "fp8_rowwise"])
    p.add_argument("--router-warps", type=int, default=0,
                   help="run the router kernel (both paths) with this many warps at every T")
    p.add_argument("--no-host", action="store_true", help="skip the eager host times")
    args = p.parse_args()
    if args.router_warps:
        router_kernel._TILES = {t: (d, args.router_warps) for t, (d, _) in router_kernel._TILES.items()}
    args.out.mkdir(parents=True, exist_ok=True)
    deadline = time.time() + args.budget
    meta = metadata()
    meta["router_tiles"] = {str(t): list(v) for t, v in router_kernel._TILES.items()}
    rows = []
    for name in args.presets:
        for fmt in args.formats:
            cfg = PRESETS[name].replace(quantization=fmt)
            layers = _layers(cfg, "cuda", False)
            for T in args.tokens:
                if time.time() > deadline:
                    rows.append(dict(preset=name, format=fmt, T=T, note="skipped: budget"))
                    continue
                xs = [torch.randn(T, cfg.hidden_size, device="cuda", dtype=cfg.dtype)
                      for _ in range(N_SETS)]
                row = dict(preset=name, format=fmt, T=T)
                with torch.no_grad():
                    with separate(layers, False):
                        row["check"] = _check(layers[0], xs[0])
                        fused_out = layers[0](xs[0])
                        row["fused"] = _graph_us(layers, xs, False)
                    with separate(layers, True):
                        row["same_bits"] = bool(torch.equal(layers[0](xs[0]), fused_out))
                        row["separate"] = _graph_us(layers, xs, False)
                    with separate(layers, False):
                        row["fused_again"] = _graph_us(layers, xs, False)
                        row["routing_fused"] = routing_us(layers[0], xs)
                        if not args.no_host:
                            row["fused_host"] = _eager_host_us(layers, xs, False)
                    with separate(layers, True):
                        row["routing_separate"] = routing_us(layers[0], xs)
                        if not args.no_host:
                            row["separate_host"] = _eager_host_us(layers, xs, False)
                    if T == 1:
                        with separate(layers, False):
                            row["fused_kernels"] = timeline(layers[0], xs[0])
                        with separate(layers, True):
                            row["separate_kernels"] = timeline(layers[0], xs[0])
                fused = min(row["fused"]["us"], row["fused_again"]["us"])
                row["speedup"] = round(row["separate"]["us"] / fused, 3)
                if not args.no_host:
                    row["host_saved_us"] = round(row["separate_host"]["host_us"]
                                                 - row["fused_host"]["host_us"], 1)
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if not k.endswith("kernels")}),
                      flush=True)
            del layers
            torch.cuda.empty_cache()
    meta["seconds"] = round(time.time() - deadline + args.budget)
    (args.out / "probe_router_route.json").write_text(json.dumps(dict(meta=meta, rows=rows),
                                                                 indent=1))


if __name__ == "__main__":
    main()
