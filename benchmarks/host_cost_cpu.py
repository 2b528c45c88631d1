"""Host cost of one MoE block on the CPU, through the torch reference path, not the GPU
launchers (the GPU's host cost is the host_cost benchmark suite): the patched transformers
block's eager call time over transformers' own block, and what one layer forward dispatches.

For each supported model_type, a tiny random model (models.TINY, float32, one thread); its first
MoE block is called as [1, T, D] for T = 1 and 64, transformers' block (a copy, same weights)
and the patched one interleaved, min over rounds of the mean of ``calls`` calls. Both run their
torch code on the CPU, so this is the Python and dispatch cost a call adds around the arithmetic.

Per layer forward (shufflemoe.MoE of that block, T = 1 and 64), a TorchDispatchMode counts:
aten ops (what eager dispatches: the op references inline), device kernels among them (ops that
are neither views nor allocations: each would launch a kernel on a GPU), and the GPU path's
launches (impl="triton", kernels in the interpreter: Triton launches + kernels of the torch glue).

    PYTHONPATH=src python benchmarks/host_cost_cpu.py [--quick] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import collections
import copy
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

if __name__ == "__main__":
    os.environ.setdefault("TRITON_INTERPRET", "1")  # the launch count runs the kernels on the CPU

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes  # noqa: E402

from shufflemoe.bench.suites.host_cost import first_block  # noqa: E402
from shufflemoe.integrations.transformers import block_layer, patch  # noqa: E402
from shufflemoe.integrations.transformers.models import TINY, build_model, tiny_config  # noqa: E402
from shufflemoe.ops import use_impl  # noqa: E402

TOKENS = (1, 64)
TARGET_T1 = 1.0  # the patched block's eager call at T = 1: at most this times transformers'
# aten ops that launch no kernel: views, metadata and allocation
_NO_KERNEL = {"view", "_unsafe_view", "t", "transpose", "slice", "select", "unsqueeze", "squeeze",
              "expand", "as_strided", "reshape", "permute", "split", "split_with_sizes", "unbind",
              "alias", "detach", "empty", "empty_like", "empty_strided", "lift_fresh"}


class OpCounter(TorchDispatchMode):
    """Counts every aten op dispatched inside the block, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.ops.values())

    @property
    def kernels(self) -> int:
        return sum(n for op, n in self.ops.items() if op not in _NO_KERNEL)


@contextmanager
def triton_launches():
    """Counts Triton kernel launches (compiled or interpreted) inside the block: yields a list
    whose length is the count."""
    import triton.runtime.interpreter as interp
    import triton.runtime.jit as jit

    launched: list = []
    patched = [(cls, cls.run) for cls in (jit.JITFunction, interp.InterpretedFunction)]

    def counting(run):
        def wrapped(self, *args, **kwargs):
            launched.append(getattr(self, "__name__", "kernel"))
            with _disable_current_modes():  # the interpreter's own torch calls are not glue
                return run(self, *args, **kwargs)
        return wrapped

    for cls, run in patched:
        cls.run = counting(run)
    try:
        yield launched
    finally:
        for cls, run in patched:
            cls.run = run


def count_layer(layer, T: int) -> dict:
    """aten ops and kernels of one eager forward (references), and the GPU path's launches."""
    x = torch.randn(T, layer.config.hidden_size, generator=torch.Generator().manual_seed(T))
    x = x.to(layer.config.dtype)
    with torch.no_grad():
        layer(x)  # warm (first-call work is not per call)
        with OpCounter() as ref:
            layer(x)
        row = dict(aten_ops=ref.total, kernels=ref.kernels)
        if os.environ.get("TRITON_INTERPRET") == "1":
            with use_impl("triton"):
                layer(x)
                with triton_launches() as launched, OpCounter() as glue:
                    layer(x)
            row.update(gpu_path_launches=len(launched) + glue.kernels,
                       gpu_path_triton=len(launched), gpu_path_aten_kernels=glue.kernels)
    return row


def time_blocks(hf_block, our_block, x, calls: int, rounds: int) -> tuple[float, float]:
    """(transformers us, ours us) per call: CPU time of this thread (time spent descheduled by
    other load is not counted), min over rounds of the mean of ``calls`` calls, the two
    interleaved."""
    best = [float("inf"), float("inf")]
    with torch.no_grad():
        for block in (hf_block, our_block):
            for _ in range(20):
                block(x)
        for _ in range(rounds):
            for i, block in enumerate((hf_block, our_block)):
                start = time.thread_time()
                for _ in range(calls):
                    block(x)
                best[i] = min(best[i], (time.thread_time() - start) / calls * 1e6)
    return best[0], best[1]


def measure(model_types=tuple(TINY), calls: int = 100, rounds: int = 15) -> list[dict]:
    rows = []
    for model_type in model_types:
        model = build_model(tiny_config(model_type), torch.float32)
        hf = copy.deepcopy(first_block(model))
        patch(model, graph_buckets=None)
        ours = first_block(model)
        layer = block_layer(ours)
        for T in TOKENS:
            x = torch.randn(1, T, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
            hf_us, our_us = time_blocks(hf, ours, x, calls, rounds)
            rows.append(dict(model_type=model_type, tokens=T, transformers_us=round(hf_us, 1),
                             shufflemoe_us=round(our_us, 1), ratio=round(our_us / hf_us, 3),
                             **count_layer(layer, T)))
    return rows


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True,
                          cwd=Path(__file__).parent).stdout.strip()


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def stamp() -> dict:
    import transformers

    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no", "--", "src", "benchmarks"))
    return dict(cpu=_cpu_model(), threads=torch.get_num_threads(), torch=torch.__version__,
                triton=triton_version, transformers=transformers.__version__,
                commit=_git("rev-parse", "--short", "HEAD") + ("+dirty" if dirty else ""),
                date=datetime.date.today().isoformat(), python=platform.python_version())


def to_markdown(result: dict) -> str:
    s = result["stamp"]
    lines = [
        "# Host cost of one MoE block (CPU, eager, float32; the torch reference path, not the GPU launchers)",
        "",
        f"{s['cpu']}, {s['threads']} thread; torch {s['torch']}, triton {s['triton']}, "
        f"transformers {s['transformers']}; commit {s['commit']}, {s['date']}.",
        "",
        "Tiny random models (`models.TINY`, hidden 64), first MoE block, input [1, T, 64]. "
        "Time: CPU time of the calling thread, min over rounds of the mean of 100 calls, "
        "transformers' block and the patched one interleaved. Counts are per `shufflemoe.MoE` forward: aten ops as eager dispatches "
        "them (op references inline), kernels = those that are not views or allocations, GPU "
        "path = Triton launches + glue kernels with `impl=\"triton\"`. Target at T = 1: "
        f"ratio <= {TARGET_T1}.",
        "",
        "| model type | T | transformers (us) | shufflemoe (us) | ratio | aten ops | kernels | "
        "GPU path launches (Triton + glue) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        gpu = (f"{r['gpu_path_launches']} ({r['gpu_path_triton']} + {r['gpu_path_aten_kernels']})"
               if "gpu_path_launches" in r else "n/a")
        lines.append(f"| {r['model_type']} | {r['tokens']} | {r['transformers_us']} | "
                     f"{r['shufflemoe_us']} | {r['ratio']} | {r['aten_ops']} | {r['kernels']} | "
                     f"{gpu} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer calls (a smoke run)")
    ap.add_argument("--out", type=Path, help="write host_cost_cpu.json and host_cost_cpu.md here")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows = measure(calls=20 if args.quick else 100, rounds=2 if args.quick else 15)
    result = dict(stamp=stamp(), rows=rows)
    md = to_markdown(result)
    print(md)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "host_cost_cpu.json").write_text(json.dumps(result, indent=1) + "\n")
        (args.out / "host_cost_cpu.md").write_text(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
