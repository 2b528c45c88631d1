"""Command line: ``shufflemoe demo | bench | plan | info``.

Usage errors (a bad option value, an unknown model, a device this machine lacks) print one line
and exit with status 2, as argparse does; a missing optional dependency exits with status 1."""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time

import torch

from . import EXPERTS, MoE, MoEConfig, __version__, naive_moe, preset
from .config import QUANTIZATIONS
from .planner import (HARDWARE, Layout, expert_bytes, fixed_bytes, layer_cost, layouts, plan,
                      recommend)
from .presets import MODELS
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
    """Run every strategy on two model-shaped layers, check each against float64, print a table.
    On the CPU with one torch thread (restored after): the demo's ops are small, and with
    torch's default threads they spin-wait on any busy core (measured on 2 cores with one
    busy: 47-188 s instead of 6-9 s)."""
    if device.type == "cuda":
        return _demo(device)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _demo(device)
    finally:
        torch.set_num_threads(threads)


def _demo(device: torch.device) -> int:
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
        raise ValueError(f"{layout.describe()} cannot be built for {args.model} (ep={args.ep} "
                         f"must divide E={cfg.num_experts}, tp={args.tp} must cut its experts: "
                         f"I={cfg.intermediate_size}, {cfg.quantization}); buildable on "
                         f"{args.ep * args.tp} GPUs: "
                         f"{', '.join(l.describe() for l in buildable) or 'none'}")
    return layout


def plan_cmd(args: argparse.Namespace) -> int:
    quantization = "fp8_rowwise" if args.fp8 else args.quantization
    cfg = preset(args.model, quantization=quantization)
    hw = dataclasses.replace(HARDWARE[args.hw], gpus_per_node=args.gpus_per_node)
    layout = _layout(cfg, args)
    print(f"{args.model}: E={cfg.num_experts} k={cfg.top_k} D={cfg.hidden_size} I={cfg.intermediate_size} "
          f"shared={cfg.shared_intermediate_size}, {args.tokens} tokens per tp group, "
          f"{layout.describe()}, experts {quantization} ({expert_bytes(cfg) / 1e6:.1f} MB each) "
          f"on {hw.name}\n")
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


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def _device(text: str) -> torch.device:
    """A device the demo can run on here: cpu, or cuda[:N] when this machine has that GPU."""
    try:
        device = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a device (cpu, cuda, cuda:N)") from None
    if device.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"{text!r}: the demo runs on cpu or cuda")
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise argparse.ArgumentTypeError(f"{text!r}: no CUDA GPU on this machine (use cpu)")
        if (device.index or 0) >= count:
            raise argparse.ArgumentTypeError(f"{text!r}: this machine has {count} CUDA GPU(s)")
    return device


def _parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The parser, and each command's (whose errors read "shufflemoe COMMAND: error: ...")."""
    parser = argparse.ArgumentParser(
        prog="shufflemoe", description="Mixture-of-Experts inference the MetaShuffling way: a "
        "checked demo, GPU benchmarks and a serving planner.")
    parser.add_argument("--version", action="version", version=f"shufflemoe {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    d = sub.add_parser("demo", help="run every strategy on two model-shaped layers and check them",
                       description="Run every expert strategy on two model-shaped layers, check "
                       "each against a float64 reference and time it.")
    d.add_argument("--device", type=_device, default="cuda" if torch.cuda.is_available() else "cpu",
                   help="cpu, cuda or cuda:N (default: cuda when there is a GPU, else cpu; on the "
                   "CPU the widths are scaled down)")
    d.add_argument("--hf", action="store_true",
                   help="instead: patch tiny HF transformers models on the CPU and check parity "
                   "(needs transformers)")
    b = sub.add_parser("bench", help="run benchmark suites on the GPU",
                       description="Run the GPU benchmark suites; results are stamped JSON and "
                       "markdown.")
    b.add_argument("--suite", action="append", help="suite name (repeatable); default: all")
    b.add_argument("--part", type=int, help="only the suites of this GPU call (see --list)")
    b.add_argument("--out", help="results folder (default: a new folder per run, printed)")
    b.add_argument("--quick", action="store_true", help="fewer shapes and repetitions")
    b.add_argument("--budget-s", type=float, help="seconds the run may take: late cases are skipped")
    b.add_argument("--list", action="store_true", help="name the suites with their estimated times")
    p = sub.add_parser("plan", help="bytes, FLOPs, communication and roofline floor per strategy",
                       description="Bytes, FLOPs, communication and roofline floor of one MoE "
                       "layer per expert strategy, for a model's layer shape.")
    p.add_argument("--model", choices=sorted(MODELS), default="llama4-scout", metavar="MODEL",
                   help=f"layer shape: one of {', '.join(sorted(MODELS))} (default: %(default)s)")
    p.add_argument("--tokens", type=_positive_int, default=64,
                   help="tokens per rank in one step, per tp group with --tp (with --gpus: the "
                   "whole batch) (default: %(default)s)")
    p.add_argument("--tp", type=_positive_int, default=1,
                   help="tensor-parallel ranks; must divide the expert widths (default: 1)")
    p.add_argument("--ep", type=_positive_int, default=1,
                   help="expert-parallel ranks; must divide the number of experts (default: 1)")
    p.add_argument("--ep-mode", choices=("alltoall", "allgather"), default="alltoall",
                   help="expert-parallel dispatch: eager all-to-all or graph-mode all-gather "
                   "(default: %(default)s)")
    p.add_argument("--dedup", action="store_true",
                   help="EP x TP: the spec's communication deduplication across tp ranks")
    p.add_argument("--gpus", type=int, default=0,
                   help="rank every buildable layout on this many GPUs and recommend one")
    p.add_argument("--gpus-per-node", type=_positive_int, default=8,
                   help="GPUs per node: links inside a node are faster (default: %(default)s)")
    p.add_argument("--hw", choices=sorted(HARDWARE), default="h100",
                   help="device whose bandwidth and FLOP/s set the floor (default: %(default)s)")
    p.add_argument("--quantization", choices=QUANTIZATIONS, default="none",
                   help="routed experts' weight format, bytes per weight with its scales "
                   "(default: %(default)s)")
    p.add_argument("--fp8", action="store_true",
                   help="experts in fp8 rowwise (same as --quantization fp8_rowwise)")
    i = sub.add_parser("info", help="versions and device", description="Print versions and the device.")
    return parser, dict(demo=d, bench=b, plan=p, info=i)


def main(argv: list[str] | None = None) -> int:
    parser, commands = _parser()
    args = parser.parse_args(argv)
    if args.command == "demo":
        if args.hf:
            try:
                from .integrations.transformers.demo import run_demo
            except ImportError as e:
                print(f"shufflemoe: error: demo --hf needs transformers ({e}); install it with "
                      f"pip install 'shufflemoe[hf]'", file=sys.stderr)
                return 1
            return run_demo()
        return demo(args.device)
    if args.command == "bench":
        from .bench.run import describe, run

        if args.list:
            print(describe())
            return 0
        return 1 if run(args.suite, args.out, args.quick, args.part, args.budget_s) else 0
    if args.command == "plan":
        try:
            return plan_cmd(args)
        except ValueError as e:  # a layout the model does not divide into
            commands["plan"].error(str(e))
    return info()


if __name__ == "__main__":
    sys.exit(main())
