"""The quantized formats (fp8_w8a16, mxfp4; fp8_block by --formats) at decode through the fused
kernels, in one GPU call.

For each layer preset of the layer suite, format and T: the layer in CUDA-graph replays over the
suite's rotated weight copies and input sets, as % of the read ceiling for the bytes the routing
activates (the layer suite's basis), through
  - "unfused": the four-launch grouped-GEMM pipeline (configs.NEVER, the path before);
  - "fused": the default (the tuning table's fp8 rows for fp8_w8a16, the heuristic for mxfp4);
  - "merged": at T <= 2 for presets with a shared expert, the shared expert in the routed
    experts' fused launches (configs.Switch.shared_quantized_formats);
  - at T <= GEMV_T, tile candidates for both fused GEMMs (block_n x bytes of K a step, one pair
    a tile on the CUDA cores or 16-pair MMA tiles), split-K planned as the heuristic plans it;
  - at T > GEMV_T, for the formats --gemm names, grouped GEMM tiles (GEMM_CANDIDATES).
Every timed variant is checked against the float64 reference first. Writes
$OUT/probe_weight_only.json and prints a table.

    PYTHONPATH=src python benchmarks/probe_weight_only.py --out $OUT [--budget 540]
        [--formats fp8_w8a16] [--candidates none] [--gemm fp8_w8a16,mxfp4] [--ts 1,8,64]
        [--tiles 4,5,10] [--gemm-tiles 0,6] [--presets llama4-scout-tp8,qwen3-30b-a3b]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import pathlib
import time

import torch

from shufflemoe import MoE
from shufflemoe.bench.ceilings import measure_ceilings
from shufflemoe.bench.report import metadata
from shufflemoe.bench.suites.layer import (N_SETS, PRESETS, _Case, _call, _copies, expert_bytes,
                                           fixed_bytes)
from shufflemoe.ops.grouped_gemm import configs as gemm_configs
from shufflemoe.ops.moe_decode import configs

FORMATS = ("fp8_w8a16", "mxfp4")
TS = (1, 2, 4, 8, 16, 64)
GEMV_T = 8
# (block_n, bytes of K per weight row and step, block_m, warps, stages)
CANDIDATES = ((64, 64, 16, 4, 3), (64, 128, 16, 4, 3), (32, 128, 16, 4, 4), (128, 64, 16, 8, 3),
              (16, 256, 1, 4, 2), (32, 128, 1, 4, 2), (32, 256, 1, 4, 2), (64, 128, 1, 8, 2),
              (16, 512, 1, 4, 2), (64, 256, 1, 8, 2), (4, 1024, 1, 4, 2), (4, 2048, 1, 4, 2),
              (8, 1024, 1, 4, 2))


# Weight-only grouped GEMM tiles for T > GEMV_T (block_m, block_n, block_k values, warps, stages,
# mxfp4's run order), weights on the wgmma M side (swap_ab: the converted tile is its register
# operand, no shared-memory round trip), for the routed GEMMs only (G > 1; the shared expert keeps
# the heuristic's).
GEMM_CANDIDATES = ((16, 128, 128, 4, 3), (16, 128, 256, 4, 3), (16, 128, 256, 8, 3),
                   (16, 64, 256, 4, 4), (16, 64, 512, 4, 3), (16, 128, 512, 8, 2),
                   (32, 128, 256, 4, 3), (32, 128, 128, 4, 3), (32, 128, 256, 4, 3, True),
                   (32, 128, 128, 4, 3, True), (32, 128, 256, 8, 3), (64, 128, 128, 4, 3),
                   (64, 128, 256, 4, 3))


def gemm_candidate(bm: int, bn: int, bk: int, warps: int, stages: int, run_order: bool = False):
    tile = gemm_configs.TileConfig(bm, bn, bk, warps, stages, swap_ab=True, ctas_per_sm=2,
                                   run_order=run_order)

    def choose(key):
        M, N, K, G, dtype = key
        return tile if G > 1 else gemm_configs._heuristic(*key)

    return choose


def candidate(bn: int, k_bytes: int, bm: int, warps: int, stages: int):
    """The override for one tile candidate of the routed experts: the same tile in
    both GEMMs, K split as the heuristic splits it (every SM gets a program, at least two K steps
    a split). A fused shared expert (E = 1) keeps the tiles it takes without an override."""

    def choose(key):
        A, E, D, I, dtype, sms = key
        if E == 1:  # the shared expert, in x's dtype whatever the routed experts' format
            return configs.planned(key)
        bk = k_bytes * 2 if dtype == torch.uint8 else k_bytes // dtype.itemsize
        gemms = []
        for N, K in ((I, D), (D, I)):
            split = configs.split_for(min(E, A) * -(-N // bn), -(-K // bk), sms)
            gemms.append(configs.GemmConfig(bn, bk, split, warps, stages, block_m=bm))
        return configs.DecodeConfig(*gemms)

    return choose


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/probe_weight_only")
    ap.add_argument("--budget", type=float, default=540.0)
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--candidates", default=",".join(FORMATS),
                    help="formats whose fused tile candidates are timed at T <= GEMV_T (the "
                         "others: fused, unfused)")
    ap.add_argument("--gemm", default="", help="formats whose grouped GEMM tiles are timed at "
                                               "T > GEMV_T")
    ap.add_argument("--ts", default=",".join(map(str, TS)), help="token counts")
    ap.add_argument("--tiles", default="", help="indices into CANDIDATES to time (default all)")
    ap.add_argument("--gemm-tiles", default="", help="indices into GEMM_CANDIDATES (default all)")
    ap.add_argument("--presets", default="", help="layer presets (default all)")
    args = ap.parse_args()
    start = time.time()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ceil = measure_ceilings()
    rows = []
    picked = [CANDIDATES[int(i)] for i in args.tiles.split(",")] if args.tiles else CANDIDATES
    gemm_picked = ([GEMM_CANDIDATES[int(i)] for i in args.gemm_tiles.split(",")]
                   if args.gemm_tiles else GEMM_CANDIDATES)
    for p in PRESETS:
        if args.presets and p.name not in args.presets.split(","):
            continue
        for fmt in args.formats.split(","):
            cfg = p.cfg.replace(quantization=fmt)
            torch.manual_seed(0)
            first = MoE(cfg, device="cuda")
            n = _copies(first, expert_bytes(first) * cfg.top_k + fixed_bytes(first))
            layers = [first] + [MoE(cfg, device="cuda") for _ in range(n - 1)]
            for T in map(int, args.ts.split(",")):
                if time.time() - start > args.budget:
                    rows.append(dict(preset=p.name, format=fmt, T=T, note="skipped: budget"))
                    continue
                xs = [torch.randn(T, cfg.hidden_size, device="cuda", dtype=cfg.dtype)
                      for _ in range(N_SETS)]
                case = _Case(layers, xs)
                variants = {"unfused": configs.override(configs.NEVER),
                            "fused": contextlib.nullcontext()}
                if T <= 2 and cfg.shared_intermediate_size:
                    variants["merged"] = configs.override(dataclasses.replace(
                        configs.Switch(), shared_quantized_formats=(fmt,),
                        shared_quantized_max_tokens=2))
                if T <= GEMV_T and fmt in args.candidates.split(","):
                    for c in picked:
                        name = f"{c[0]}x{c[1]}B {'gemv' if c[2] == 1 else 'mma'} w{c[3]} s{c[4]}"
                        variants[name] = configs.override(candidate(*c))
                if T > GEMV_T and fmt in args.gemm.split(","):
                    for c in gemm_picked:
                        ro = " ro" if c[5:] == (True,) else ""
                        name = f"gemm {c[0]}x{c[1]}x{c[2]} w{c[3]} s{c[4]}{ro}"
                        variants[name] = gemm_configs.override(gemm_candidate(*c))
                for name, ctx in variants.items():
                    row = dict(preset=p.name, format=fmt, T=T, variant=name)
                    try:
                        with ctx:
                            timing, check = case.time(_call, "graph", 30, check=True)
                        us = timing["us"]
                        pct = case.fields["read_bytes"] / (us * 1e-6) / (ceil.read_gbps * 1e9)
                        row.update(us=us, p20=timing.get("us_lo"), p80=timing.get("us_hi"),
                                   check=check, pct_read=round(100 * pct, 1))
                    except Exception as e:  # noqa: BLE001 - a candidate that fails is a row
                        row["note"] = f"failed: {type(e).__name__}: {str(e)[:160]}"
                    rows.append(row)
                    print(json.dumps(row), flush=True)
            del layers, first
            torch.cuda.empty_cache()
    meta = dict(metadata(), read_gbps=ceil.read_gbps, seconds=round(time.time() - start))
    (out / "probe_weight_only.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    best = {}
    for r in rows:
        if r.get("check") == "ok":
            k = (r["preset"], r["format"], r["T"])
            if r["variant"] not in ("unfused",) and r["us"] < best.get(k, (1e9, ""))[0]:
                best[k] = (r["us"], r["variant"])
    for r in rows:
        if r.get("variant") in ("unfused", "fused"):
            k = (r["preset"], r["format"], r["T"])
            print(f"{k} {r['variant']:8s} {r.get('us')} us {r.get('pct_read')}% {r.get('check')} "
                  f"best {best.get(k)}")


if __name__ == "__main__":
    main()
