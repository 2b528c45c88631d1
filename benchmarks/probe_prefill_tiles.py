"""Llama 4 prefill (T = 16384, TP8): the gather copy, and tiles beside the shipped one (one GPU
call, ~3 min)

    PYTHONPATH=src python benchmarks/probe_prefill_tiles.py --out $OUT

Two questions, the routed GEMMs timed alone (CUDA graphs, timing.time_fn; routed = the bincount
of a uniform draw, as probe_prefill_groups.py):

1. Llama 4 scales each routed row by its router weight before the experts, so the unfused path
   copies the rows (gather_scale: ~88 us at T = 16384 bf16, results/h200 timeline) before
   GEMM13. With no bias, W (s x) = s (W x): GEMM13 could gather the unscaled rows by id (x_ids,
   pointer loads) and scale its fp32 sums in the epilogue (row_weights), no copy. Rows "gather":
   GEMM13 over a random permutation of the rows by x_ids with row_weights, against the contiguous
   rows through TMA ("copy": what the copy feeds it; the copy itself not timed). bf16 and
   fp8_w8a16, Scout and Maverick. Each checked: the same numbers as scaling the copy's rows in
   float32 would give, to the rounding (max relative error printed).
2. Tiles: Scout's gate_up / down (16 groups of ~1024 rows; its gate_up reads 85% of the rate of
   cuBLAS's on the same shape) and Maverick's (128 groups of ~128 rows), bf16 and fp8 rowwise:
   the shipped tile against 256 x 128, four stages, no flattened loop, and for Maverick 64-row
   tiles two an SM. Writes $OUT/probe_prefill_tiles.json.
"""

from __future__ import annotations

import argparse
import json
import pathlib

import torch

from probe_prefill_groups import T, _operands, _row, _sizes, _time_tiles
from shufflemoe import preset
from shufflemoe.bench.report import metadata
from shufflemoe.bench.timing import time_fn
from shufflemoe.ops import grouped_gemm

FP8 = torch.float8_e4m3fn


def _gather_rows(name: str, E: int, D: int, I: int, dev: str) -> list[dict]:
    rows = []
    for fmt in ("bf16", "fp8_w8a16"):
        x = torch.randn(T, D, device=dev, dtype=torch.bfloat16)
        w = torch.randn(E, 2 * I, D, device=dev, dtype=torch.bfloat16) * 0.02
        kw = {}
        if fmt == "fp8_w8a16":
            ws = w.abs().amax(2).float() / 448
            w, kw = (w / ws[:, :, None]).to(FP8), dict(w_scale=ws, quantization="fp8_w8a16")
        m = _sizes(E, "routed", dev)
        ids = torch.randperm(T, device=dev).to(torch.int32)
        s = torch.rand(T, device=dev) * 0.9 + 0.1
        copy = x[ids.long()].contiguous()  # the copy's rows, unscaled: its GEMM costs the same
        out = torch.empty(T, 2 * I, device=dev, dtype=torch.bfloat16)
        flops, w_bytes = 2.0 * T * 2 * I * D, float(w.numel() * w.element_size())
        t = time_fn(lambda i: grouped_gemm(copy, w, m, out=out, **kw), 1, reps=20)
        rows.append(dict(_row(fmt, "gate_up", "copy (contiguous rows, TMA)", t, flops, w_bytes),
                         preset=name))
        want = out.float() * s[:, None]
        t = time_fn(lambda i: grouped_gemm(x, w, m, x_ids=ids, row_weights=s, out=out, **kw),
                    1, reps=20)
        grouped_gemm(x, w, m, x_ids=ids, row_weights=s, out=out, **kw)
        torch.cuda.synchronize()
        err = ((out.float() - want).abs().max() / want.abs().max()).item()
        rows.append(dict(_row(fmt, "gate_up", "gather (x_ids, row_weights)", t, flops, w_bytes),
                         preset=name, max_rel_err=err))
        print("max rel err", err, flush=True)
        del x, w, copy, out, want
        torch.cuda.empty_cache()
    return rows


def _tile_rows(name: str, E: int, D: int, I: int, dev: str) -> list[dict]:
    rows = []
    for fmt in ("bf16", "fp8_rowwise"):
        for gemm, (N, K) in {"gate_up": (2 * I, D), "down": (D, I)}.items():
            x, w, kw, out, shipped = _operands(fmt, N, K, E, dev)
            flops, w_bytes = 2.0 * T * N * K, float(w.numel() * w.element_size())
            tiles = {"shipped": shipped,
                     "256 x 128": shipped.with_(block_m=256, block_n=128),
                     "four stages": shipped.with_(num_stages=4),
                     "no flattened loop": shipped.with_(flatten=False)}
            if E > 16:
                tiles["64 x 256, 4 warps, 2 stages, two an SM"] = shipped.with_(
                    block_m=64, num_warps=4, num_stages=2, ctas_per_sm=2)
                tiles["64 x 128, 4 warps, 4 stages, two an SM"] = shipped.with_(
                    block_m=64, block_n=128, num_warps=4, num_stages=4, ctas_per_sm=2)
            m = _sizes(E, "routed", dev)
            rows += [dict(r, preset=name) for r in
                     _time_tiles(tiles, x, w, m, out, kw, fmt, gemm, "", flops, w_bytes)]
            del x, w, out
            torch.cuda.empty_cache()
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=pathlib.Path)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in ("llama4-scout", "llama4-maverick"):
        cfg = preset(name, tp=8)
        E, D, I = cfg.num_experts, cfg.hidden_size, cfg.intermediate_size
        rows += _gather_rows(name, E, D, I, "cuda")
        rows += _tile_rows(name, E, D, I, "cuda")
    (args.out / "probe_prefill_tiles.json").write_text(json.dumps(
        dict(meta=metadata(), T=T, rows=rows), indent=1))


if __name__ == "__main__":
    main()
