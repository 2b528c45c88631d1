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
every variant checked against float64.

fold (Llama 4's top-1 prefill with a shared expert): the router's rows appended to the shared
expert's gate_up weights, so the one cuBLAS GEMM that reads x for the shared expert also gives
the logits (hT = [w13; router] @ x^T, [2 Is + E, T]), and the router GEMM's own read of x (~66 us
at Scout T = 16384 on an H100, memory bound) goes; the shared silu_mul runs on hT's gate and up
blocks as one flat row (elementwise), the down projection adds a^T's product into out as
before. fold+glu: both. Writes $OUT/probe_glu_prefill.json.

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
from shufflemoe.ops import backend_for
from shufflemoe.experts import shuffled

CASES = (  # (model, tp, format, T values), most telling first
    ("llama4-scout", 8, "none", (16384, 2048)),
    ("llama4-maverick", 8, "none", (16384,)),
    ("qwen3-30b-a3b", 1, "none", (2048, 512, 16384)),
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


_shipped_forward = MoE._forward
_FOLDED: dict[int, torch.Tensor] = {}  # id(layer) -> [shared_w13; router_weight]


def _folded_forward(self, x, hot=None, out=None):
    """MoE._forward with the router folded into the shared expert's gate_up GEMM where the
    routed experts write out first (top-1 prefill with a plain shared expert); else shipped."""
    hot = hot or self._hot()
    if out is not None or not (self._routed_first(x) and self.shared_w13 is not None):
        return _shipped_forward(self, x, hot, out)
    Is = self.config.shared_intermediate_size
    if id(self) not in _FOLDED:
        _FOLDED[id(self)] = torch.cat([hot.shared_w13, hot.router_weight])
    hT = torch.mm(_FOLDED[id(self)], x.t())  # [2 Is + E, T]: gate rows, up rows, logits
    out = torch.empty_like(x)
    self._route_and_run(hot, x, hT[2 * Is:].t().contiguous(), out, lambda: None, True)
    aT = backend_for(hT).silu_mul(hT[:2 * Is].view(1, -1), None, False, None)  # a^T's values
    return out.addmm_(aT.view(Is, -1).t(), hot.shared_w2.t())


@contextlib.contextmanager
def fold(glu: bool = False):
    """The router folded into the shared gate_up (and, with glu, glu_everywhere)."""
    MoE._forward = _folded_forward
    try:
        with glu_everywhere() if glu else contextlib.nullcontext():
            yield
    finally:
        MoE._forward = _shipped_forward


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/probe_glu_prefill")
    ap.add_argument("--budget", type=float, default=400.0)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--models", nargs="*", help="only these presets (default: all)")
    args = ap.parse_args()
    start = time.time()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    variants = {"shipped": contextlib.nullcontext, "glu": glu_everywhere,
                "glu+shared": glu_and_shared, "fold": fold, "fold+glu": lambda: fold(True),
                "shipped again": contextlib.nullcontext}
    rows = []
    for model, tp, fmt, Ts in CASES:
        name = f"{model}-tp{tp}"
        if args.models and model not in args.models:
            continue
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
                if v.startswith("fold") and not cfg.shared_intermediate_size:
                    continue  # no shared expert to fold the router into
                row[v] = timed(case, context(), args.reps)
            shipped = [row[v]["us"] for v in ("shipped", "shipped again") if "us" in row[v]]
            row["speedup"] = {v: round(min(shipped) / row[v]["us"], 3) for v in variants
                              if "shipped" not in v and shipped and "us" in row.get(v, {})}
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
