"""Drive one decode layer for Nsight Compute: where the fused decode path's kernels spend their
cycles (stall reasons, occupancy, memory throughput), kernel by kernel.

    ncu --clock-control none --graph-profiling node \
        -k regex:'^(_router_kernel|_route_kernel|_gate_up_kernel|_down_kernel)$' \
        --launch-skip 12 --launch-count 4 --section SpeedOfLight --section WarpStateStats ... \
        python benchmarks/probe_ncu_decode.py --preset qwen3-30b-a3b --format fp8 --tokens 1

Three eager calls (12 launches of the four kernels at T = 1), then the layer captured in a CUDA
graph (as the layer suite times it) and replayed four times: --launch-skip 12 --launch-count 4
profiles the first replay's kernels, one at a time (ncu serializes them: PDL's overlap is gone,
each kernel's own cycles remain). benchmarks/results/probe_timeline_fp8_*.txt has the same
kernels' times in flight.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from decode_check import PRESETS, inputs, layers_for, weight_sets  # noqa: E402
from probe_one_pair import FORMATS  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--preset", required=True, choices=list(PRESETS))
    p.add_argument("--format", required=True, choices=list(FORMATS))
    p.add_argument("--tokens", type=int, default=1)
    args = p.parse_args()
    cfg = PRESETS[args.preset].replace(quantization=FORMATS[args.format])
    layer = layers_for(cfg, weight_sets(cfg, 1), "cuda")[0]
    x = inputs(cfg, args.tokens, "cuda", 1)[0]
    for _ in range(3):
        layer(x)
    torch.cuda.synchronize()
    out = torch.empty_like(x)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side), torch.cuda.graph(g):
        out.copy_(layer(x))
    for _ in range(4):
        g.replay()
    torch.cuda.synchronize()
    print(args.preset, args.format, args.tokens, "done", flush=True)


if __name__ == "__main__":
    main()
