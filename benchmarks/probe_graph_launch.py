"""What a CUDA-graph replay costs the host by the graph's contents (issue 21: a per-layer graph
replay's host time). Graphs, each captured on a side stream and replayed from Python:
  - "N adds": N tiny elementwise kernels in a chain (N = 1..12);
  - "router <model>": F.linear(x [1, D], router weight [E, D]) as the layer captures it (cuBLAS
    may pick split-K, two kernels), alone and after 3 adds; and the same logits through
    torch.mm(W, x^T) (a GEMV-shaped call) for comparison.
Host us per replay: median of ROUNDS samples of CALLS back-to-back replays from a drained queue,
every graph interleaved within each round. Writes $OUT/probe_graph_launch.json.

    PYTHONPATH=src python benchmarks/probe_graph_launch.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import time

import torch
import torch.nn.functional as F

from shufflemoe.bench.report import metadata

CALLS, ROUNDS = 30, 20
ROUTERS = {"qwen3-30b-a3b": (2048, 128), "llama4-scout": (5120, 16), "mixtral-8x7b": (4096, 8),
           "gpt-oss-120b": (2880, 128)}


def capture(fn) -> torch.cuda.CUDAGraph:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
        s.synchronize()
        g = torch.cuda.CUDAGraph()
        g.capture_begin()
        fn()
        g.capture_end()
    torch.cuda.current_stream().wait_stream(s)
    return g


def kernels(fn) -> list[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name[:60] for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/probe_graph_launch")
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    a = torch.zeros(64, device="cuda")
    graphs = {}

    def adds(n):
        def fn():
            for _ in range(n):
                a.add_(1)
        return fn

    for n in (1, 2, 3, 4, 5, 6, 7, 8, 9, 12):
        graphs[f"{n} adds"] = adds(n)
    for name, (D, E) in ROUTERS.items():
        x = torch.randn(1, D, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(E, D, device="cuda", dtype=torch.bfloat16)
        graphs[f"router {name}"] = lambda x=x, w=w: F.linear(x, w)
        graphs[f"3 adds + router {name}"] = lambda x=x, w=w: (adds(3)(), F.linear(x, w))
        graphs[f"router {name} as W @ x^T"] = lambda x=x, w=w: torch.mm(w, x.t())
    captured = {name: capture(fn) for name, fn in graphs.items()}
    samples = {name: [] for name in captured}
    for _ in range(ROUNDS):
        for name, g in captured.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(CALLS):
                g.replay()
            samples[name].append((time.perf_counter() - t0) / CALLS * 1e6)
    torch.cuda.synchronize()
    rows = []
    for name, s in samples.items():
        q = statistics.quantiles(s, n=5)
        row = dict(graph=name, us=round(statistics.median(s), 2), p20=round(q[0], 2),
                   p80=round(q[3], 2), kernels=kernels(captured[name].replay))
        rows.append(row)
        print(json.dumps(row), flush=True)
    (out / "probe_graph_launch.json").write_text(json.dumps(dict(meta=metadata(), rows=rows), indent=1))


if __name__ == "__main__":
    main()
