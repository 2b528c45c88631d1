"""Drive one decode layer for Nsight Compute: where the fused decode path's kernels spend their
cycles (stall reasons, occupancy, memory throughput), kernel by kernel.

    ncu --clock-control none --graph-profiling node -k regex:'^_' --launch-count 14 \
        --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
        --section SchedulerStats --section MemoryWorkloadAnalysis \
        python benchmarks/probe_ncu_decode.py --preset qwen3-30b-a3b --format fp8 --tokens 1

Three eager calls, then the layer captured in a CUDA graph (as the layer suite times it) and
replayed four times. The name filter keeps the Triton kernels (their names start with '_'; the
weights' set-up runs dozens of torch kernels first): at T = 1 four a call (router, route,
gate_up, down), so --launch-count 14 takes three calls and a half. ncu serializes the kernels
(PDL's overlap is gone, each kernel's own cycles remain) and flushes the caches before each.
results/ncu_decode_*_e9f8c0a.txt: its output for Qwen3-30B-A3B and Scout TP8 at T = 1 and
Qwen3 at T = 64; results/probe_timeline_fp8_*.txt has the same kernels' times in flight.
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
