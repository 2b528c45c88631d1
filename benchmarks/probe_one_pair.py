"""The decode layer at T = 1..8 in CUDA graphs, checked, for an A/B of two source trees (one GPU call).

    PYTHONPATH=src python benchmarks/probe_one_pair.py --out $OUT --label new [--budget 150]
    PYTHONPATH=old/src python benchmarks/probe_one_pair.py --out $OUT --label old

Built for the one-pair tiles' per-thread runs (moe_decode._dot: a one-pair tile, block_m = 1,
sums each run of 16 bytes of a weight row in its own accumulator column and reduces across
threads once after the K loop, where it reduced every row across the block every K step:
offline sm_90 K loop of Qwen3's fp8 gate_up tile 1067 -> 819 instructions, bf16 375 -> 243, no
shuffles or barriers left in it). Run it once per tree, in turns, in one call: the trees'
kernels differ, so Triton keeps both builds and the second round only loads them.

For Llama 4 Scout and Maverick TP8, Qwen3-30B-A3B and Mixtral TP2, bf16, fp8 rowwise and
fp8_w8a16 (the one-pair GEMVs' formats) at T = 1, 2, 4, 8 (the layer's default switch: fused
where it fuses): the layer against the float64 naive_moe on one input, then CUDA-graph replays
rotating weight sets (past twice the L2) and 8 inputs (each routes differently). Appends rows
(label, preset, format, T, us median and p20 / p80, check) to $OUT/probe_one_pair.jsonl.
--presets / --formats / --tokens narrow or widen the rows (--formats also takes fp8_block and
mxfp4, --tokens any T: prefill's 2048 too, for a change to the unfused path); --force-pdl
launches both fused GEMMs with programmatic dependent launch whatever the tuning table says (for
a change that moves work before the PDL wait, on rows whose table entry has PDL off).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from decode_check import PRESETS, inputs, layers_for, weight_sets  # noqa: E402

from shufflemoe import naive_moe  # noqa: E402
from shufflemoe.bench.report import metadata  # noqa: E402
from shufflemoe.bench.timing import time_fn  # noqa: E402
from shufflemoe.testing import compare, tolerance_key  # noqa: E402

FORMATS = {"bf16": "none", "fp8": "fp8_rowwise", "w8a16": "fp8_w8a16", "fp8_block": "fp8_block",
           "mxfp4": "mxfp4"}
DEFAULT_FORMATS = ("bf16", "fp8", "w8a16")  # the one-pair GEMVs' formats
TOKENS = (1, 2, 4, 8)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=pathlib.Path)
    p.add_argument("--label", required=True)
    p.add_argument("--budget", type=float, default=150.0, help="seconds, then stop")
    p.add_argument("--presets", nargs="+", default=list(PRESETS), choices=list(PRESETS))
    p.add_argument("--formats", nargs="+", default=list(DEFAULT_FORMATS), choices=list(FORMATS))
    p.add_argument("--tokens", nargs="+", type=int, default=list(TOKENS))
    p.add_argument("--force-pdl", action="store_true")
    args = p.parse_args()
    if args.force_pdl:
        from shufflemoe.ops.moe_decode import kernel

        plan = kernel._plan
        kernel._plan = lambda *a: plan(*a).with_(pdl=True)
    start = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    meta = dict(metadata(), label=args.label, force_pdl=args.force_pdl,
                tree=str(pathlib.Path(sys.modules["shufflemoe"].__file__).parent))
    with open(args.out / "probe_one_pair.jsonl", "a") as f:
        f.write(json.dumps(dict(meta=meta)) + "\n")
        for name in args.presets:
            base = PRESETS[name]
            for fmt in args.formats:
                quant = FORMATS[fmt]
                if time.monotonic() - start > args.budget:
                    print(f"{args.label}: budget spent before {name} {fmt}", flush=True)
                    return
                cfg = base.replace(quantization=quant)
                layers = layers_for(cfg, weight_sets(cfg, 1), "cuda")
                for T in args.tokens:
                    xs = inputs(cfg, T, "cuda", 8)
                    ref, mag = naive_moe(layers[0], xs[0], layers[0].route(xs[0]),
                                         with_magnitude=True)
                    c = compare(layers[0](xs[0]), ref, tolerance_key(cfg), magnitude=mag)
                    t = time_fn(lambda i: layers[i % len(layers)](xs[i]), len(xs), graph=True)
                    row = dict(label=args.label, preset=name, format=fmt, T=T,
                               us=t.median_us, p20=t.p20_us, p80=t.p80_us, check=c.ok)
                    f.write(json.dumps(row) + "\n")
                    f.flush()
                    print(f"{args.label} {name} {fmt} T={T}: {t.median_us:.1f} us "
                          f"[{t.p20_us:.1f}, {t.p80_us:.1f}] {'ok' if c.ok else 'FAILED'}",
                          flush=True)
                del layers
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
