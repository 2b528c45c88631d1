"""GEMM13 taking the GLU past GLU_MAX_ROWS, now that a non-swapped GLU tile is one dot (one call).

The GLU in GEMM13's epilogue lost where the MMAs bound the GEMM (H200, probe_gather_gemm_2809e21:
Qwen3-30B-A3B T = 2048 0.80x, Scout TP8 T = 16384 0.87x, Mixtral TP2 T = 2048 0.85x) when a tile
made two dots a K step (gate and up, N = BLOCK_N each, x's tile read by both). Non-swapped GLU
tiles now load gate and up rows in one TMA box and make one dot as wide as a plain tile's, so the
MMAs are GEMM13's own and the GLU should only drop silu_mul's launch and h's round trip. The
shared expert's gate_up (Scout's) is cuBLAS and silu_mul today; glu+shared also runs it as the
grouped GEMM of one group with the GLU. Each case: the layer (CUDA-graph replays over rotated
weights and inputs, the layer suite's _Case) as shipped (silu_mul past GLU_MAX_ROWS pairs an
expert), with the GLU in GEMM13 at every row count (glu), glu+shared, and as shipped again,
every variant checked against float64. Writes $OUT/probe_glu_prefill.json.

    PYTHONPATH=src python benchmarks/probe_glu_prefill.py --out $OUT [--budget 400] [--reps 10]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
import time

import torch

from probe_fused_limit import new_case, rotated_layers, timed
from shufflemoe import MoE, ops, preset
from shufflemoe.bench.report import metadata
from shufflemoe.experts import shuffled

CASES = (  # (model, tp, format, T values), most telling first
    ("qwen3-30b-a3b", 1, "none", (2048, 512, 16384)),
    ("llama4-scout", 8, "none", (16384, 2048)),
    ("mixtral-8x7b", 2, "none", (2048, 512)),
    ("gpt-oss-120b", 1, "none", (2048,)),
)


@contextlib.contextmanager
def glu_everywhere():
    """GEMM13 takes the GLU at every row count (where _glu_in_gemm's other terms allow)."""
    most = shuffled.GLU_MAX_ROWS
    shuffled.GLU_MAX_ROWS = 1 << 30
    try:
        yield
    finally:
        shuffled.GLU_MAX_ROWS = most


_shipped_shared = MoE.shared_expert


def _shared_glu(self, x, out, part=None, accumulate=False):
    """MoE.shared_expert with gate_up as a one-group grouped GEMM taking the GLU (a plain,
    unsplit shared expert outside batch-invariant mode past the fused decode sizes; else as
    shipped)."""
    hot = self._hot()
    if (part is not None or self.shared_split or self.config.batch_invariant
            or hot.shared_gate is not None or self._fuses_shared(x, hot)):
        return _shipped_shared(self, x, out, part, accumulate)
    T = x.shape[0]
    m = torch.full((1,), T, dtype=torch.int32, device=x.device)
    a = ops.grouped_gemm(x, hot.shared_w13[None], m, glu="silu")  # as shipped: plain silu
    if accumulate:
        return out.addmm_(a, hot.shared_w2.t())
    return torch.mm(a, hot.shared_w2.t(), out=out)


@contextlib.contextmanager
def glu_and_shared():
    """glu_everywhere, and the shared expert's gate_up through the grouped GEMM's GLU."""
    MoE.shared_expert = _shared_glu
    try:
        with glu_everywhere():
            yield
    finally:
        MoE.shared_expert = _shipped_shared


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/probe_glu_prefill")
    ap.add_argument("--budget", type=float, default=400.0)
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    start = time.time()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    variants = {"shipped": contextlib.nullcontext, "glu": glu_everywhere,
                "glu+shared": glu_and_shared, "shipped again": contextlib.nullcontext}
    rows = []
    for model, tp, fmt, Ts in CASES:
        name = f"{model}-tp{tp}"
        if time.time() - start > args.budget:
            rows.append(dict(preset=name, format=fmt, note="skipped: budget"))
            continue
        cfg = preset(model, tp=tp).replace(quantization=fmt)
        layers = rotated_layers(cfg, max(Ts))
        for T in Ts:
            row = dict(preset=name, format=fmt, T=T, pairs_an_expert=T * cfg.top_k / cfg.num_experts)
            if time.time() - start > args.budget:
                rows.append(dict(row, note="skipped: budget"))
                continue
            case = new_case(layers, T)
            for v, context in variants.items():
                row[v] = timed(case, context(), args.reps)
            shipped = [row[v]["us"] for v in ("shipped", "shipped again") if "us" in row[v]]
            row["speedup"] = {v: round(min(shipped) / row[v]["us"], 3)
                              for v in ("glu", "glu+shared") if shipped and "us" in row[v]}
            rows.append(row)
            print(json.dumps(row), flush=True)
        del layers
        torch.cuda.empty_cache()
    meta = dict(metadata(), seconds=round(time.time() - start))
    (out / "probe_glu_prefill.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    for r in rows:
        print(r["preset"], r["format"], r.get("T"), *(r.get(v, {}).get("us") for v in variants),
              r.get("speedup"), *(r.get(v, {}).get("check") for v in variants), r.get("note", ""))


if __name__ == "__main__":
    main()
