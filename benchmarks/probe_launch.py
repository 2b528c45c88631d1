"""What an eager call of the bare layer costs the host on the GPU machine, with launch plans
(ops/_launch.py) and without, for real-width presets (bf16 and fp8 rowwise) at T = 1, 8, 64:
host us per call (the mean of CALLS back-to-back calls, median of ROUNDS), whether a plan was
made, and whether planned outputs equal unplanned ones bit for bit (two layers of one config
interleaved, three inputs each); then a cProfile of a planned call and a few torch ops' costs.

    PYTHONPATH=src python benchmarks/probe_launch.py
"""

from __future__ import annotations

import cProfile
import pstats
import statistics
import time

import torch
import torch.nn.functional as F

from shufflemoe import MoE
from shufflemoe import layer as moe_layer
from shufflemoe.presets import preset

CALLS, ROUNDS = 200, 9


def host_us(fn) -> float:
    samples = []
    for _ in range(ROUNDS):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(CALLS):
            fn()
        samples.append((time.perf_counter() - t0) / CALLS * 1e6)
    torch.cuda.synchronize()
    return statistics.median(samples)


def planned(layer, on: bool) -> None:
    """Launch plans on or off for this layer (the module bound is read per new token count)."""
    moe_layer.PLAN_MAX_TOKENS, moe_layer.PLAN_MAX_LARGE = (256, 16) if on else (0, 0)
    layer.__dict__["_hot_parts"] = None


def main() -> None:
    dev = "cuda"
    torch.manual_seed(0)
    for name in ("qwen3-30b-a3b", "llama4-scout", "mixtral-8x7b", "gpt-oss-120b"):
        for quant in ("none", "fp8_rowwise"):
            cfg = preset(name, dtype=torch.bfloat16, quantization=quant)
            a, b = MoE(cfg, device=dev), MoE(cfg, device=dev)
            for T in (1, 8, 64):
                xs = [torch.randn(T, cfg.hidden_size, device=dev, dtype=cfg.dtype) for _ in range(3)]
                with torch.no_grad():
                    planned(a, False), planned(b, False)
                    want = [layer(x) for x in xs for layer in (a, b)]
                    off = host_us(lambda: a(xs[0]))
                    planned(a, True), planned(b, True)
                    got = [layer(x) for x in xs for layer in (a, b)]  # records, then replays
                    got = [layer(x) for x in xs for layer in (a, b)]
                    same = all(torch.equal(g, w) for g, w in zip(got, want))
                    made = [k[0] for k, v in a._hot().plans.items() if v is not None]
                    on = host_us(lambda: a(xs[0]))
                print(f"{name} {quant} T={T}: host us eager {off:.1f} -> planned {on:.1f} "
                      f"({off / on:.2f}x); plan made for T {made}; bitwise equal {same}")
            del a, b
    name = "qwen3-30b-a3b"
    cfg = preset(name, dtype=torch.bfloat16)
    layer = MoE(cfg, device=dev)
    x = torch.randn(1, cfg.hidden_size, device=dev, dtype=cfg.dtype)
    with torch.no_grad():
        layer(x)
        layer(x)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(CALLS):
            layer(x)
        prof.disable()
        torch.cuda.synchronize()
    print(f"== {name} T=1 planned: cProfile of {CALLS} calls")
    pstats.Stats(prof).sort_stats("tottime").print_stats(18)
    x = torch.randn(1, 2048, device=dev, dtype=torch.bfloat16)
    w = torch.randn(128, 2048, device=dev, dtype=torch.bfloat16)
    for label, fn in (
        ("torch.empty_like(x)", lambda: torch.empty_like(x)),
        ("torch.zeros_like(x)", lambda: torch.zeros_like(x)),
        ("F.linear(x, w) [1,2048]x[128,2048]", lambda: F.linear(x, w)),
        ("x.clone()", lambda: x.clone()),
        ("is_current_stream_capturing", torch.cuda.is_current_stream_capturing),
    ):
        print(f"{label}: {host_us(fn):.2f} us")


if __name__ == "__main__":
    main()
