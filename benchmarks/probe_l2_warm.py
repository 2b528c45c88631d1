"""Whether GEMM13's first weight bytes, asked of L2 while the routing runs, make T >= 64 decode
faster (one GPU call).

At T >= 64 every expert of Scout, Qwen3 and Mixtral is active, so the weights GEMM13 will read
are known before the routing is; yet HBM sits mostly idle for the ~14-22 us of router, route and
gather before GEMM13 starts (H200 timeline at 2588615, Scout TP8 fp8 rowwise T = 64: router
12.3, route 5.6, gather 4.6 us; only the shared expert's ~31 MB move meanwhile). Each variant
launches, on a stream forked at the call's start, one kernel of bulk L2 prefetches
(cp.async.bulk.prefetch.L2, fire and forget) over X MB of w13, in one of two orders:
  kfront  the first X / (E 2I) bytes of every row (a one-wave GEMM13's programs all walk K
          from 0), or
  linear  w13's first X MB in memory (a many-wave GEMM13's first programs take the first
          groups whole).
Each case: the layer (CUDA-graph replays over rotated weight copies and input sets, the layer
suite's _Case) as shipped, then each variant, then as shipped again; every variant checked
against float64. Writes $OUT/probe_l2_warm.json.

    PYTHONPATH=src python benchmarks/probe_l2_warm.py --out $OUT [--budget 400] [--reps 20]
"""

from __future__ import annotations

import contextlib
import json
import time

import torch
import triton
import triton.language as tl

from shufflemoe.bench.ceilings import measure_ceilings
from shufflemoe.bench.report import metadata
from shufflemoe.bench.suites.layer import PRESETS

from probe_fused_limit import new_case, probe_start, rotated_layers, timed

CASES = (  # (preset, format, T values), most telling first
    ("llama4-scout-tp8", "fp8_rowwise", (64, 128)),
    ("mixtral-8x7b-tp2", "fp8_rowwise", (64,)),
    ("qwen3-30b-a3b", "fp8_rowwise", (64,)),
    ("llama4-scout-tp8", "none", (128,)),
    ("mixtral-8x7b-tp2", "none", (64,)),
    ("qwen3-30b-a3b", "none", (64,)),
)
VARIANTS = {"kfront 24": ("kfront", 24), "kfront 40": ("kfront", 40),
            "linear 24": ("linear", 24), "linear 40": ("linear", 40)}
CHUNK = 16384  # linear: bytes a prefetch
BLOCK = 128  # prefetches a program


@triton.jit
def _prefetch_rows(ptr, n_rows, row_stride, nbytes, BLOCK: tl.constexpr):
    """Ask L2 for nbytes (a multiple of 16) at ptr + r row_stride (16-byte aligned) for each of
    this program's BLOCK rows r: one bulk prefetch a row, issued by the row's thread."""
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    at = ptr + tl.minimum(r, n_rows - 1).to(tl.int64) * row_stride
    n = tl.where(r < n_rows, nbytes, 0)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.u32 p, $2, 0;\n\t"
        "@p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r", [at, n], dtype=tl.int32, is_pure=False, pack=1)


def prefetch_plan(w13: torch.Tensor, order: str, mb: int) -> tuple:
    """(rows, row stride, bytes a row) over w13 [E, 2I, D] for X = mb MB in ``order``."""
    total = w13.numel() * w13.element_size()
    want = min(mb << 20, total)
    if order == "linear":
        return want // CHUNK, CHUNK, CHUNK
    rows = w13.shape[0] * w13.shape[1]
    row_bytes = w13.shape[2] * w13.element_size()
    return rows, row_bytes, min(row_bytes, want // rows // 128 * 128)


def warmed_call(plan: tuple, side: torch.cuda.Stream):
    """fn(layer, x): the layer's call with the plan's prefetches on ``side``, forked at its start
    and joined at its end (the graph's root branches run beside the router)."""
    def call(layer, x):
        w13 = layer._hot().weights.w13
        cur = torch.cuda.current_stream()
        side.wait_stream(cur)
        with torch.cuda.stream(side):
            rows, stride, nbytes = plan
            _prefetch_rows[(triton.cdiv(rows, BLOCK),)](w13, rows, stride, nbytes, BLOCK=BLOCK,
                                                        num_warps=4)
        y = layer(x)
        cur.wait_stream(side)
        return y
    return call


def main() -> None:
    args, start, out = probe_start("probe_l2_warm")
    ceil = measure_ceilings()
    by_name = {p.name: p for p in PRESETS}
    side = torch.cuda.Stream()
    rows = []
    for name, fmt, Ts in CASES:
        cfg = by_name[name].cfg.replace(quantization=fmt)
        if time.time() - start > args.budget:
            rows.append(dict(preset=name, format=fmt, note="skipped: budget"))
            continue
        layers = rotated_layers(cfg, max(Ts))
        w13 = layers[0]._hot().weights.w13
        for T in Ts:
            row = dict(preset=name, format=fmt, T=T, w13_mb=round(w13.numel() * w13.element_size()
                                                               / 2**20, 1))
            if time.time() - start > args.budget:
                rows.append(dict(row, note="skipped: budget"))
                continue
            case = new_case(layers, T)
            row["shipped"] = timed(case, contextlib.nullcontext(), args.reps)
            for label, (order, mb) in VARIANTS.items():
                plan = prefetch_plan(w13, order, mb)
                row[label] = dict(timed(case, contextlib.nullcontext(), args.reps,
                                        warmed_call(plan, side)), plan=plan)
            row["shipped again"] = timed(case, contextlib.nullcontext(), args.reps)
            base = min(row[v]["us"] for v in ("shipped", "shipped again") if "us" in row[v])
            row["speedup"] = {v: round(base / row[v]["us"], 3) for v in VARIANTS if "us" in row[v]}
            row["pct_read_shipped"] = round(100 * case.fields["read_bytes"] / (base * 1e-6)
                                            / (ceil.read_gbps * 1e9), 1)
            rows.append(row)
            print(json.dumps(row), flush=True)
        del layers
        torch.cuda.empty_cache()
    props = torch.cuda.get_device_properties(0)
    meta = dict(metadata(), read_gbps=ceil.read_gbps, l2_mb=props.L2_cache_size / 2**20,
                seconds=round(time.time() - start))
    (out / "probe_l2_warm.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    for r in rows:
        print(r["preset"], r["format"], r.get("T"), r.get("shipped", {}).get("us"),
              r.get("shipped again", {}).get("us"), r.get("speedup"), r.get("note", ""))


if __name__ == "__main__":
    main()
