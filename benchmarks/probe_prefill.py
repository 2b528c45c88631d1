"""Where a prefill layer call's GPU time goes, and what could shorten it (one GPU call, H100).

For Llama 4 Scout TP8 and Maverick TP8, bf16 and fp8 rowwise, T = 16384 (top-1, a shared expert;
Scout also at T = 2048):
1. the layer in a CUDA graph: its time, against dense cuBLAS doing the same FLOPs in the same
   precisions (the layer suite's reference and pct_dense), and each kernel's duration (CUPTI,
   one call);
2. the layer's other flows in the same run: the shared expert first and the routed rows added
   onto its output (before the routed experts wrote out first), and that with the shared expert
   on its own stream beside the routed experts;
3. each routed grouped GEMM alone (GEMM13; GEMM2 storing rows in order, adding them into
   out[token], storing them there) under the heuristic and every PREFILL_CANDIDATES tile, in
   TFLOP/s.

    PYTHONPATH=src python benchmarks/probe_prefill.py --out $OUT [--budget 420]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import sys
import time
from collections import defaultdict

import torch
import triton
from torch.profiler import ProfilerActivity, profile

from shufflemoe import MoE, preset
from shufflemoe.bench.ceilings import measure_ceilings
from shufflemoe.bench.suites.layer import _dense  # the layer suite's dense reference
from shufflemoe.bench.timing import time_fn
from shufflemoe.experts.base import expert_gemm, gather_input, glu, pair_weights
from shufflemoe.ops import backend_for
from shufflemoe.ops.grouped_gemm import configs as gg_configs

PRESETS = {"scout-tp8": preset("llama4-scout", tp=8),
           "maverick-tp8": preset("llama4-maverick", tp=8)}
T = 16384


def kernels_of(fn) -> list[tuple[str, float, float]]:
    """(kernel name, start us, duration us) of one call of fn (already warm)."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    ev = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                key=lambda e: e.time_range.start)
    t0 = ev[0].time_range.start if ev else 0
    return [(e.name[:70], e.time_range.start - t0, e.time_range.end - e.time_range.start)
            for e in ev]


def layer_rows(name: str, fmt: str, T: int, out: dict, deadline: float) -> None:
    cfg = PRESETS[name].replace(quantization=fmt)
    D, I, Is = cfg.hidden_size, cfg.intermediate_size, cfg.shared_intermediate_size
    routed, shared = 6.0 * T * D * I * cfg.top_k, 6.0 * T * D * Is
    dense = (_dense(T, D, routed, fmt == "fp8_rowwise", reps=10).median_us
             + _dense(T, D, shared, False, reps=10).median_us)
    layer = MoE(cfg, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    xs = [torch.randn(T, D, device="cuda", generator=g).to(cfg.dtype) for _ in range(2)]
    key = f"{name} {fmt} T={T}"
    res = out.setdefault(key, {"dense_us": dense, "routed_gflop": routed / 1e9,
                               "shared_gflop": shared / 1e9})
    with torch.no_grad():
        t = time_fn(lambda i: layer(xs[i]), 2, reps=10)
        res["layer_us"] = t.median_us
        res["pct_dense"] = 100 * dense / t.median_us
        print(f"\n== {key}: layer {t.median_us:.0f} us [{t.p20_us:.0f}, {t.p80_us:.0f}], dense "
              f"{dense:.0f} us -> {res['pct_dense']:.1f}%", flush=True)
        ks = kernels_of(lambda: layer(xs[0]))
        res["kernels"] = ks
        by = defaultdict(float)
        for kname, start, dur in ks:
            print(f"   at {start:8.1f}  dur {dur:8.1f}  {kname}")
            by[kname] += dur
        res["kernel_sum_us"] = sum(by.values())
        # the shared expert first, the routed rows added onto it: on one stream, then on its
        # own stream (captured: T <= shared_stream_max_tokens)
        layer._routed_first = lambda x: False
        t = time_fn(lambda i: layer(xs[i]), 2, reps=10)
        del layer._routed_first
        side = MoE(cfg.replace(shared_stream_max_tokens=1 << 20), device="cuda")
        side.load_state_dict(layer.state_dict())
        ts = time_fn(lambda i: side(xs[i]), 2, reps=10)
        del side
        for label, tt in (("shared_first", t), ("shared_first_side_stream", ts)):
            res[f"{label}_us"] = tt.median_us
            print(f"   {label}: {tt.median_us:.0f} us ({100 * dense / tt.median_us:.1f}% of dense)",
                  flush=True)
        gemm_rows(layer, xs[0], cfg, res, deadline)
    del layer
    torch.cuda.empty_cache()


def gemm_rows(layer: MoE, x: torch.Tensor, cfg, res: dict, deadline: float) -> None:
    """Routed GEMM13 and GEMM2 (rows stored / added into out[token]) per tile candidate."""
    ops, w = backend_for(x), layer.expert_weights
    r = layer.route(x)
    w_in, w_out = pair_weights(r, cfg)
    xs = gather_input(ops, x, r.token_ids, w_in, w)
    h = expert_gemm(ops, xs, w, "w13", r.counts, cfg.dtype)
    a = glu(ops, h, w, cfg)
    out = torch.zeros_like(x)
    A, D, I = x.shape[0], cfg.hidden_size, cfg.intermediate_size
    f13, f2 = 2.0 * A * D * 2 * I, 2.0 * A * I * D
    cases = {
        "gemm13": (f13, lambda: expert_gemm(ops, xs, w, "w13", r.counts, cfg.dtype)),
        "gemm2 store": (f2, lambda: expert_gemm(ops, a, w, "w2", r.counts, cfg.dtype,
                                                row_weights=w_out)),
        "gemm2 add": (f2, lambda: expert_gemm(ops, a, w, "w2", r.counts, cfg.dtype,
                                              row_weights=w_out, scatter_ids=r.token_ids, out=out,
                                              scatter="add_unique")),
        "gemm2 store into": (f2, lambda: expert_gemm(ops, a, w, "w2", r.counts, cfg.dtype,
                                                     row_weights=w_out, scatter_ids=r.token_ids,
                                                     out=out, scatter="store")),
    }
    for step, fn in (("gather", lambda: gather_input(ops, x, r.token_ids, w_in, w)),
                     ("silu_mul", lambda: glu(ops, h, w, cfg))):
        t = time_fn(lambda i: fn(), 1, reps=10)
        res[f"{step}_us"] = t.median_us
        print(f"   {step}: {t.median_us:.1f} us", flush=True)
    wdt = w.w13.dtype
    names = ["heuristic"] + list(gg_configs.PREFILL_CANDIDATES)
    for case, (flops, fn) in cases.items():
        for cand in names:
            if time.time() > deadline:
                print(f"   budget: skipped {case} {cand}")
                continue
            ctx = (gg_configs.override(gg_configs.prefill_candidate(cand, wdt))
                   if cand != "heuristic" else contextlib.nullcontext())
            try:
                with ctx:
                    t = time_fn(lambda i: fn(), 1, reps=10)
            except Exception as e:  # a candidate that does not compile for this dtype
                print(f"   {case} {cand}: {type(e).__name__}: {str(e)[:120]}")
                continue
            res.setdefault("gemms", []).append(dict(case=case, candidate=cand, us=t.median_us,
                                                    tflops=flops / t.median_us / 1e6))
            print(f"   {case:12s} {cand:24s} {t.median_us:8.1f} us  "
                  f"{flops / t.median_us / 1e6:6.0f} TFLOP/s", flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    p.add_argument("--budget", type=float, default=420)
    args = p.parse_args()
    start = time.time()
    ceil = measure_ceilings()
    out: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                 "triton": triton.__version__, "commit": os.environ.get("SHUFFLEMOE_COMMIT", "?"),
                 "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 "ceilings": ceil.__dict__, "rows": {}}
    print(f"{out['device']}: bf16 {ceil.bf16_tflops:.0f} TF, fp8 {ceil.fp8_tflops:.0f} TF, "
          f"read {ceil.read_gbps:.0f} GB/s", flush=True)
    cases = [(n, f, t) for n, ts in (("scout-tp8", (T, 2048)), ("maverick-tp8", (T,)))
             for t in ts for f in ("none", "fp8_rowwise")]
    for i, (name, fmt, t) in enumerate(cases):
        deadline = start + args.budget * (i + 1) / len(cases)
        try:
            layer_rows(name, fmt, t, out["rows"], deadline)
        except Exception as e:
            print(f"{name} {fmt}: {type(e).__name__}: {e}", flush=True)
        torch.cuda.empty_cache()
    path = pathlib.Path(args.out) / "probe_prefill.json"
    path.write_text(json.dumps(out, indent=1, default=str))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
    sys.exit(0)
