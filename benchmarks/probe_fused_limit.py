"""Where the fused decode path should stop: the layer as shipped against configs.ALWAYS (the two
fused launches at every A, every format) past today's Switch limits (one GPU call).

The layer suite at d1f07f0 (H200, CUDA graphs) has Llama 4 Scout TP8 bf16 at 88.9% of the read
ceiling at T = 64 (A = 64: fused) and 83.3% at T = 128 (A = 128 > Switch.max_pairs: the
four-launch path), for about the same bytes; fp8 rowwise and the other formats leave the fused
path sooner still (Scout fp8 rowwise 45.8-73.2%). Each case: the layer (CUDA-graph replays over
rotated weight copies and input sets, the suite's _Case) as shipped, then under ALWAYS, then as
shipped again (drift shows), every variant checked against float64. Writes
$OUT/probe_fused_limit.json.

--set fp8: fp8 rowwise top-1 (below fp8_min_top_k), where tune_decode's layer phase on an H200
had the fused path faster (Llama 4 TP8 at T = 2..8, one sample each), against Switch(fp8=True)
alone (no other limit moved; its times are the rows' "always" column). Its run at 2862b2b set
Switch.fp8_top1_tokens for the H200; writes $OUT/probe_fused_limit_fp8.json.

--set fp8_few: fp8 rowwise layers of a few experts a token that the Switch keeps unfused
(Mixtral TP2, k = 2, below fp8_min_top_k; Qwen3-30B-A3B at T = 8, A = 64 past fp8_max_pairs),
against Switch(fp8=True): the four-launch path's silu_mul_fp8 alone takes 5.2 us of Mixtral's
T = 1 on an H100 (results/probe_timeline_t1_59f9f6f.txt); writes
$OUT/probe_fused_limit_fp8_few.json. At 428ae92 on an H100 the fused path lost there (0.92-1.00x,
results/probe_fused_limit_fp8_few_428ae92.json), while --set fp8 had Llama 4 top-1 1.02-1.04x
faster fused at T = 4 and 8 (results/probe_fused_limit_fp8_428ae92.json).

    PYTHONPATH=src python benchmarks/probe_fused_limit.py --out $OUT [--budget 400]
        [--presets llama4-scout-tp8] [--reps 20] [--set fp8 | fp8_few]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
import time

import torch

from shufflemoe import MoE
from shufflemoe.bench.ceilings import measure_ceilings
from shufflemoe.bench.report import metadata
from shufflemoe.bench.suites.layer import (N_SETS, PRESETS, _Case, _call, _copies, expert_bytes,
                                           fixed_bytes)
from shufflemoe.ops.moe_decode import configs

# (preset, format, T values), most telling first (the deadline skips the tail)
CASES = (
    ("llama4-scout-tp8", "none", (128, 256)),
    ("mixtral-8x7b-tp2", "none", (64, 128)),
    ("qwen3-30b-a3b", "none", (16, 32, 64)),
    ("llama4-maverick-tp8", "none", (128, 256)),
    ("llama4-scout-tp8", "fp8_rowwise", (8, 64, 128)),
    ("llama4-maverick-tp8", "fp8_rowwise", (64, 128)),
    ("qwen3-30b-a3b", "fp8_rowwise", (8, 64)),
    ("mixtral-8x7b-tp2", "fp8_rowwise", (8, 64)),
    ("llama4-scout-tp8", "fp8_w8a16", (8, 64)),
    ("llama4-scout-tp8", "fp8_block", (8, 64)),
    ("llama4-maverick-tp8", "fp8_w8a16", (64,)),
    ("qwen3-30b-a3b", "fp8_block", (8, 64)),
)
CASES_FP8 = (
    ("llama4-scout-tp8", "fp8_rowwise", (2, 4, 8, 16)),
    ("llama4-maverick-tp8", "fp8_rowwise", (2, 4, 8, 16)),
)
CASES_FP8_FEW = (
    ("mixtral-8x7b-tp2", "fp8_rowwise", (1, 2, 4)),
    ("qwen3-30b-a3b", "fp8_rowwise", (8,)),
)
SETS = {"limit": (CASES, configs.ALWAYS, "probe_fused_limit.json"),
        "fp8": (CASES_FP8, configs.Switch(fp8=True), "probe_fused_limit_fp8.json"),
        "fp8_few": (CASES_FP8_FEW, configs.Switch(fp8=True), "probe_fused_limit_fp8_few.json")}


def probe_start(name: str, budget: float = 400.0, reps: int = 20, **flags) -> tuple:
    """The probes' command line, parsed: --out (default /tmp/<name>), --budget (seconds),
    --reps, and ``flags`` (flag -> argparse keywords); (args, the start time, --out made)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=f"/tmp/{name}")
    ap.add_argument("--budget", type=float, default=budget)
    ap.add_argument("--reps", type=int, default=reps)
    for flag, keywords in flags.items():
        ap.add_argument(f"--{flag}", **keywords)
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return args, time.time(), out


def rotated_layers(cfg, most_tokens: int) -> list:
    """The layer (seed 0) and the weight copies the layer suite would rotate through for up to
    most_tokens tokens (one pass over their activated bytes reads more than twice L2)."""
    torch.manual_seed(0)
    first = MoE(cfg, device="cuda")
    n = _copies(first, expert_bytes(first) * min(cfg.num_experts, most_tokens * cfg.top_k)
                + fixed_bytes(first))
    return [first] + [MoE(cfg, device="cuda") for _ in range(n - 1)]


def new_case(layers: list, T: int) -> _Case:
    """The suite's case: the layers and N_SETS fresh input sets of T tokens."""
    cfg = layers[0].config
    return _Case(layers, [torch.randn(T, cfg.hidden_size, device="cuda", dtype=cfg.dtype)
                          for _ in range(N_SETS)])


def timed(case: _Case, context, reps: int, fn=_call) -> dict:
    """The case's layer (``fn(layer, x)``) in CUDA-graph replays inside ``context``: median us
    [p20, p80] and its check against float64, or why it failed (a variant that fails is a row)."""
    try:
        with context:
            timing, check = case.time(fn, "graph", reps, check=True)
    except Exception as e:  # noqa: BLE001
        return dict(note=f"failed: {type(e).__name__}: {str(e)[:200]}")
    return dict(us=round(timing["us"], 1), p20=round(timing["us_lo"], 1),
                p80=round(timing["us_hi"], 1), check=check)


def main() -> None:
    args, start, out = probe_start("probe_fused_limit", presets=dict(default=""),
                                   set=dict(default="limit", choices=sorted(SETS)))
    cases, switch, file = SETS[args.set]
    ceil = measure_ceilings()
    by_name = {p.name: p for p in PRESETS}
    gpu = torch.cuda.get_device_name()
    rows = []
    for name, fmt, Ts in cases:
        if args.presets and name not in args.presets.split(","):
            continue
        cfg = by_name[name].cfg.replace(quantization=fmt)
        if time.time() - start > args.budget:
            rows.append(dict(preset=name, format=fmt, note="skipped: budget"))
            continue
        layers = rotated_layers(cfg, max(Ts))
        for T in Ts:
            row = dict(preset=name, format=fmt, T=T, pairs=T * cfg.top_k,
                       fused_by_default=configs.use_fused(T * cfg.top_k, cfg.top_k, fmt,
                                                          cfg.num_experts, device=gpu))
            if time.time() - start > args.budget:
                rows.append(dict(row, note="skipped: budget"))
                continue
            case = new_case(layers, T)
            for variant in ("shipped", "always", "shipped again"):
                row[variant] = timed(case, configs.override(switch) if variant == "always"
                                     else contextlib.nullcontext(), args.reps)
            shipped = [row[v]["us"] for v in ("shipped", "shipped again") if "us" in row[v]]
            if shipped and "us" in row["always"]:
                row["shipped_over_always"] = round(min(shipped) / row["always"]["us"], 3)
                row["pct_read_shipped"] = round(100 * case.fields["read_bytes"] / (
                    min(shipped) * 1e-6) / (ceil.read_gbps * 1e9), 1)
            rows.append(row)
            print(json.dumps(row), flush=True)
        del layers
        torch.cuda.empty_cache()
    meta = dict(metadata(), read_gbps=ceil.read_gbps, seconds=round(time.time() - start))
    (out / file).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    for r in rows:
        print(r["preset"], r["format"], r.get("T"), r.get("fused_by_default"),
              r.get("shipped", {}).get("us"), r.get("always", {}).get("us"),
              r.get("shipped again", {}).get("us"), r.get("shipped_over_always"),
              r.get("pct_read_shipped"), r.get("always", {}).get("check"), r.get("note", ""))


if __name__ == "__main__":
    main()
