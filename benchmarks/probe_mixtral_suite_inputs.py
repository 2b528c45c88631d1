"""Mixtral TP2 mxfp4 at T = 64 on the layer suite's own inputs (the same seed, layer copies and
draws as the suite's _preset_rows), replayed alone in CUDA graphs, and on three fresh draws: is a
change of the suite's row the kernel's, or the context the suite ran it in? One process per
source tree (PYTHONPATH=<tree>/src python benchmarks/probe_mixtral_suite_inputs.py <label>);
results/probe_mixtral_suite_inputs.txt (run as at 2946e63, before this docstring)."""

import json, sys
import torch
from shufflemoe.bench.suites import layer as L
from shufflemoe.bench.timing import time_fn

p = next(p for p in L.PRESETS if p.name == "mixtral-8x7b-tp2")
cfg = p.cfg.replace(quantization="mxfp4")
torch.manual_seed(0)
first = L.MoE(cfg, device="cuda")
copies = L._copies(first, L.expert_bytes(first) * cfg.top_k + L.fixed_bytes(first))
layers = [first] + [L.MoE(cfg, device="cuda") for _ in range(copies - 1)]
xs_for = lambda T: [torch.randn(T, cfg.hidden_size, device="cuda", dtype=cfg.dtype) for _ in range(L.N_SETS)]  # noqa
sets = {T: xs_for(T) for T in (1, 8, 64)}
draws = {"suite": sets[64], **{f"fresh{d}": xs_for(64) for d in range(3)}}
for name, xs in draws.items():
    counts = [layers[i % len(layers)].route(x).counts.tolist() for i, x in enumerate(xs)]
    with torch.no_grad():
        t = time_fn(lambda i: layers[i % len(layers)](xs[i]), len(xs), graph=True, reps=30)
    print(json.dumps(dict(tree=sys.argv[1], draw=name, copies=copies, us=round(t.median_us, 1),
                          counts=counts[:3])), flush=True)
