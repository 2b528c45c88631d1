"""Probe: batch-invariant router logits (ops/router/kernel.invariant_router_logits) with a
program over a block of experts past PROGRAMS programs (experts_per_program), against one expert
a program (PROGRAMS = infinity) and F.linear, H100, CUDA graphs over 4 rotated inputs. Checks
that every count gives the same bits. Writes $OUT/probe_bi_router.json.
PYTHONPATH=src python benchmarks/probe_bi_router.py"""
import json, os

import torch
import torch.nn.functional as F

from shufflemoe.bench.timing import time_fn
from shufflemoe.ops.router import kernel

SHAPES = {"scout": (16, 5120), "qwen3": (128, 2048), "mixtral": (8, 4096), "gpt-oss": (128, 2880),
          "deepseek": (256, 7168)}
TS = (1, 8, 64, 512, 2048, 8192)
PROGRAMS = (10**9, 256, 512, 1024, 2048, 4096)

rows = []
for name, (E, D) in SHAPES.items():
    ws = [torch.randn(E, D, device="cuda", dtype=torch.bfloat16) / D**0.5 for _ in range(4)]
    for T in TS:
        xs = [torch.randn(T, D, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
        r = dict(model=name, E=E, D=D, T=T)
        r["linear"] = time_fn(lambda i: F.linear(xs[i], ws[i]), 4, graph=True, reps=30).median_us
        first = None
        for p in PROGRAMS:
            kernel.PROGRAMS = p
            n = kernel.experts_per_program(T, E)
            out = kernel.invariant_router_logits(xs[0], ws[0], None)
            if first is None:
                first = out
            assert torch.equal(out, first), (name, T, p)
            t = time_fn(lambda i: kernel.invariant_router_logits(xs[i], ws[i], None), 4,
                        graph=True, reps=30).median_us
            r[f"programs {p} (experts {n})"] = t
        rows.append(r)
        print({k: (round(v, 1) if isinstance(v, float) else v) for k, v in r.items()}, flush=True)
kernel.PROGRAMS = 1024
json.dump(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
               commit=os.environ.get("SHUFFLEMOE_COMMIT", "?"), rows=rows),
          open(os.path.join(os.environ.get("OUT", "/tmp"), "probe_bi_router.json"), "w"), indent=1)
