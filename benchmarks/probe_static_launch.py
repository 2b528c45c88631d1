"""torch.compile host time of the patched block with Inductor's static launcher for user-defined
Triton kernels off / on (torch._inductor.config.static_launch_user_defined_triton_kernels; off
by default in torch 2.11): our kernels reach Inductor as user-defined Triton kernels (wrap_triton).

For each host_cost shape (the first MoE block of a one-layer transformers model at real width,
patched with graph_buckets=None), T = 1: two copies of the block compiled in one process, one
with the setting off and one on (Inductor reads it when it generates code, at the first call),
and transformers' block compiled for reference. Host us per call: ROUNDS samples of CALLS
back-to-back calls from a drained queue, the three interleaved within each round; the outputs
of the two copies compared bit for bit. Writes $OUT/probe_static_launch.json.

    PYTHONPATH=src python benchmarks/probe_static_launch.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics

import torch
import torch._inductor.config as inductor_config

from shufflemoe.bench.report import metadata
from shufflemoe.bench.suites.host_cost import SHAPES, _sample, config, first_block
from shufflemoe.integrations.transformers import patch
from shufflemoe.integrations.transformers.models import build_model

CALLS, ROUNDS = 30, 15


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/probe_static_launch")
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for shape in SHAPES:
        cfg = config(shape)
        x = torch.randn(1, 1, shape.fields["hidden_size"], device="cuda", dtype=torch.bfloat16)
        fns, outs = {}, {}
        with torch.no_grad():
            for name, static in (("ours, static launch off", False), ("ours, static launch on", True)):
                torch.manual_seed(0)
                block = first_block(patch(build_model(cfg, torch.bfloat16, "cuda"), graph_buckets=None))
                compiled = torch.compile(block)
                with inductor_config.patch(static_launch_user_defined_triton_kernels=static):
                    outs[name] = compiled(x)
                fns[name] = lambda c=compiled: c(x)
            peer = torch.compile(first_block(build_model(cfg, torch.bfloat16, "cuda",
                                                         experts_implementation=shape.experts[0])))
            peer(x)
            fns["transformers + torch.compile"] = lambda: peer(x)
            for fn in fns.values():
                for _ in range(3):
                    fn()
            same = all(torch.equal(a if isinstance(a, torch.Tensor) else a[0],
                                   b if isinstance(b, torch.Tensor) else b[0])
                       for a, b in [tuple(outs.values())])
            samples = {name: [] for name in fns}
            for _ in range(ROUNDS):
                for name, fn in fns.items():
                    samples[name].append(_sample(fn, CALLS)[0])
        row = dict(model=shape.name, T=1, bitwise_equal=same)
        for name, s in samples.items():
            q = statistics.quantiles(s, n=5)
            row[name] = dict(us=round(statistics.median(s), 1), p20=round(q[0], 1), p80=round(q[3], 1))
        rows.append(row)
        print(json.dumps(row), flush=True)
        del fns, outs, peer, block, compiled
        torch._dynamo.reset()
        torch.cuda.empty_cache()
    (out / "probe_static_launch.json").write_text(json.dumps(dict(meta=metadata(), rows=rows), indent=1))


if __name__ == "__main__":
    main()
