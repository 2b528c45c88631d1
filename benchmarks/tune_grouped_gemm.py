"""Sweep grouped GEMM tile configurations over the spec's shapes on the GPU (one device call).

    PYTHONPATH=src python benchmarks/tune_grouped_gemm.py --out $OUT/tune.json [--budget 170]

For each shape (the spec's, the sweep's middle and its smallest batches) and dtype: torch's peer,
then each candidate config of the shape's class and the heuristic's own choice, each checked
against the peer's output before it is timed (CUDA-graph replays, rotating weight sets so they
do not sit in L2). Prints one line per shape: the best config, the heuristic's time. Results
feed configs._heuristic and benchmarks/notes/grouped_gemm.md.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import shufflemoe.bench.suites.grouped_gemm as gg
from shufflemoe.bench.suites.grouped_gemm import (SPEC_US, Case, _config_name, _inputs, _ours,
                                                  _torch)
from shufflemoe.bench.ceilings import measure_ceilings
from shufflemoe.bench.report import metadata
from shufflemoe.bench.timing import rotations, time_fn
from shufflemoe.ops import FP8_DTYPE, grouped_gemm
from shufflemoe.ops.grouped_gemm import configs

T = configs.TileConfig
H = dict(tma="host")
# Candidates per shape class, block_k for bf16 (fp8 doubles it: same bytes per row). Run 1 (see
# benchmarks/notes/grouped_gemm.md) swept wider lists; these check its winners and the rest.
DECODE = [
    T(16, 128, 128, 4, 3, swap_ab=True, ctas_per_sm=2, **H),
    T(16, 128, 128, 4, 3, swap_ab=True, ctas_per_sm=2, flatten=True, **H),
    T(16, 128, 128, 4, 4, swap_ab=True, **H),
    T(16, 64, 128, 4, 6, swap_ab=True, flatten=True, **H),
]
TINY = [  # few active groups (M < G): narrower tiles spread one expert's weights over the SMs
    T(16, 128, 128, 4, 3, swap_ab=True, ctas_per_sm=2, **H),
    T(16, 64, 128, 4, 3, swap_ab=True, ctas_per_sm=2, **H),
    T(16, 32, 128, 4, 5, ctas_per_sm=2, **H),
    T(16, 16, 128, 4, 5, ctas_per_sm=2, **H),
    T(16, 16, 128, 4, 8, **H),
    # deeper K steps: a program with one narrow weight tile is latency bound (bytes in flight =
    # stages x block_n x block_k), so these put 2-4x more of its weights in flight
    T(16, 16, 256, 4, 8, **H),
    T(16, 32, 256, 4, 6, **H),
    T(16, 16, 256, 4, 4, ctas_per_sm=2, **H),
    T(16, 32, 256, 4, 4, ctas_per_sm=2, **H),
    T(16, 64, 256, 4, 4, swap_ab=True, **H),
    T(16, 16, 512, 4, 4, tma="none"),
    T(16, 32, 512, 4, 3, tma="none"),
]
MID = [  # run 2 had the 32-row ones; the sweep's uneven groups favour the 64-row tiles (notes)
    T(64, 128, 64, 4, 4, ctas_per_sm=2, **H),
    T(32, 128, 128, 4, 4, swap_ab=True, **H),
    T(32, 128, 64, 4, 4, swap_ab=True, ctas_per_sm=2, **H),
    T(64, 128, 128, 4, 3, swap_ab=True, ctas_per_sm=2, **H),
]
PREFILL = [
    T(128, 256, 64, 8, 3, flatten=True, **H),
    T(128, 256, 64, 8, 3, **H),
    T(128, 256, 64, 8, 3, flatten=True, tma="device"),
    T(128, 128, 64, 4, 3, ctas_per_sm=2, **H),
    T(128, 128, 128, 8, 3, **H),
]


def shapes() -> list[tuple[str, list[int], int, int, list]]:
    """(label, m_sizes, N, K, candidates): the spec's shapes, the sweep's middle, and its smallest
    batches (one token on Llama-4-Scout's 16 experts; Qwen2's top-8 of 64)."""
    out = []
    for (G, M, N, K) in SPEC_US["bf16"]:
        out.append((f"G={G} M={M} N={N} K={K}", [M] * G, N, K, DECODE if M <= 8 else PREFILL))
    for (G, M, N, K) in [(16, 64, 2048, 5120), (64, 32, 1280, 3584)]:
        out.append((f"G={G} M={M} N={N} K={K}", [M] * G, N, K, MID))
    one = [0] * 16
    one[5] = 1
    four = [0] * 16
    for e in (1, 6, 7, 12):
        four[e] = 1
    eight = [0] * 64
    for e in (3, 9, 17, 22, 38, 41, 50, 63):
        eight[e] = 1
    qwen3 = [0] * 128
    for e in (2, 19, 33, 47, 64, 90, 101, 127):
        qwen3[e] = 1
    out += [("scout T=1 gemm13", one, 2048, 5120, TINY), ("scout T=1 gemm2", one, 5120, 1024, TINY),
            ("scout T=4 gemm13", four, 2048, 5120, TINY),
            ("qwen2 T=1 gemm13", eight, 1280, 3584, TINY),
            ("qwen2 T=1 gemm2", eight, 3584, 640, TINY),
            ("qwen3 T=1 gemm13", qwen3, 1536, 2048, TINY),
            ("qwen3 T=1 gemm2", qwen3, 2048, 768, TINY)]
    # the batch sweep's own uneven groups (random top-k, seeded as grouped_gemm_sweep) where rows
    # per group cross the heuristic's 64 / 128 bounds and torch came closest
    for model, (E, k, gemms) in gg.SWEEP_MODELS.items():
        for gemm, N, K in gemms:
            for batch in (256, 512, 1024, 2048):
                out.append((f"sweep {model} {gemm} T={batch}",
                            gg.topk_m_sizes(batch, E, k, seed=batch), N, K, MID + PREFILL))
    return out


def for_dtype(cfg: configs.TileConfig, dtype: str) -> configs.TileConfig:
    """fp8 doubles block_k (same bytes per row); a TMA box holds at most 256 elements a side."""
    if dtype != "fp8":
        return cfg
    return cfg.with_(block_k=2 * cfg.block_k, tma=cfg.tma if 2 * cfg.block_k <= 256 else "none")


def _ours_reference(d: dict) -> torch.Tensor:
    return grouped_gemm(d["x"], d["w"], d["m_sizes"], x_scale=d.get("x_scale"),
                        w_scale=d.get("w_scale"), impl="torch")


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def scatter_cost(dtype: str, G: int, M: int, N: int, K: int, reps: int) -> dict:
    """Plain store vs row_weights + scatter-add epilogue (top-1: one row per token)."""
    d = _inputs(Case(dtype, [M] * G, N, K), 0)
    rows = G * M
    ids = torch.randperm(rows, device=gg.DEVICE)
    rw = torch.rand(rows, device=gg.DEVICE)
    target = torch.randn(rows, N, device=gg.DEVICE).to(torch.bfloat16)
    plain = time_fn(lambda i: _ours(d), 1, reps=reps).median_us
    scat = time_fn(lambda i: grouped_gemm(d["x"], d["w"], d["m_sizes"], x_scale=d.get("x_scale"),
                                          w_scale=d.get("w_scale"), row_weights=rw,
                                          scatter_ids=ids, out=target), 1, reps=reps).median_us
    return dict(dtype=dtype, shape=f"G={G} M={M} N={N} K={K}", plain_us=plain, scatter_us=scat)


def tune_shape(dtype: str, label: str, m_sizes: list[int], N: int, K: int, cands: list,
               reps: int, copy_gbps: float) -> tuple[dict, str]:
    """Time the peer and each candidate (plus the heuristic's choice) on one shape."""
    G = len(m_sizes)
    case = Case(dtype, m_sizes, N, K)
    nbytes = case.read_bytes() + case.write_bytes()
    n_sets = rotations(nbytes)  # small cases: enough weight sets that L2 cannot hold them
    sets = [_inputs(case, seed) for seed in range(n_sets)]
    d = sets[0]
    try:
        ref = _torch(d)
        peer = time_fn(lambda i: _torch(sets[i]), n_sets, reps=reps).median_us
    except RuntimeError as e:  # no peer for this case: check against our torch reference
        print(f"peer failed on {dtype} {label}: {str(e)[:200]}", flush=True)
        ref, peer = _ours_reference(d), float("nan")
    heur = configs.select(case.rows, N, K, G, FP8_DTYPE if dtype == "fp8" else torch.bfloat16)
    cands = [for_dtype(c, dtype) for c in cands]
    if heur not in cands:
        cands.append(heur)
    entry = dict(dtype=dtype, label=label, m_sizes=m_sizes, N=N, K=K, torch_us=peer,
                 spec_us=SPEC_US[dtype].get((G, case.rows // G, N, K), float("nan")),
                 gb=nbytes / 1e9, tflop=case.flops() / 1e12, configs=[])
    for cfg in cands:
        rec = dict(config=_config_name(cfg))
        try:
            with configs.override(cfg):
                d["out"].fill_(float("nan"))
                err = rel_err(_ours(d)[:case.rows], ref)
                t = time_fn(lambda i: _ours(sets[i]), n_sets, reps=reps)
                rec.update(err=err, us=t.median_us)
            rec.update(gbps=nbytes / rec["us"] / 1e3, tflops=case.flops() / rec["us"] / 1e6,
                       speedup=peer / rec["us"], ok=err < 2e-2)
        except Exception as e:  # a config that does not compile or fit: record and go on
            rec.update(error=f"{type(e).__name__}: {str(e)[:300]}")
        rec["heuristic"] = cfg == heur
        entry["configs"].append(rec)
        print(json.dumps(dict(shape=f"{dtype} {label}", **rec)), flush=True)
    good = [c for c in entry["configs"] if c.get("ok")]
    best = min(good, key=lambda c: c["us"]) if good else None
    mine = next((c for c in entry["configs"] if c["heuristic"]), None)
    line = (f"{dtype} {label:26s}: torch {peer:7.1f}  spec {entry['spec_us']:7.1f}  "
            + (f"best {best['us']:7.1f} ({100 * best['gbps'] / copy_gbps:5.1f}% copy, "
               f"{best['tflops']:5.0f} TF, {best['speedup']:.2f}x) [{best['config']}]"
               if best else "no valid config")
            + (f"  heur {mine.get('us', float('nan')):7.1f}" if mine else ""))
    return entry, line


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget", type=float, default=170.0, help="seconds; later shapes are skipped")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--only", default="", help="tune only shapes whose label contains this")
    args = ap.parse_args()
    t0 = time.time()
    ceil = measure_ceilings()
    print("ceilings", ceil.as_dict(), flush=True)
    results: dict = dict(meta=metadata(), ceilings=ceil.as_dict(), shapes=[], scatter=[])
    summary = []
    for dtype in ("bf16", "fp8"):
        for label, m_sizes, N, K, cands in shapes():
            if args.only not in label:
                continue
            if time.time() - t0 > args.budget:
                summary.append(f"{dtype} {label}: skipped (budget)")
                continue
            entry, line = tune_shape(dtype, label, m_sizes, N, K, cands, args.reps,
                                     ceil.copy_gbps)
            results["shapes"].append(entry)
            summary.append(line)
            torch.cuda.empty_cache()
    for dtype in ("bf16", "fp8"):
        for shape in ((16, 8, 5120, 1024), (16, 1024, 5120, 1024)):
            if not args.only and time.time() - t0 < args.budget + 20:
                results["scatter"].append(scatter_cost(dtype, *shape, reps=args.reps))
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    print("\n== tune summary (us; % of copy bandwidth; TFLOP/s; speedup vs torch)")
    print("\n".join(summary))
    for s in results["scatter"]:
        print(f"scatter epilogue {s['dtype']} {s['shape']}: plain {s['plain_us']:.1f} us, "
              f"row_weights+scatter {s['scatter_us']:.1f} us")
    print(f"tune took {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
