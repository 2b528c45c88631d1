"""Does the shared expert hide beside the routed experts at prefill? (one GPU call, ~1 min)

    PYTHONPATH=src python benchmarks/probe_prefill_overlap.py --out $OUT

At T = 16384 the layer runs the routed experts, then the shared expert adds into their output,
on one stream (probe_timeline.py --prefill, H100 at 9502b68: Maverick TP8 bf16 2614 us with the
shared expert, 1862 without; its cuBLAS GEMMs run near the dense rate while Maverick's routed
GEMMs stream weights at ~2.5 TB/s with the tensor cores half idle). Here the same layer with
``shared_stream_max_tokens`` past T, so that a CUDA graph runs the shared expert on its side
stream from the start (writing out) and the routed combine adds into out after the join. For
Llama 4 Scout and Maverick TP8, bf16 and fp8 rowwise: the layer in CUDA graphs (us, median of
replays over two input sets, both layers on the same weights, interleaved rounds), and each
output against the float64 reference (rel L2). Writes $OUT/probe_prefill_overlap.json.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics

import torch

from shufflemoe import MoE, naive_moe, preset
from shufflemoe.bench.report import metadata
from shufflemoe.bench.timing import time_fn

T = 16384
ROUNDS = 3
PRESETS = {"scout-tp8": preset("llama4-scout", tp=8), "maverick-tp8": preset("llama4-maverick", tp=8)}


def weights(layer: MoE) -> dict:
    return {n: t for n, t in layer.named_parameters()}


def rel_l2(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).norm() / want.norm())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=pathlib.Path)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, base in PRESETS.items():
        for fmt in ("none", "fp8_rowwise"):
            torch.manual_seed(0)
            cfg = base.replace(quantization=fmt)
            one = MoE(cfg, device="cuda")
            side = MoE.from_weights(cfg.replace(shared_stream_max_tokens=1 << 20), **weights(one))
            xs = [torch.randn(T, cfg.hidden_size, device="cuda", dtype=cfg.dtype) for _ in range(2)]
            row = dict(preset=name, format=fmt, T=T)
            with torch.no_grad():
                times: dict = {"one stream": [], "side stream": []}
                for _ in range(ROUNDS):
                    for label, layer in (("one stream", one), ("side stream", side)):
                        t = time_fn(lambda i: layer(xs[i]), len(xs), graph=True, reps=5, warmup=1)
                        times[label].append(t.median_us)
                for label, layer in (("one stream", one), ("side stream", side)):
                    row[f"{label} us"] = statistics.median(times[label])
                    row[f"{label} all us"] = times[label]
                want = naive_moe(one, xs[0])
                for label, layer in (("one stream", one), ("side stream", side)):
                    g = torch.cuda.CUDAGraph()
                    out = torch.empty_like(xs[0])
                    s = torch.cuda.Stream()
                    s.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(s):
                        layer(xs[0])  # warm-up outside the capture
                        with torch.cuda.graph(g):
                            out = layer(xs[0])
                    torch.cuda.current_stream().wait_stream(s)
                    g.replay()
                    torch.cuda.synchronize()
                    row[f"{label} rel_l2"] = rel_l2(out, want)
                    del g
            row["x"] = row["one stream us"] / row["side stream us"]
            print(json.dumps({k: v for k, v in row.items() if "all" not in k}), flush=True)
            rows.append(row)
            del one, side
            torch.cuda.empty_cache()
    (args.out / "probe_prefill_overlap.json").write_text(json.dumps(
        dict(meta=dict(metadata(), device=torch.cuda.get_device_name()), rows=rows), indent=1, default=str))


if __name__ == "__main__":
    main()
