"""Which one-pair tiles stream mxfp4 decode weights fastest in the layer? probe_timeline (mxfp4)
had the GEMV at 0.4-1.3 TB/s of packed weights. One GPU call: mxfp4 layers (Llama 4 Scout and
Maverick TP8, Qwen3-30B-A3B, Mixtral TP2, gpt-oss-120b) at T = 1 in CUDA graphs (weights and inputs rotating, as the layer
suite does), the heuristic's tiles, then gate_up's tile varied with down's fixed, then down's with
the best gate_up (probe_merged_tiles.descend; K split to fill the SMs, or twice that); the best checked
against float64 and timed again beside the heuristic's. --tokens adds T > 1 rows for the top-1
presets (the others fuse mxfp4 at T = 1 only); --name names the output file. --mma descends over
16-pair MMA tiles instead (block_m = 16: the weights as wgmma's M side, their bytes in
mxfp4_run_order), against the one-pair tiles the heuristic picks.

    PYTHONPATH=src python benchmarks/probe_mxfp4_gemv.py --out $OUT [--budget 240]
        [--presets scout-tp8 ...] [--tokens 1 4 8] [--name probe_mxfp4_gemv] [--mma]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import torch

from shufflemoe import preset
from shufflemoe.bench.report import metadata
from shufflemoe.ops.moe_decode import configs

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from probe_combine import _check, _graph_us, _layers  # noqa: E402
from probe_merged_tiles import descend  # noqa: E402

PRESETS = {"scout-tp8": preset("llama4-scout", tp=8),
           "maverick-tp8": preset("llama4-maverick", tp=8),
           "qwen3-30b-a3b": preset("qwen3-30b-a3b"),
           "mixtral-tp2": preset("mixtral-8x7b", tp=2),
           "gpt-oss-120b": preset("gpt-oss-120b")}
# (block_n, block_k in values, warps, stages, split factor over configs.split_for)
TILES = ((32, 512, 4, 2, 1), (16, 512, 4, 2, 1), (8, 512, 4, 2, 1), (16, 512, 8, 2, 1),
         (32, 512, 8, 2, 1), (16, 512, 4, 2, 2), (8, 512, 4, 2, 2), (16, 1024, 4, 2, 1),
         (8, 1024, 4, 2, 1), (16, 256, 4, 2, 1))
# 16-pair tiles: (block_n, block_k in values, warps, stages, split factor, block_m)
MMA_TILES = ((64, 256, 4, 3, 1, 16), (64, 512, 4, 3, 1, 16), (64, 512, 4, 2, 1, 16),
             (64, 256, 4, 3, 2, 16))
N_SETS = 8


def gemm(tile, tiles_of, K: int, sms: int) -> configs.GemmConfig:
    bn, bk, warps, stages, more, block_m = (*tile, 1)[:6]
    split = configs.split_for(tiles_of(bn), -(-K // bk), sms) * more
    return configs.GemmConfig(bn, bk, max(1, min(split, -(-K // bk))), warps, stages,
                              block_m=block_m)


def mxfp4_only(plan: configs.DecodeConfig):
    """A chooser for configs.override: ``plan`` for the routed mxfp4 experts (uint8 weights),
    the usual choice for the rest (a shared expert in the model dtype)."""
    return lambda key: plan if key[4] == torch.uint8 else configs._choose(*key)


def _descend_row(name, T, layers, cfg, sms, deadline, tiles=TILES) -> dict:
    xs = [torch.randn(T, cfg.hidden_size, device="cuda", dtype=cfg.dtype) for _ in range(N_SETS)]
    D, I, E, k = cfg.hidden_size, cfg.intermediate_size, cfg.num_experts, cfg.top_k
    active = min(E, T * k)
    parts = {"gate_up": (lambda bn: active * -(-I // bn), D),
             "down": (lambda bn: active * -(-D // bn), I)}
    heur = configs.heuristic((T * k, E, D, I, torch.uint8, sms))

    def time_with(plan):
        with configs.override(mxfp4_only(plan)), torch.no_grad():
            return _graph_us(layers, xs, False)["us"]

    row = dict(preset=name, T=T, heuristic=[heur.gate_up.__dict__, heur.down.__dict__],
               heuristic_us=time_with(heur), tried=[])
    best = descend(heur, row["heuristic_us"],
                   [(part, tiles, lambda t, f=tiles_of, K=K: gemm(t, f, K, sms))
                    for part, (tiles_of, K) in parts.items()],
                   time_with, deadline, row["tried"])
    with configs.override(mxfp4_only(best)), torch.no_grad():
        row["check"] = _check(layers[0], xs[0])
    row["best"] = [best.gate_up.__dict__, best.down.__dict__]
    row["best_us"] = time_with(best)
    row["heuristic_again_us"] = time_with(heur)
    row["speedup"] = round(min(row["heuristic_us"], row["heuristic_again_us"]) / row["best_us"], 3)
    return row


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=pathlib.Path)
    p.add_argument("--budget", type=float, default=240.0)
    p.add_argument("--presets", nargs="+", default=list(PRESETS))
    p.add_argument("--tokens", nargs="+", type=int, default=[1])
    p.add_argument("--name", default="probe_mxfp4_gemv")
    p.add_argument("--mma", action="store_true", help="descend over 16-pair MMA tiles")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    deadline = time.time() + args.budget
    meta, rows = metadata(), []
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for name in args.presets:
        cfg = PRESETS[name].replace(quantization="mxfp4")
        layers = _layers(cfg, "cuda", False)
        k = cfg.top_k
        for T in [t for t in args.tokens if t == 1 or k == 1]:
            if time.time() > deadline:
                rows.append(dict(preset=name, T=T, skipped="time budget"))
                continue
            rows.append(_descend_row(name, T, layers, cfg, sms, deadline,
                                     MMA_TILES if args.mma else TILES))
            print(json.dumps({key: v for key, v in rows[-1].items() if key != "tried"}), flush=True)
        del layers
        torch.cuda.empty_cache()
    (args.out / f"{args.name}.json").write_text(json.dumps(dict(meta=meta, rows=rows),
                                                               indent=1))


if __name__ == "__main__":
    main()
