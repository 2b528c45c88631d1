"""Why the torch.compile'd layer costs more per call than the eager one (one GPU call, ~2 min).

    PYTHONPATH=src python benchmarks/probe_compiled.py --out $OUT

The layer suite at 4a20cbf: Llama 4 Scout TP8 bf16 at T = 1, launched from Python, eager
98.1 us a call, torch.compile (default mode) 288.9 us; the suite compiles ``_call(layer, x)``
once and rotates layer copies through it. For Scout TP8 and Qwen3-30B-A3B at T = 1: host time
a call (back-to-back calls, then one sync) of the eager layer, of torch.compile over one layer
(a closure) and over rotated copies passed as an argument (as the suite), Dynamo's counters
(graph breaks, recompiles), cProfile and torch.profiler tables of each, and the same for the
compiled stock-torch pipeline (the suite's peer). Writes $OUT/probe_compiled.json, the tables to
$OUT/probe_compiled.txt and the Inductor wrappers to $OUT/wrapper_*.py.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pathlib
import pstats
import shutil
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from decode_check import inputs, layers_for  # noqa: E402
from tune_decode import PRESETS  # noqa: E402

from shufflemoe.bench.peers import torch_pipeline  # noqa: E402
from shufflemoe.bench.report import metadata  # noqa: E402

CALLS = 200
COPIES = 4


def host_us(fn, n: int) -> float:
    """Median over 5 rounds of n back-to-back calls (one sync a round), us a call."""
    fn(0)
    torch.cuda.synchronize()
    rounds = []
    for _ in range(5):
        t0 = time.perf_counter()
        for i in range(n):
            fn(i)
        torch.cuda.synchronize()
        rounds.append((time.perf_counter() - t0) * 1e6 / n)
    return sorted(rounds)[2]


def call(layer, x):
    return layer(x)


def profiled(fn, label: str, text: list[str], row: dict) -> None:
    """cProfile of CALLS calls (top functions by own and by cumulative time), then
    torch.profiler of 20 (host ops by own time, GPU ops a call)."""
    fn(0)
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for i in range(CALLS):
        fn(i)
    prof.disable()
    torch.cuda.synchronize()
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf)
    stats.sort_stats("tottime").print_stats(30)
    stats.sort_stats("cumulative").print_stats(40)
    text.append(f"== {label}: cProfile of {CALLS} calls\n{buf.getvalue()}")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as tp:
        for i in range(20):
            fn(i)
        torch.cuda.synchronize()
    kernels = sum(e.count for e in tp.key_averages()
                  if e.device_type == torch.autograd.DeviceType.CUDA)
    row[f"{label} GPU ops a call"] = kernels / 20
    text.append(f"== {label}: torch.profiler of 20 calls, {kernels / 20:.1f} GPU ops a call")
    text.append(tp.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))


def wrapper_sources(out: pathlib.Path, tag: str) -> None:
    """Copy the Inductor wrappers loaded so far (their call() is what runs each call)."""
    from torch._inductor.codecache import PyCodeCache

    for j, mod in enumerate(list(getattr(PyCodeCache, "modules", []))):
        path = getattr(mod, "__file__", None)
        if path and "def call(" in pathlib.Path(path).read_text():
            shutil.copy(path, out / f"wrapper_{tag}_{j}.py")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=pathlib.Path)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    text: list[str] = []
    rows = []
    for name in ("scout-tp8", "qwen3-30b-a3b"):
        cfg = PRESETS[name]
        layers = layers_for(cfg, COPIES, "cuda")
        xs = inputs(cfg, 1, "cuda", COPIES)
        row = dict(preset=name, T=1)
        eager = lambda i: layers[i % COPIES](xs[i % COPIES])  # noqa: E731
        with torch.no_grad():
            row["eager_us"] = host_us(eager, CALLS)
            profiled(eager, f"{name} eager", text, row)
            for label, make, fn_of in (
                    ("compiled one layer", lambda: torch.compile(lambda x: layers[0](x)),
                     lambda c: (lambda i: c(xs[i % COPIES]))),
                    ("compiled rotated", lambda: torch.compile(call),
                     lambda c: (lambda i: c(layers[i % COPIES], xs[i % COPIES]))),
                    ("compiled torch pipeline rotated", lambda: torch.compile(torch_pipeline),
                     lambda c: (lambda i: c(layers[i % COPIES], xs[i % COPIES])))):
                torch._dynamo.reset()
                torch._dynamo.utils.counters.clear()
                fn = fn_of(make())
                row[f"{label} us"] = host_us(fn, CALLS)
                row[f"{label} counters"] = {k: dict(v) for k, v in
                                            torch._dynamo.utils.counters.items()}
                profiled(fn, f"{name} {label}", text, row)
                wrapper_sources(args.out, f"{name}_{label.replace(' ', '_')}")
        print(json.dumps({k: v for k, v in row.items() if "counters" not in k}), flush=True)
        rows.append(row)
        del layers
        torch.cuda.empty_cache()
    (args.out / "probe_compiled.txt").write_text("\n".join(text))
    (args.out / "probe_compiled.json").write_text(json.dumps(
        dict(meta=dict(metadata(), device=torch.cuda.get_device_name()), rows=rows), indent=1,
        default=str))


if __name__ == "__main__":
    main()
