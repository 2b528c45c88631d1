"""Command line: ``shufflemoe demo | bench | plan | info``."""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time

import torch

from . import EXPERTS, MoE, MoEConfig, naive_moe, preset
from .planner import (HARDWARE, Layout, expert_bytes, fixed_bytes, layer_cost, layouts, plan,
                      recommend)
from .testing import compare, tolerance_for, tolerance_key

# The demo's two layers: real shapes on a GPU, the same structure scaled down on a CPU so the
# whole demo (every strategy, checked in float64) takes well under a minute on two cores.
DEMO_LAYERS = {
    "llama4-scout (TP8 shard)": (preset("llama4-scout", tp=8),
                                 dict(hidden_size=1024, intermediate_size=256, shared_intermediate_size=256)),
    "qwen3-30b-a3b": (preset("qwen3-30b-a3b"), dict(hidden_size=512, intermediate_size=192)),
}
DEMO_TOKENS = 64


def _time_us(fn, device: torch.device, graph_ok: bool) -> float:
    if device.type == "cuda":
        from .bench.timing import time_fn

        return time_fn(lambda i: fn(), 1, graph=graph_ok, reps=20).median_us
    fn()
    samples = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(samples)


def _weight_bytes(cfg: MoEConfig, strategy: str, active: int) -> int:
    experts_read = cfg.num_experts if strategy in ("padded", "all_experts") else active
    return experts_read * expert_bytes(cfg) + fixed_bytes(cfg)


def demo(device: torch.device) -> int:
    """Run every strategy on two model-shaped layers, check each against float64, print a table."""
    print(f"shufflemoe demo on {device} ({'real widths' if device.type == 'cuda' else 'CPU: widths scaled down'}), "
          f"T = {DEMO_TOKENS} tokens, dtype bfloat16\n")
    failures = 0
    header = f"{'layer':26} {'strategy':12} {'time (us)':>10} {'weights read (MB)':>18} {'err / bound':>12}  status"
    print(header)
    print("-" * len(header))
    for name, (cfg, cpu_sizes) in DEMO_LAYERS.items():
        if device.type != "cuda":
            cfg = cfg.replace(**cpu_sizes)
        torch.manual_seed(0)
        layer = MoE(cfg, device=device)
        x = torch.randn(DEMO_TOKENS, cfg.hidden_size, device=device, dtype=cfg.dtype)
        routing = layer.route(x)
        ref, mag = naive_moe(layer, x, routing, with_magnitude=True)
        active = int((routing.counts > 0).sum())
        bound = tolerance_for(tolerance_key(cfg)).mag
        for strategy in EXPERTS.names():
            layer.set_experts(strategy)
            y = layer(x)
            c = compare(y, ref, tolerance_key(cfg), magnitude=mag)
            ratio = ((y.double() - ref).abs() / mag).max().item() / bound
            us = _time_us(lambda: layer(x), device, EXPERTS.get(strategy).graph_safe)
            failures += not c.ok
            print(f"{name:26} {strategy:12} {us:10.1f} {_weight_bytes(cfg, strategy, active) / 1e6:18.2f} "
                  f"{ratio:12.3f}  {'ok' if c.ok else 'FAIL: ' + c.why}")
        print()
    print("err / bound: the largest error relative to the float64 reference, as a fraction of the "
          "bfloat16 tolerance (shufflemoe.testing); ok when every element is within it.")
    return 1 if failures else 0


def _layout(cfg: MoEConfig, args: argparse.Namespace) -> Layout:
    """The layout --tp/--ep/--ep-mode/--dedup ask for, if the library can build it."""
    if args.ep > 1:
        layout = Layout(f"ep_{args.ep_mode}", args.ep, args.tp, (("dedup", args.dedup),))
    else:
        layout = Layout("tp" if args.tp > 1 else "local", 1, args.tp)
    buildable = layouts(cfg, args.ep * args.tp)
    if layout not in buildable:
        raise SystemExit(f"shufflemoe plan: {layout.describe()} cannot be built for {args.model}; "
                         f"buildable on {args.ep * args.tp} GPUs: "
                         f"{', '.join(l.describe() for l in buildable) or 'none'}")
    return layout


def plan_cmd(args: argparse.Namespace) -> int:
    cfg = preset(args.model, quantization="fp8_rowwise" if args.fp8 else "none")
    hw = dataclasses.replace(HARDWARE[args.hw], gpus_per_node=args.gpus_per_node)
    layout = _layout(cfg, args)
    print(f"{args.model}: E={cfg.num_experts} k={cfg.top_k} D={cfg.hidden_size} I={cfg.intermediate_size} "
          f"shared={cfg.shared_intermediate_size}, {args.tokens} tokens per tp group, "
          f"{layout.describe()}, {'fp8' if args.fp8 else 'bf16'} on {hw.name}\n")
    print(f"{'strategy':12} {'rows':>9} {'weights MB':>11} {'act. MB':>9} {'GFLOP':>9} {'comm MB':>9} "
          f"{'floor us':>9} {'bound':>8} {'syncs':>6}")
    for c in plan(cfg, args.tokens, hw, layout=layout):
        print(f"{c.strategy:12} {c.rows:9.0f} {c.weight_bytes / 1e6:11.1f} {c.activation_bytes / 1e6:9.1f} "
              f"{c.flops / 1e9:9.2f} {c.comm_bytes / 1e6:9.2f} {c.floor * 1e6:9.1f} {c.bound:>8} {c.host_syncs:6}")
    if args.gpus:
        print(f"\nlayouts on {args.gpus} GPUs ({args.gpus_per_node} per node) for a batch of "
              f"{args.tokens} tokens, shuffled strategy; skew: the busiest EP rank's worst case")
        print(f"{'layout':34} {'kind':7} {'comm MB':>9} {'comm us':>9} {'compute us':>11} "
              f"{'total us':>9} {'skew us':>9}")
        ranked = recommend(cfg, args.tokens, args.gpus, hw)
        for lay, c in ranked:
            worst = layer_cost(cfg, c.tokens, "shuffled", hw, layout=lay, bound=True)
            print(f"{lay.describe():34} {lay.kind:7} {c.comm_bytes / 1e6:9.2f} {c.t_comm * 1e6:9.1f} "
                  f"{(c.serial - c.t_comm) * 1e6:11.1f} {c.serial * 1e6:9.1f} {worst.serial * 1e6:9.1f}")
        if ranked:
            best = ranked[0][0]
            print(f"\nrecommended: {best.kind} ({best.describe()})")
    return 0


def info() -> int:
    from .ops import interpreting, triton_available

    print(f"shufflemoe {__import__('shufflemoe').__version__}")
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}")
    if triton_available():
        import triton

        print(f"triton {triton.__version__}{' (interpreter)' if interpreting() else ''}")
    else:
        print("triton: not installed (torch references only)")
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        print(f"device: {p.name}, {p.multi_processor_count} SMs, {p.total_memory / 2**30:.0f} GiB, "
              f"CUDA {torch.version.cuda}")
    else:
        print("device: cpu (no CUDA GPU: ops run their torch references)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="shufflemoe", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="run every strategy on two model-shaped layers and check them")
    d.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    d.add_argument("--hf", action="store_true", help="patch tiny HF transformers models and check parity")
    b = sub.add_parser("bench", help="run benchmark suites on the GPU")
    b.add_argument("--suite", action="append", help="suite name (repeatable); default: all")
    b.add_argument("--out", default="benchmarks/results")
    b.add_argument("--quick", action="store_true", help="fewer shapes and repetitions")
    p = sub.add_parser("plan", help="bytes, FLOPs, communication and roofline floor per strategy")
    p.add_argument("--model", default="llama4-scout")
    p.add_argument("--tokens", type=int, default=64, help="tokens per tp group (--gpus: the batch)")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--ep", type=int, default=1)
    p.add_argument("--ep-mode", choices=("alltoall", "allgather"), default="alltoall")
    p.add_argument("--dedup", action="store_true", help="EP x TP: the spec's communication dedup")
    p.add_argument("--gpus", type=int, default=0, help="rank every buildable layout on this many GPUs")
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--hw", choices=sorted(HARDWARE), default="h100")
    p.add_argument("--fp8", action="store_true")
    sub.add_parser("info", help="versions and device")
    args = parser.parse_args(argv)
    if args.command == "demo":
        if args.hf:
            from .integrations.transformers.demo import run_demo

            return run_demo()
        return demo(torch.device(args.device))
    if args.command == "bench":
        from .bench.run import run

        return 1 if run(args.suite, args.out, args.quick) else 0
    if args.command == "plan":
        return plan_cmd(args)
    return info()


if __name__ == "__main__":
    sys.exit(main())
