"""The fused decode kernels with register double-buffering and early weights under PDL, against
the kernels before them (one GPU call, a few minutes).

    PYTHONPATH=src python benchmarks/probe_gemv.py --out $OUT

One-pair tiles (block_m = 1, the table's choice at T = 1) multiply on the CUDA cores, where
Triton's pipeliner does not put their weight loads in flight ahead of use. The kernels now load
step k + 1's weights before step k sums, and with programmatic dependent launch down finds its
expert and loads its first weights before it waits for gate_up. For the presets at T = 1..8, the
layer in CUDA graphs over rotated weight copies (% of the read ceiling for the bytes the routing
activates), bf16 (fused, as shipped) and fp8 rowwise (unfused as shipped, and fused):

    old, old_pdl: the kernels at df3d555 (src/.../moe_decode/_kernel_df3d555.py, an untracked copy
                  the command line makes; modes skipped without it), PDL off / on;
    new, new_pdl: the kernels of this commit, PDL off / on;

every output compared bit for bit with the first mode's. Writes $OUT/probe_gemv.json.
Measured at 96dffe2 (results/probe_gemv.json): the double-buffered kernels spilled and were
slower, so since f62f8cb the kernels are df3d555's again and "old" and "new" are the same code.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from decode_check import inputs, layers_for, weight_sets  # noqa: E402
from tune_decode import DTYPES, PRESETS  # noqa: E402

from shufflemoe.bench.ceilings import measure_ceilings  # noqa: E402
from shufflemoe.bench.report import metadata  # noqa: E402
from shufflemoe.bench.timing import time_fn  # noqa: E402
from shufflemoe.ops.moe_decode import configs, kernel  # noqa: E402
from shufflemoe.planner import must_read_bytes  # noqa: E402

NAMES = ("scout-tp8", "qwen3-30b-a3b", "maverick-tp8", "mixtral-tp2")
TOKENS = (1, 2, 4, 8)
SETS = 8
NEW = (kernel._gate_up_kernel, kernel._down_kernel)
try:
    OLD = importlib.import_module("shufflemoe.ops.moe_decode._kernel_df3d555")
except ImportError:
    OLD = None


@contextlib.contextmanager
def mode(name: str, fused: bool):
    """Kernels (old | new) and PDL for the block; fp8 layers fused only when ``fused``."""
    old = name.startswith("old")
    kernel._gate_up_kernel, kernel._down_kernel = (
        (OLD._gate_up_kernel, OLD._down_kernel) if old else NEW)
    pdl = name.endswith("pdl")
    with contextlib.ExitStack() as stack:
        stack.enter_context(configs.override(configs.ALWAYS if fused else configs.Switch()))
        stack.enter_context(configs.override(
            lambda key: configs._choose(*key).with_(pdl=pdl)))
        try:
            yield
        finally:
            kernel._gate_up_kernel, kernel._down_kernel = NEW


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=pathlib.Path)
    args = p.parse_args()
    read_gbps = measure_ceilings().as_dict()["read_gbps"]
    modes = [m for m in ("old", "old_pdl", "new", "new_pdl") if OLD is not None or
             m.startswith("new")]
    rows = []
    for name in NAMES:
        for dtype in DTYPES:
            cfg = PRESETS[name].replace(quantization=DTYPES[dtype])
            layers = layers_for(cfg, weight_sets(cfg, 1), "cuda")
            variants = [(m, True) for m in modes]
            if dtype == "fp8":
                variants = [("new", False)] + variants  # the shipped (unfused) fp8 path first
            for T in TOKENS:
                xs = inputs(cfg, T, "cuda", SETS)
                active = sum(int((layers[i % len(layers)].route(x).counts > 0).sum())
                             for i, x in enumerate(xs)) / len(xs)
                nbytes = must_read_bytes(cfg, active)
                row = dict(preset=name, dtype=dtype, T=T, active_experts=active,
                           must_read_mb=nbytes / 1e6)
                base = None
                for m, fused in variants:
                    label = m if fused or dtype == "bf16" else "unfused"
                    with mode(m, fused):
                        t = time_fn(lambda i: layers[i % len(layers)](xs[i]), SETS, graph=True,
                                    reps=40, keep_outputs=True)
                    outs = [o.clone() for o in t.outputs]
                    if fused:
                        base = base or outs
                        row[f"{label}_same_bits"] = all(torch.equal(a, b)
                                                        for a, b in zip(outs, base))
                    row[f"{label}_us"] = t.median_us
                    row[f"{label}_p20_p80"] = [t.p20_us, t.p80_us]
                    row[f"{label}_pct_read"] = 100 * nbytes / t.median_us / 1e3 / read_gbps
                print(json.dumps(row), flush=True)
                rows.append(row)
            del layers
            torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "probe_gemv.json").write_text(json.dumps(
        dict(meta=dict(metadata(), device=torch.cuda.get_device_name()), read_gbps=read_gbps,
             modes=modes, rows=rows), indent=1))


if __name__ == "__main__":
    main()
