"""Grouped-GEMM tiles for the unfused decode path at 4-32 rows an expert (T = 64..256), in the
layer, one GPU call: the layer suite's T = 128 rows sit at 82-88% of the read ceiling (Mixtral
TP2, Scout TP8) against 92-94% at T = 64, where the heuristic takes other tiles. Each candidate
(grouped_gemm.configs.override: both GEMMs of the call) and the heuristic's own choice, checked
against float64, then timed as CUDA-graph replays over rotated weight copies and 8 inputs
(probe_combine's helpers). Writes $OUT/probe_mid_tiles.json.

    PYTHONPATH=src:benchmarks python benchmarks/probe_mid_tiles.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import torch

from probe_combine import N_SETS, _check, _graph_us, _layers
from shufflemoe import preset
from shufflemoe.bench.report import metadata
from shufflemoe.ops.grouped_gemm import configs as gg

C = gg.TileConfig
CANDIDATES = {  # block_k for bf16; fp8 doubles it (the same bytes a row)
    "16x128x128 w4 s3 swap cta2": C(16, 128, 128, 4, 3, swap_ab=True, ctas_per_sm=2),
    "16x64x128 w4 s3 swap cta2": C(16, 64, 128, 4, 3, swap_ab=True, ctas_per_sm=2),
    "32x128x128 w4 s4 swap": C(32, 128, 128, 4, 4, swap_ab=True),
    "32x128x64 w4 s4 swap cta2": C(32, 128, 64, 4, 4, swap_ab=True, ctas_per_sm=2),
    "64x128x64 w4 s4 cta2": C(64, 128, 64, 4, 4, ctas_per_sm=2),
    "64x128x128 w4 s3 swap cta2": C(64, 128, 128, 4, 3, swap_ab=True, ctas_per_sm=2),
    "128x128x128 w8 s3": C(128, 128, 128, 8, 3),
}
CASES = [("mixtral-tp2", "none", (128, 256)), ("mixtral-tp2", "fp8_rowwise", (64, 128)),
         ("scout-tp8", "none", (128,)), ("scout-tp8", "fp8_rowwise", (64, 128)),
         ("qwen3-30b-a3b", "none", (64, 128)), ("qwen3-30b-a3b", "fp8_rowwise", (64, 128))]
MORE = [("qwen3-30b-a3b", "none", (256, 512)), ("qwen3-30b-a3b", "fp8_rowwise", (512,)),
        ("scout-tp8", "none", (512, 1024)), ("scout-tp8", "fp8_rowwise", (512, 1024)),
        ("mixtral-tp2", "fp8_rowwise", (256,))]  # --more: the middle rule's other shapes
PRESETS = {"mixtral-tp2": preset("mixtral-8x7b", tp=2), "scout-tp8": preset("llama4-scout", tp=8),
           "qwen3-30b-a3b": preset("qwen3-30b-a3b")}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=pathlib.Path)
    p.add_argument("--budget", type=float, default=300.0)
    p.add_argument("--more", action="store_true", help="the MORE cases instead of CASES")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    deadline = time.time() + args.budget
    rows = []
    for name, fmt, Ts in MORE if args.more else CASES:
        cfg = PRESETS[name].replace(quantization=fmt)
        layers = _layers(cfg, "cuda", False)
        for T in Ts:
            xs = [torch.randn(T, cfg.hidden_size, device="cuda", dtype=cfg.dtype) for _ in range(N_SETS)]
            row = dict(preset=name, format=fmt, T=T)
            row["heuristic"] = dict(check=_check(layers[0], xs[0]), **_graph_us(layers, xs, False))
            for label, c in CANDIDATES.items():
                if time.time() > deadline:
                    row[label] = dict(note="skipped: time budget")
                    continue
                if fmt != "none":
                    c = c.with_(block_k=2 * c.block_k)
                try:
                    with gg.override(c):
                        row[label] = dict(check=_check(layers[0], xs[0]), **_graph_us(layers, xs, False))
                except Exception as e:  # noqa: BLE001 - a tile the kernel refuses: say so, go on
                    torch.cuda.synchronize()
                    row[label] = dict(note=f"error: {type(e).__name__}: {str(e)[:200]}")
            row["heuristic_again"] = _graph_us(layers, xs, False)
            rows.append(row)
            best = min((v["us"], k) for k, v in row.items() if isinstance(v, dict) and v.get("us"))
            print(f"{name} {fmt} T={T}: heuristic {row['heuristic']['us']:.1f} / "
                  f"{row['heuristic_again']['us']:.1f} us, best {best[1]} {best[0]:.1f}; "
                  + ", ".join(f"{k} {v['us']:.1f}" for k, v in row.items()
                              if isinstance(v, dict) and v.get("us")), flush=True)
        del layers
        torch.cuda.empty_cache()
    (args.out / f"probe_mid_tiles{'_more' if args.more else ''}.json").write_text(json.dumps(dict(meta=metadata(), rows=rows), indent=1))


if __name__ == "__main__":
    main()
