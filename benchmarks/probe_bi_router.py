"""Probe: batch-invariant router logits (ops/router/kernel.invariant_router_logits), a program
over a block of experts (experts_per_program) against one expert a program, then the
batch-invariant layer against the default one. H100, CUDA graphs over rotated inputs/weights.

1. The router alone (4 rotated inputs): one expert a program (PROGRAMS = infinity), programs
   over PROGRAMS in (256, 1024, 4096) with EXPERTS_MAX = E, and the library's rule; every
   variant's logits the same bits as the first's; F.linear for scale.
2. The layer suite's batch-invariant rows (Llama 4 Scout TP8, Qwen3-30B-A3B at T = 1, 64, 2048,
   bf16): the default and the batch-invariant layer, each checked against float64.

Writes $OUT/probe_bi_router.json. PYTHONPATH=src python benchmarks/probe_bi_router.py"""
import json, os

import torch
import torch.nn.functional as F

from shufflemoe import MoE
from shufflemoe.bench.suites import layer as suite
from shufflemoe.bench.timing import time_fn
from shufflemoe.ops.router import kernel

SHAPES = {"scout": (16, 5120), "qwen3": (128, 2048), "mixtral": (8, 4096), "gpt-oss": (128, 2880),
          "deepseek": (256, 7168)}
TS = (1, 8, 64, 512, 2048, 8192)
RULE = (kernel.PROGRAMS, kernel.EXPERTS_MAX)

router_rows = []
for name, (E, D) in SHAPES.items():
    ws = [torch.randn(E, D, device="cuda", dtype=torch.bfloat16) / D**0.5 for _ in range(4)]
    for T in TS:
        xs = [torch.randn(T, D, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
        r = dict(model=name, E=E, D=D, T=T)
        r["linear"] = time_fn(lambda i: F.linear(xs[i], ws[i]), 4, graph=True, reps=30).median_us
        first = None
        for label, (programs, most) in {"one expert a program": (10**9, E), "programs 256": (256, E),
                                        "programs 1024": (1024, E), "programs 4096": (4096, E),
                                        "rule": RULE}.items():
            kernel.PROGRAMS, kernel.EXPERTS_MAX = programs, most
            out = kernel.invariant_router_logits(xs[0], ws[0], None)
            first = out if first is None else first
            assert torch.equal(out, first), (name, T, label)
            t = time_fn(lambda i: kernel.invariant_router_logits(xs[i], ws[i], None), 4,
                        graph=True, reps=30).median_us
            r[f"{label} (experts {kernel.experts_per_program(T, E)})"] = t
        kernel.PROGRAMS, kernel.EXPERTS_MAX = RULE
        router_rows.append(r)
        print({k: (round(v, 1) if isinstance(v, float) else v) for k, v in r.items()}, flush=True)

layer_rows = []
for p in suite.PRESETS:
    if p.name not in ("llama4-scout-tp8", "qwen3-30b-a3b"):
        continue
    first = MoE(p.cfg, device="cuda")
    layers = [first] + [MoE(p.cfg, device="cuda") for _ in range(suite._copies(
        first, suite.expert_bytes(first) * p.cfg.top_k + suite.fixed_bytes(first)) - 1)]
    for T in (1, 64, 2048):
        xs = [torch.randn(T, p.cfg.hidden_size, device="cuda", dtype=p.cfg.dtype)
              for _ in range(suite.N_SETS)]
        case = suite._Case(layers, xs)
        reps = 30
        default, check = case.time(suite._call, "graph", reps, check=True)
        bi = suite._batch_invariant_row(case, reps)
        row = dict(preset=p.name, T=T, default_us=default["us"], default_check=check,
                   invariant_us=bi["us"], invariant_check=bi["check"],
                   ratio=bi["us"] / default["us"])
        layer_rows.append(row)
        print(row, flush=True)
    del layers, first
    torch.cuda.empty_cache()

json.dump(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
               commit=os.environ.get("SHUFFLEMOE_COMMIT", "?"), router=router_rows,
               layer=layer_rows),
          open(os.path.join(os.environ.get("OUT", "/tmp"), "probe_bi_router.json"), "w"), indent=1)
