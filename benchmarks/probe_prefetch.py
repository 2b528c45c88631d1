"""gate_up asking L2 for down's weights: off, at the start or at the end of each program (one GPU
call, a few minutes).

    PYTHONPATH=src python benchmarks/probe_prefetch.py --out $OUT

At T = 1 each fused decode GEMM alone reaches about half the read ceiling (tune_decode.md): a
fixed ramp and tail a launch. While gate_up streams w13 its programs can ask L2 for down's
weights of the same experts (cp.async.bulk.prefetch.L2, kernel._prefetch_l2), so the bytes of
both GEMMs stream in one ramp and down reads from L2. For the bf16 presets at T = 1..16, the
layer in CUDA graphs over rotated weight copies, with configs.PREFETCH_AT 0 / 1 / 2 and the L2
share at 1.0 (every case that fits in L2 at all prefetches), each output compared bit for bit
with the run without prefetch. Writes $OUT/probe_prefetch.json.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from decode_check import inputs, layers_for, weight_sets  # noqa: E402
from tune_decode import PRESETS  # noqa: E402

from shufflemoe.bench.ceilings import measure_ceilings  # noqa: E402
from shufflemoe.bench.report import metadata  # noqa: E402
from shufflemoe.bench.timing import time_fn  # noqa: E402
from shufflemoe.ops.moe_decode import configs, kernel  # noqa: E402
from shufflemoe.planner import must_read_bytes  # noqa: E402

NAMES = ("scout-tp8", "maverick-tp8", "qwen3-30b-a3b", "mixtral-tp2")
TOKENS = (1, 2, 4, 8, 16)
MODES = ((0, 0.5), (1, 1.0), (2, 1.0))  # (PREFETCH_AT, PREFETCH_L2_SHARE)
SETS = 8


def set_mode(at: int, share: float) -> None:
    configs.PREFETCH_AT, configs.PREFETCH_L2_SHARE = at, share
    kernel._l2_prefetch_bytes.cache_clear()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=pathlib.Path)
    args = p.parse_args()
    read_gbps = measure_ceilings().as_dict()["read_gbps"]
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    for name in NAMES:
        cfg = PRESETS[name]
        layers = layers_for(cfg, weight_sets(cfg, 1), "cuda")
        down_bytes = cfg.hidden_size * cfg.intermediate_size * cfg.dtype.itemsize
        for T in TOKENS:
            xs = inputs(cfg, T, "cuda", SETS)
            active = sum(int((layers[i % len(layers)].route(x).counts > 0).sum())
                         for i, x in enumerate(xs)) / len(xs)
            nbytes = must_read_bytes(cfg, active)
            row = dict(preset=name, T=T, active_experts=active, must_read_mb=nbytes / 1e6,
                       down_active_mb=active * down_bytes / 1e6, l2_mb=l2 / 1e6)
            base = None
            for at, share in MODES:
                set_mode(at, share)
                t = time_fn(lambda i: layers[i % len(layers)](xs[i]), SETS, graph=True, reps=40,
                            keep_outputs=True)
                outs = [o.clone() for o in t.outputs]
                base = base or outs
                row[f"at{at}_us"] = t.median_us
                row[f"at{at}_pct_read"] = 100 * nbytes / t.median_us / 1e3 / read_gbps
                row[f"at{at}_same_bits"] = all(torch.equal(a, b) for a, b in zip(outs, base))
            set_mode(0, 0.5)
            print(json.dumps(row), flush=True)
            rows.append(row)
        del layers
        torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "probe_prefetch.json").write_text(json.dumps(
        dict(meta=dict(metadata(), device=torch.cuda.get_device_name()), read_gbps=read_gbps,
             rows=rows), indent=1))


if __name__ == "__main__":
    main()
