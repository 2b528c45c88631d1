"""Grouped-GEMM tiles for the unfused decode path at 4-32 rows an expert (T = 64..256), in the
layer, one GPU call: the layer suite's T = 128 rows sit at 82-88% of the read ceiling (Mixtral
TP2, Scout TP8) against 92-94% at T = 64, where the heuristic takes other tiles. Each candidate
(grouped_gemm.configs.override: both GEMMs of the call) and the heuristic's own choice, checked
against float64, then timed as CUDA-graph replays over rotated weight copies and 8 inputs
(probe_combine's helpers). Writes $OUT/probe_mid_tiles.json.

    PYTHONPATH=src:benchmarks python benchmarks/probe_mid_tiles.py --out $OUT [--more | --flat |
        --resident]

--flat: the heuristic's own tiles with the flattened (tile, k) loop (the next tile's loads issued
during this one's last steps and epilogue), with 2, 3 and 4 stages, on the T = 64 and 128 rows short
of the 92% target: at 4-8 rows an expert the swapped tiles' K loops are 3-8 steps long
(Qwen3-30B-A3B's down: K = 768), so each tile refills its pipeline.

--resident: Mixtral TP2 T = 128's swapped 64-row tiles (two programs an SM asked, one resident by
shared memory) against tiles with two or three resident, and one program an SM (see RESIDENT).
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
# --resident: the swapped 64-row tile that the heuristic takes at 17-64 rows a group (Mixtral TP2
# T = 128) asks for two programs an SM, but its three stages take 144 KB of shared memory (sm_90,
# offline): one is resident, the other waits for it. Tiles with two resident, and one program.
RESIDENT = [("mixtral-tp2", "none", (128,)), ("mixtral-tp2", "fp8_rowwise", (128,))]
RESIDENT_CANDIDATES = {  # block_k for bf16; fp8 doubles it (the same bytes a row)
    "64x128x128 w4 s3 swap cta2 (one resident)": C(64, 128, 128, 4, 3, swap_ab=True,
                                                   ctas_per_sm=2),
    "64x128x128 w4 s3 swap cta1": C(64, 128, 128, 4, 3, swap_ab=True),
    "64x128x128 w4 s2 swap cta2": C(64, 128, 128, 4, 2, swap_ab=True, ctas_per_sm=2),
    "64x128x64 w4 s4 swap cta2": C(64, 128, 64, 4, 4, swap_ab=True, ctas_per_sm=2),
    "64x128x64 w4 s3 swap cta3": C(64, 128, 64, 4, 3, swap_ab=True, ctas_per_sm=3),
}
FLAT = [("qwen3-30b-a3b", "fp8_rowwise", (64, 128)), ("qwen3-30b-a3b", "none", (128,)),
        ("mixtral-tp2", "fp8_rowwise", (64, 128)), ("scout-tp8", "fp8_rowwise", (64, 128)),
        ("scout-tp8", "none", (64, 128))]


def _flat(stages: int | None):
    """An override: the heuristic's tile for the key, flattened (and with ``stages``)."""
    def choose(key):
        c = gg._heuristic(*key).with_(flatten=True)
        return c if stages is None else c.with_(num_stages=stages)
    return choose


FLAT_CANDIDATES = {"heuristic flat": _flat(None), "heuristic flat s4": _flat(4),
                   "heuristic flat s2": _flat(2)}
PRESETS = {"mixtral-tp2": preset("mixtral-8x7b", tp=2), "scout-tp8": preset("llama4-scout", tp=8),
           "qwen3-30b-a3b": preset("qwen3-30b-a3b")}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=pathlib.Path)
    p.add_argument("--budget", type=float, default=300.0)
    p.add_argument("--more", action="store_true", help="the MORE cases instead of CASES")
    p.add_argument("--flat", action="store_true", help="FLAT_CANDIDATES on the FLAT cases")
    p.add_argument("--resident", action="store_true",
                   help="RESIDENT_CANDIDATES on the RESIDENT cases")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    deadline = time.time() + args.budget
    rows = []
    cases, candidates = (MORE if args.more else CASES), CANDIDATES
    if args.flat:
        cases, candidates = FLAT, FLAT_CANDIDATES
    if args.resident:
        cases, candidates = RESIDENT, RESIDENT_CANDIDATES
    for name, fmt, Ts in cases:
        cfg = PRESETS[name].replace(quantization=fmt)
        layers = _layers(cfg, "cuda", False)
        for T in Ts:
            xs = [torch.randn(T, cfg.hidden_size, device="cuda", dtype=cfg.dtype) for _ in range(N_SETS)]
            row = dict(preset=name, format=fmt, T=T)
            row["heuristic"] = dict(check=_check(layers[0], xs[0]), **_graph_us(layers, xs, False))
            for label, c in candidates.items():
                if time.time() > deadline:
                    row[label] = dict(note="skipped: time budget")
                    continue
                if fmt != "none" and not callable(c):
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
    tag = "_more" if args.more else "_flat" if args.flat else "_resident" if args.resident else ""
    (args.out / f"probe_mid_tiles{tag}.json").write_text(json.dumps(dict(meta=metadata(), rows=rows), indent=1))


if __name__ == "__main__":
    main()
