"""The block-scaled and weight-only formats at compute-bound row counts: grouped GEMM tiles for the
routed experts' GEMMs, in the whole layer (one GPU call).

The layer suite at 5a027d2 (H200, CUDA graphs) has these formats far behind fp8 rowwise and bf16
where the groups are large: Mixtral TP2 T = 2048 fp8_block 3451 us and fp8_w8a16 2565 us (bf16
at T = 1024 816 us, fp8 rowwise 478); Qwen3-30B-A3B T = 2048 fp8_block 915, fp8_w8a16 719,
mxfp4 744 against bf16 462 and fp8 rowwise 326. There the heuristic's tiles are the bf16 / fp8
rowwise ones (128 x 256, 8 warps, flattened), where fp8_block's scaled product of each K step
needs a second [128, 256] fp32 tile (ptxas: spills) and the weight-only formats convert the
weight tile, the wgmma's shared-memory operand, in registers. Candidates: smaller unswapped
tiles for fp8_block, swapped ones (the weights as the wgmma's register operand) for all three.

For each preset, format and T: the layer (CUDA-graph replays over rotated weight copies and
input sets, checked against float64 first) with select()'s tile (from 21087d0 the rule
configs.FORMAT_PREFILL_TILES these runs found), then with each candidate on the
routed GEMMs whose groups average more than 64 rows (the rest keep the heuristic's tiles).
bf16 and fp8 rowwise rows (heuristic only) give the same shapes' reference times. Writes
$OUT/probe_prefill_formats.json.

    PYTHONPATH=src python benchmarks/probe_prefill_formats.py --out $OUT [--budget 520]
        [--presets mixtral-8x7b-tp2,qwen3-30b-a3b] [--formats fp8_block] [--only A,B]
"""

from __future__ import annotations

import json
import time

import torch

from probe_fused_limit import probe_start
from shufflemoe import MoE
from shufflemoe.bench.ceilings import measure_ceilings
from shufflemoe.bench.report import metadata
from shufflemoe.bench.suites.layer import (N_SETS, PRESETS, _Case, _call, _copies, expert_bytes,
                                           fixed_bytes)
from shufflemoe.ops.grouped_gemm import configs as gemm_configs

TileConfig = gemm_configs.TileConfig
CASES = (("mixtral-8x7b-tp2", 2048), ("qwen3-30b-a3b", 2048), ("llama4-scout-tp8", 16384))
FORMATS = ("fp8_block", "fp8_w8a16", "mxfp4")
REFERENCE_FORMATS = ("none", "fp8_rowwise")
# name -> (tile, the formats it is timed for); block_k in values of x's dtype (fp8_block: bytes)
CANDIDATES = {
    "A 128x128x128 w8 s4": (TileConfig(128, 128, 128, num_warps=8, num_stages=4), ("fp8_block",)),
    "B 64x256x128 w8 s3": (TileConfig(64, 256, 128, num_warps=8, num_stages=3), ("fp8_block",)),
    "C 64x128x128 w4 s4 x2": (TileConfig(64, 128, 128, num_stages=4, ctas_per_sm=2),
                              ("fp8_block",)),
    "D swap 128x128x128 w8 s3": (TileConfig(128, 128, 128, num_warps=8, num_stages=3,
                                            swap_ab=True), ("fp8_block",)),
    "E swap 128x128x64 w8 s4": (TileConfig(128, 128, 64, num_warps=8, num_stages=4, swap_ab=True),
                                ("fp8_w8a16", "mxfp4")),
    "F swap 256x128x64 w8 s3": (TileConfig(256, 128, 64, num_warps=8, num_stages=3, swap_ab=True),
                                ("fp8_w8a16", "mxfp4")),
    "G swap 64x128x64 w4 s4 x2": (TileConfig(64, 128, 64, num_stages=4, swap_ab=True,
                                             ctas_per_sm=2), ("fp8_w8a16", "mxfp4")),
    "H 128x128x64 w8 s4": (TileConfig(128, 128, 64, num_warps=8, num_stages=4),
                           ("fp8_w8a16", "mxfp4")),
    "I 64x256x128 w8 s4": (TileConfig(64, 256, 128, num_warps=8, num_stages=4), ("fp8_block",)),
    "J 64x256x128 w8 s3 flat": (TileConfig(64, 256, 128, num_warps=8, num_stages=3,
                                           flatten=True), ("fp8_block",)),
    "K swap 128x128x64 w8 s3": (TileConfig(128, 128, 64, num_warps=8, num_stages=3, swap_ab=True),
                                ("fp8_w8a16", "mxfp4")),
    "L swap 128x256x64 w8 s3": (TileConfig(128, 256, 64, num_warps=8, num_stages=3, swap_ab=True),
                                ("fp8_w8a16", "mxfp4")),
    "M swap 128x128x128 w8 s3": (TileConfig(128, 128, 128, num_warps=8, num_stages=3,
                                            swap_ab=True), ("fp8_w8a16", "mxfp4")),
}


def routed(tile: TileConfig):
    """The override: ``tile`` where the groups average more than 64 rows, else the heuristic."""

    def choose(key):
        M, N, K, G, dtype = key
        if G > 1 and M > 64 * G:
            return tile
        return gemm_configs._heuristic(*key)

    return choose


def main() -> None:
    args, start, out = probe_start(
        "probe_prefill_formats", budget=520.0, reps=10, presets=dict(default=""),
        formats=dict(default=",".join(FORMATS)),
        only=dict(default="", help="candidate letters to time (default all)"))
    ceil = measure_ceilings()
    by_name = {p.name: p for p in PRESETS}
    formats = args.formats.split(",")
    letters = set(args.only.split(",")) if args.only else None
    rows = []
    for name, T in CASES:
        if args.presets and name not in args.presets.split(","):
            continue
        for fmt in formats + list(REFERENCE_FORMATS):
            cfg = by_name[name].cfg.replace(quantization=fmt)
            variants = {"heuristic": None}
            if fmt in formats:
                variants.update({c: routed(tile) for c, (tile, fmts) in CANDIDATES.items()
                                 if fmt in fmts and (letters is None or c[0] in letters)})
            if time.time() - start > args.budget:
                rows.append(dict(preset=name, format=fmt, T=T, note="skipped: budget"))
                continue
            torch.manual_seed(0)
            first = MoE(cfg, device="cuda")
            n = _copies(first, expert_bytes(first) * min(cfg.num_experts, T * cfg.top_k)
                        + fixed_bytes(first))
            layers = [first] + [MoE(cfg, device="cuda") for _ in range(n - 1)]
            xs = [torch.randn(T, cfg.hidden_size, device="cuda", dtype=cfg.dtype)
                  for _ in range(N_SETS)]
            case = _Case(layers, xs)
            for variant, choose in variants.items():
                row = dict(preset=name, format=fmt, T=T, variant=variant)
                if time.time() - start > args.budget:
                    row["note"] = "skipped: budget"
                    rows.append(row)
                    continue
                try:
                    if choose is None:
                        timing, check = case.time(_call, "graph", args.reps, check=True)
                    else:
                        with gemm_configs.override(choose):
                            timing, check = case.time(_call, "graph", args.reps, check=True)
                    row.update(us=round(timing["us"], 1), p20=round(timing["us_lo"], 1),
                               p80=round(timing["us_hi"], 1), check=check)
                except Exception as e:  # noqa: BLE001 - a candidate that fails is a row
                    row["note"] = f"failed: {type(e).__name__}: {str(e)[:200]}"
                rows.append(row)
                print(json.dumps(row), flush=True)
            del layers, first, case
            torch.cuda.empty_cache()
    meta = dict(metadata(), read_gbps=ceil.read_gbps, bf16_tflops=ceil.bf16_tflops,
                seconds=round(time.time() - start))
    (out / "probe_prefill_formats.json").write_text(json.dumps(dict(meta=meta, rows=rows),
                                                               indent=1))
    for r in rows:
        print(r["preset"], r["format"], r["T"], r.get("variant"), r.get("us"), r.get("check"),
              r.get("note", ""))


if __name__ == "__main__":
    main()
