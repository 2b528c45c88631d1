"""Does the one-pair mxfp4 decode GEMV's K loop run faster when its loads are 16 bytes and issued
a step ahead? One process per source tree (the same script, PYTHONPATH pointing at each tree):
mxfp4 layers in CUDA graphs (weights and inputs rotating, as the layer suite does) at the fused
decode sizes, with the heuristic's tiles and two neighbours (8 warps; half the rows a tile), each
row checked against float64 first.

    git archive <commit> src | tar -x -C trees/<commit>   # a tree per commit, here
    export SHUFFLEMOE_COMMIT=<commit> PYTHONPATH=trees/<commit>/src
    python benchmarks/probe_mxfp4_loop.py --label <commit> --out $OUT
"""

from __future__ import annotations

import argparse
import dataclasses
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
from probe_mxfp4_gemv import mxfp4_only  # noqa: E402

CASES = (("llama4-scout", 8, (1, 4, 8)), ("llama4-maverick", 8, (1, 4)),
         ("qwen3-30b-a3b", 1, (1,)), ("mixtral-8x7b", 2, (1,)), ("gpt-oss-120b", 1, (1,)))
N_SETS = 8


def variants(heur: configs.DecodeConfig) -> dict:
    g, d = heur.gate_up, heur.down
    return {"heuristic": heur,
            "8 warps": configs.DecodeConfig(dataclasses.replace(g, num_warps=8),
                                            dataclasses.replace(d, num_warps=8)),
            "half rows": configs.DecodeConfig(
                dataclasses.replace(g, block_n=g.block_n // 2),
                dataclasses.replace(d, block_n=d.block_n // 2))}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=pathlib.Path)
    p.add_argument("--label", required=True)
    p.add_argument("--budget", type=float, default=150.0)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    deadline = time.time() + args.budget
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for name, tp, Ts in CASES:
        cfg = preset(name, tp=tp).replace(quantization="mxfp4")
        layers = _layers(cfg, "cuda", False)
        D, I, E, k = cfg.hidden_size, cfg.intermediate_size, cfg.num_experts, cfg.top_k
        for T in Ts:
            if time.time() > deadline:
                rows.append(dict(preset=name, tp=tp, T=T, skipped="time budget"))
                continue
            xs = [torch.randn(T, D, device="cuda", dtype=cfg.dtype) for _ in range(N_SETS)]
            heur = configs.heuristic((T * k, E, D, I, torch.uint8, sms))
            for label, plan in variants(heur).items():
                with configs.override(mxfp4_only(plan)), torch.no_grad():
                    row = dict(preset=name, tp=tp, T=T, tiles=label, check=_check(layers[0], xs[0]),
                               **_graph_us(layers, xs, False))
                rows.append(row)
                print(json.dumps(row), flush=True)
        del layers
        torch.cuda.empty_cache()
    out = args.out / f"probe_mxfp4_loop_{args.label}.json"
    out.write_text(json.dumps(dict(meta=metadata(), label=args.label, rows=rows), indent=1))


if __name__ == "__main__":
    main()
