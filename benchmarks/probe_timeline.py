"""Where the GPU time of a decode step goes: the layer in a CUDA graph (graphed, as users run it),
replays profiled with CUPTI (torch.profiler): every kernel's duration and the idle gap before it,
for the layer suite's decode presets, bf16 and fp8 rowwise, T = 1 and 8; with a shared expert,
also with it through cuBLAS (MoE._fused_shared off) on its side stream. Each replay gets a new
input (new routing); the floor is the activated bytes (planner.must_read_bytes) at the measured
read bandwidth. Negative gaps: the kernel overlapped the one before (two streams).

    PYTHONPATH=src python benchmarks/probe_timeline.py > $OUT/timeline.txt
    PYTHONPATH=src python benchmarks/probe_timeline.py mxfp4 fp8_w8a16   (other formats)
    PYTHONPATH=src python benchmarks/probe_timeline.py --tokens 64,128 fp8_rowwise
    PYTHONPATH=src python benchmarks/probe_timeline.py --prefill none fp8_rowwise
    PYTHONPATH=src python benchmarks/probe_timeline.py --presets scout,scout-tp8 --tokens 64 none
    PYTHONPATH=src python benchmarks/probe_timeline.py --batch-invariant --tokens 1 none

--presets: the decode presets to run (default: the three below; "scout" is Llama 4 Scout at full
width, as the e2e_hf suite's model has it).

--batch-invariant: the layers in batch-invariant mode (MoEConfig(batch_invariant=True)).

--prefill: Llama 4 Scout and Maverick TP8 at T = 16384 (the layer suite's prefill targets),
each also without its shared expert (a layer of the same shapes with none): how much of the
shared expert's time its side stream hides beside the routed experts' kernels.
"""

from __future__ import annotations

import statistics
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from shufflemoe import MoE, graphed, preset
from shufflemoe import layer as moe_layer
from shufflemoe.bench.ceilings import measure_ceilings
from shufflemoe.layer import SHARED_FUSED_MAX_TOKENS
from shufflemoe.planner import must_read_bytes

PRESETS = {
    "scout-tp8": preset("llama4-scout", tp=8),
    "qwen3-30b-a3b": preset("qwen3-30b-a3b"),
    "mixtral-tp2": preset("mixtral-8x7b", tp=2),
}
EXTRA_PRESETS = {"scout": preset("llama4-scout")}
PREFILL_PRESETS = {
    "scout-tp8": preset("llama4-scout", tp=8),
    "maverick-tp8": preset("llama4-maverick", tp=8),
}
PREFILL_T = 16384
REPLAYS = 9


def short(name: str) -> str:
    for key in ("gate_up", "down", "index_shuffle", "route", "silu_mul", "gemv", "gemm", "Memset",
                "Memcpy", "copy", "fill", "splitK", "sigmoid"):
        if key.lower() in name.lower():
            return f"{key}:{name[:48]}"
    return name[:60]


def timeline(decode, xs) -> tuple[list[list[tuple[str, float, float]]], list[float]]:
    """Per replay: [(kernel, gap before it us, duration us)] between the graph's copy in and copy
    out (excluded: graph._copy kernels), and the replay's span (first kernel start to last
    kernel end)."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for x in xs:
            decode(x)
            torch.cuda.synchronize()
    kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda e: e.time_range.start)
    groups, group = [], []  # one per replay: between its copy in and its copy out
    for e in kernels:
        if e.name == "_copy":
            if group:
                groups.append(group)
                group = []
            continue
        group.append(e)
    if group:
        groups.append(group)
    runs, spans = [], []
    for g in groups:
        rows, end = [], g[0].time_range.start
        for e in g:
            start, stop = e.time_range.start, e.time_range.end
            rows.append((short(e.name), start - end, stop - start))
            end = max(end, e.time_range.end)
        runs.append(rows)
        spans.append(end - g[0].time_range.start)
    return runs, spans


def graphed_timeline(layer, T: int, xs) -> tuple[list, list[float]]:
    """timeline() of the layer graphed for T tokens (shufflemoe.graphed), after one warm pass."""
    with torch.no_grad():
        step = graphed(layer, (T,))
        for x in xs:
            step(x)
        torch.cuda.synchronize()
        return timeline(step, xs)


def main(formats: list[str], tokens: tuple[int, ...] = (1, 8),
         presets: tuple[str, ...] = tuple(PRESETS), batch_invariant: bool = False) -> None:
    ceil = measure_ceilings()
    print(f"{torch.cuda.get_device_name()}, read {ceil.read_gbps:.0f} GB/s", flush=True)
    for name in presets:
        base = {**PRESETS, **EXTRA_PRESETS}[name]
        for fmt in formats:
            cfg = base.replace(quantization=fmt, batch_invariant=batch_invariant)
            layer = MoE(cfg, device="cuda")
            for T in tokens:
                g = torch.Generator(device="cuda").manual_seed(T)
                xs = [torch.randn(T, cfg.hidden_size, device="cuda", generator=g).to(cfg.dtype)
                      for _ in range(REPLAYS)]
                active = statistics.mean(int((layer.route(x).counts > 0).sum()) for x in xs)
                floor = must_read_bytes(cfg, active) / ceil.read_gbps / 1e3
                variants = [("default", SHARED_FUSED_MAX_TOKENS)]
                if cfg.shared_intermediate_size:
                    variants.append(("shared expert through cuBLAS", 0))
                for label, fused_max in variants:
                    moe_layer.SHARED_FUSED_MAX_TOKENS = fused_max
                    layer.__dict__["_hot_parts"] = None
                    runs, spans = graphed_timeline(layer, T, xs)
                    print(f"\n== {name} {fmt} T={T} {label}: span median "
                          f"{statistics.median(spans):.1f} us [{min(spans):.1f}, "
                          f"{max(spans):.1f}], floor {floor:.1f} us ({active:.1f} experts)",
                          flush=True)
                    for kname, gap, dur in runs[len(runs) // 2]:
                        print(f"   gap {gap:6.1f}  dur {dur:6.1f}  {kname}")
                moe_layer.SHARED_FUSED_MAX_TOKENS = SHARED_FUSED_MAX_TOKENS
                layer.__dict__["_hot_parts"] = None
            del layer
            torch.cuda.empty_cache()


def prefill(formats: list[str]) -> None:
    ceil = measure_ceilings()
    print(f"{torch.cuda.get_device_name()}, read {ceil.read_gbps:.0f} GB/s, "
          f"bf16 {ceil.bf16_tflops:.0f} TFLOP/s", flush=True)
    T = PREFILL_T
    for name, base in PREFILL_PRESETS.items():
        for fmt in formats:
            for label, cfg in (("default", base.replace(quantization=fmt)),
                               ("no shared expert", base.replace(quantization=fmt, shared_intermediate_size=0))):
                layer = MoE(cfg, device="cuda")
                g = torch.Generator(device="cuda").manual_seed(T)
                xs = [torch.randn(T, cfg.hidden_size, device="cuda", generator=g).to(cfg.dtype)
                      for _ in range(4)]
                runs, spans = graphed_timeline(layer, T, xs)
                print(f"\n== {name} {fmt} T={T} {label}: span median {statistics.median(spans):.1f} us "
                      f"[{min(spans):.1f}, {max(spans):.1f}]", flush=True)
                for kname, gap, dur in runs[len(runs) // 2]:
                    print(f"   gap {gap:6.1f}  dur {dur:7.1f}  {kname}")
                del layer, xs
                torch.cuda.empty_cache()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--prefill"]:
        prefill(sys.argv[2:] or ["none", "fp8_rowwise"])
    else:
        args = sys.argv[1:]
        tokens = (1, 8)
        if "--tokens" in args:  # e.g. --tokens 64,128
            i = args.index("--tokens")
            tokens = tuple(int(t) for t in args[i + 1].split(","))
            del args[i:i + 2]
        presets = tuple(PRESETS)
        if "--presets" in args:
            i = args.index("--presets")
            presets = tuple(args[i + 1].split(","))
            del args[i:i + 2]
        bi = "--batch-invariant" in args
        if bi:
            args.remove("--batch-invariant")
        main(args or ["none", "fp8_rowwise"], tokens, presets, bi)
    sys.exit(0)
