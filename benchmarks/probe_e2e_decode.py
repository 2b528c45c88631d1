"""Where a whole-model decode step's GPU time goes: the e2e_hf suite's models (real widths,
reduced depth) decoding at batch 1 and 64 from one captured CUDA graph per step (the suite's
step_graph rows), transformers' default experts against the patched model. One replay profiled
with CUPTI (torch.profiler): kernels grouped by name with their summed time, beside the step's
time and its floor (e2e_hf.decode_bytes over the read ceiling measured now).

    PYTHONPATH=src python benchmarks/probe_e2e_decode.py [scout] [qwen3] [--batches 1,64] [--ops]

--ops: also one eager step of each, profiled with the CPU ops and their input shapes (which aten op
launched the longest kernels).
"""

from __future__ import annotations

import collections
import statistics
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from shufflemoe.bench.ceilings import measure_ceilings
from shufflemoe.bench.suites import e2e_hf, e2e_paths
from shufflemoe.integrations.transformers import patch, unpatch
from shufflemoe.integrations.transformers.models import build_model

STEPS = 20  # a timed sample's steps (5 samples, the median)
TOP = 14


def _kernels(dec: e2e_paths.Decoder) -> list:
    """The kernels of one profiled step (after a warm-up step)."""
    dec.advance()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        dec.advance()
        torch.cuda.synchronize()
    return [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def _table(kernels: list) -> None:
    by_name: dict[str, list[float]] = collections.defaultdict(list)
    for e in kernels:
        by_name[e.name[:70]].append(e.time_range.end - e.time_range.start)
    busy = sum(sum(v) for v in by_name.values())
    print(f"   GPU busy {busy / 1e3:.3f} ms over {len(kernels)} kernels")
    for name, durs in sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:TOP]:
        print(f"   {sum(durs) / 1e3:7.3f} ms  {len(durs):4d} x {statistics.mean(durs):8.1f} us  {name}")


def _ops(dec: e2e_paths.Decoder) -> None:
    acts = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with profile(activities=acts, record_shapes=True) as prof:
        dec.advance()
        torch.cuda.synchronize()
    print(prof.key_averages(group_by_input_shape=True).table(
        sort_by="self_cuda_time_total", row_limit=TOP, max_name_column_width=40,
        max_shapes_column_width=90), flush=True)


def main(models: list[str], batches: tuple[int, ...], ops: bool) -> None:
    ceil = measure_ceilings()
    print(f"{torch.cuda.get_device_name()}, read {ceil.read_gbps:.0f} GB/s", flush=True)
    for shape in e2e_hf.SHAPES:
        if not any(m in shape.name for m in models):
            continue
        model = build_model(shape.config(False), torch.bfloat16, "cuda")
        for batch in batches:
            floor = e2e_hf.decode_bytes(model, batch) / ceil.read_gbps / 1e6
            for label in ("transformers (default)", "shufflemoe"):
                if label == "shufflemoe":
                    patch(model, graph_buckets=None)
                else:
                    unpatch(model)
                with torch.no_grad():  # the suite's step-graph timing, then one step profiled
                    ms = e2e_paths.time_decode(model, batch, STEPS, 5, graph=True)[0]["ms"]
                    kernels = _kernels(e2e_paths.Decoder(model, batch, 4, graph=True))
                print(f"\n== {shape.name} decode b{batch} step graph, {label}: {ms:.3f} ms a step, "
                      f"floor {floor:.3f} ms ({ms / floor:.2f}x)", flush=True)
                _table(kernels)
                if ops:
                    with torch.no_grad():
                        _ops(e2e_paths.Decoder(model, batch, 8, graph=False))
                torch.cuda.empty_cache()
        unpatch(model)
        del model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    args = sys.argv[1:]
    batches = (1, 64)
    if "--batches" in args:
        i = args.index("--batches")
        batches = tuple(int(b) for b in args[i + 1].split(","))
        del args[i:i + 2]
    ops = "--ops" in args
    if ops:
        args.remove("--ops")
    main(args or ["scout", "qwen3"], batches, ops)
    sys.exit(0)
