"""GPU timing the way METHOD.md asks: CUDA events, warm-up, median of many runs, a CUDA graph to
remove launch gaps where the code allows it, and rotating input sets so data does not sit in L2."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class Timing:
    median_us: float
    p20_us: float
    p80_us: float
    graph: bool  # timed as replays of a captured CUDA graph

    def as_dict(self) -> dict:
        return dict(median_us=round(self.median_us, 3), p20_us=round(self.p20_us, 3),
                    p80_us=round(self.p80_us, 3), graph=self.graph)


def rotations(bytes_per_set: int, l2_bytes: int = 50 << 20, cap: int = 32) -> int:
    """Input sets to rotate through so that one pass reads over 2x the L2 (50 MB on an H100)."""
    return max(1, min(cap, -(-2 * l2_bytes // max(bytes_per_set, 1))))


def time_fn(run: Callable[[int], object], n_sets: int, *, graph: bool = True, reps: int = 40,
            warmup: int = 3) -> Timing:
    """Median time of one ``run(i)`` (i = input set). With graph=True, one graph runs all n_sets
    calls back to back and each replay is timed; without, each call is timed on its own."""
    torch.cuda.synchronize()
    for _ in range(warmup):
        for i in range(n_sets):
            run(i)
    torch.cuda.synchronize()
    samples: list[float] = []
    if graph:
        g = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            with torch.cuda.graph(g):
                for i in range(n_sets):
                    run(i)
        torch.cuda.current_stream().wait_stream(side)
        g.replay()
        torch.cuda.synchronize()
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            g.replay()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) * 1e3 / n_sets)
        del g
    else:
        for r in range(reps):
            i = r % n_sets
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run(i)
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) * 1e3)
    q = statistics.quantiles(samples, n=5) if len(samples) > 1 else samples * 4
    return Timing(statistics.median(samples), q[0], q[3], graph)


@dataclass(frozen=True)
class Ceilings:
    copy_gbps: float  # device-to-device copy, bytes read + written
    bf16_tflops: float  # 8192^3 bf16 matmul (cuBLAS)
    fp8_tflops: float  # 8192^3 fp8 rowwise torch._scaled_mm, 0 when unavailable

    def as_dict(self) -> dict:
        return dict(copy_gbps=round(self.copy_gbps, 1), bf16_tflops=round(self.bf16_tflops, 1),
                    fp8_tflops=round(self.fp8_tflops, 1))


def measure_ceilings(n: int = 8192) -> Ceilings:
    """The device's copy bandwidth and dense GEMM rates, measured now (same run as the results).
    The GEMMs run first and the copy is the best of three medians: an idle GPU needs a moment to
    raise its clocks, and a copy timed at once read up to 12% low on an H100."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    t = time_fn(lambda i: a @ b.t(), 1, graph=False, reps=10)
    bf16 = 2 * n**3 / (t.median_us * 1e-6) / 1e12
    fp8 = 0.0
    try:
        a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
        sa = torch.ones(n, 1, device="cuda")
        sb = torch.ones(1, n, device="cuda")
        t = time_fn(lambda i: torch._scaled_mm(a8, b8.t(), scale_a=sa, scale_b=sb,
                                               out_dtype=torch.bfloat16), 1, graph=False, reps=10)
        fp8 = 2 * n**3 / (t.median_us * 1e-6) / 1e12
    except (RuntimeError, AttributeError):
        pass
    del a, b
    src = torch.randn(1 << 28, device="cuda", dtype=torch.bfloat16)  # 512 MiB
    dst = torch.empty_like(src)
    best = min(time_fn(lambda i: dst.copy_(src), 1, graph=False, reps=30).median_us for _ in range(3))
    copy = 2 * src.numel() * src.element_size() / (best * 1e-6) / 1e9
    return Ceilings(copy, bf16, fp8)
