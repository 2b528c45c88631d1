"""Tiles for the merged decode (the shared expert in the routed experts' two fused launches) chosen
in the layer, not in the GEMMs alone: tune_decode.py times each GEMM of the routed experts by
itself, while a merged call runs the shared expert's programs beside the router, index_shuffle and
the routed ones. One GPU call: for Llama 4 Scout and Maverick TP8 at T = 1 (bf16 and fp8 rowwise
routed experts, a bf16 shared expert), the layer in CUDA graphs (weights and inputs rotating, as
the layer suite does; --presets qwen3-30b-a3b --tokens 1 2: the routed experts alone) with the
table's tiles, then down's tile varied with gate_up's fixed (SPLIT too: K split past what the SMs
need), then gate_up's with the best down, then the PDL bit flipped (coordinate descent); the best
checked against float64 and timed again beside the table's. --write-table FILE: tuned.py with
every best that beats the table's row by --min-speedup in its place, for probe_device_rows.py
--against FILE to judge in the suite's cases (own / base > 1: the candidate rows are faster).

    PYTHONPATH=src python benchmarks/probe_merged_tiles.py --out $OUT [--budget 420]
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

PRESETS = {"scout-tp8": preset("llama4-scout", tp=8),
           "maverick-tp8": preset("llama4-maverick", tp=8),
           "qwen3-30b-a3b": preset("qwen3-30b-a3b")}
# one pair a tile (block_m = 1): (block_n, bytes of K a step, warps); tune_decode's GEMV_TILES
GEMV = ((4, 2048, 4), (4, 4096, 4), (4, 4096, 8), (8, 2048, 8), (8, 4096, 8), (16, 1024, 4),
        (32, 512, 4), (64, 256, 4))
MMA = ((64, 256, 4, 3), (32, 256, 4, 4), (64, 128, 4, 4))  # down only: (block_n, bytes, warps, stages)
# down only, one pair a tile with K in this many ranges whatever the SMs need (a short chain a
# program: one or two K steps): (block_n, bytes, warps, split)
SPLIT = ((32, 512, 4, 2), (64, 256, 4, 2), (64, 256, 4, 4), (128, 256, 8, 4))
N_SETS = 8


def gemm(tile, itemsize: int, tiles_n: int, K: int, sms: int, split_ok: bool, split=None):
    """A GemmConfig from a candidate: K split so that every SM gets a program (where allowed),
    or into `split` ranges."""
    block_n, nbytes, warps = tile[:3]
    stages, block_m = (tile[3], 16) if len(tile) == 4 else (2, 1)
    block_k = nbytes // itemsize
    split = split or (configs.split_for(tiles_n, -(-K // block_k), sms) if split_ok else 1)
    return configs.GemmConfig(block_n, block_k, split, warps, stages, block_m)


def descend(best, best_us, parts, time_with, deadline, tried):
    """Coordinate descent over the decode plan: for each (part, tiles, make) in turn, each tile's
    GemmConfig make(tile) in place of best's part, timed by time_with(plan); the fastest plan
    is kept. Appends {part: config, "us" or "error"} to tried; returns the best plan."""
    for part, tiles, make in parts:
        for tile in tiles:
            if time.time() > deadline:
                break
            g = make(tile)
            plan = best.with_(**{part: g})
            said = getattr(g, "__dict__", g)
            try:
                us = time_with(plan)
            except Exception as e:  # noqa: BLE001 (a tile the kernel refuses)
                tried.append({part: said, "error": str(e)[:120]})
                continue
            tried.append({part: said, "us": us})
            if us < best_us:
                best, best_us = plan, us
    return best


def _row(c: dict) -> tuple:
    return tuple(c[f] for f in ("block_n", "block_k", "split_k", "num_warps", "num_stages",
                                "block_m"))


def write_table(path: pathlib.Path, rows) -> None:
    """tuned.py with each row's best in TABLE at its key (the base table: BASE_DEVICE's rows), for
    probe_device_rows.py --against to judge in the suite's cases."""
    src = (pathlib.Path(configs.__file__).parent / "tuned.py").read_text().splitlines()
    end = src.index("}")  # TABLE's closing brace: the first at the start of a line
    for r in rows:
        gate_up, down, pdl = r["best"]
        key = tuple(r["key"])
        line = f"    {key!r}: ({_row(gate_up)}, {_row(down)}, {pdl}),"
        at = [i for i, s in enumerate(src[:end]) if s.startswith(f"    {key!r}:")]
        if at:
            src[at[0]] = line
        else:
            src.insert(end, line)
            end += 1
        print("candidate row:", line, flush=True)
    path.write_text("\n".join(src) + "\n")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=pathlib.Path)
    p.add_argument("--budget", type=float, default=420.0)
    p.add_argument("--formats", nargs="+", default=["none", "fp8_rowwise"])
    p.add_argument("--presets", nargs="+", default=["scout-tp8", "maverick-tp8"])
    p.add_argument("--tokens", nargs="+", type=int, default=[1])
    p.add_argument("--write-table", type=pathlib.Path, default=None,
                   help="a copy of tuned.py with each best that beats its row by --min-speedup")
    p.add_argument("--min-speedup", type=float, default=1.02)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    deadline = time.time() + args.budget
    meta, rows = metadata(), []
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for name, fmt, T in [(n, f, t) for n in args.presets for f in args.formats
                         for t in args.tokens]:
        cfg = PRESETS[name].replace(quantization=fmt)
        layers = _layers(cfg, "cuda", False)
        xs = [torch.randn(T, cfg.hidden_size, device="cuda", dtype=cfg.dtype)
              for _ in range(N_SETS)]
        D, I, E, k = cfg.hidden_size, cfg.intermediate_size, cfg.num_experts, cfg.top_k
        itemsize = 1 if fmt == "fp8_rowwise" else 2
        merged = bool(cfg.shared_intermediate_size) and configs.merges_shared(T, k, fmt, E)
        A = T * k + (T if merged else 0)  # rows the fused kernels plan for
        active = min(E, T * k) + merged  # weight sets streamed (the shared expert's too)
        table = configs.select(A, E, D, I, layers[0].w13.dtype, sms, fmt)

        def time_with(plan, layers=layers, xs=xs):
            with configs.override(plan), torch.no_grad():
                return _graph_us(layers, xs, False)["us"]

        row = dict(preset=name, format=fmt, T=T, merged=merged,
                   key=configs.table_key(A, E, D, I, layers[0].w13.dtype, sms, fmt), table=[table.gate_up.__dict__,
                                                        table.down.__dict__, table.pdl])
        row["table_us"] = time_with(table)
        best, best_us, tried = table, row["table_us"], []
        # down's tile first (K split to fill the SMs), then gate_up's with the best down (merged:
        # no split, its shared programs run early only unsplit)
        parts = (("down", GEMV + MMA, lambda t: gemm(t, itemsize, active * -(-D // t[0]), I, sms,
                                                     True)),
                 ("down", SPLIT, lambda t: gemm(t[:3], itemsize, 0, I, sms, True, t[3])),
                 ("gate_up", GEMV, lambda t: gemm(t, itemsize, active * -(-I // t[0]), D, sms,
                                                  not merged)),
                 ("pdl", (not table.pdl,), lambda t: t))
        best = descend(best, best_us, parts, time_with, deadline, tried)
        with configs.override(best), torch.no_grad():
            row["check"] = _check(layers[0], xs[0])
        row["best"] = [best.gate_up.__dict__, best.down.__dict__, best.pdl]
        row["best_us"] = time_with(best)
        row["table_again_us"] = time_with(table)
        row["speedup"] = round(min(row["table_us"], row["table_again_us"]) / row["best_us"], 3)
        row["tried"] = tried
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "tried"}), flush=True)
        del layers
        torch.cuda.empty_cache()
    meta["seconds"] = round(time.time() - deadline + args.budget)
    if args.write_table:
        write_table(args.write_table, [r for r in rows if r["check"] == "ok"
                                       and r["speedup"] >= args.min_speedup])
    (args.out / "probe_merged_tiles.json").write_text(json.dumps(dict(meta=meta, rows=rows),
                                                                 indent=1))


if __name__ == "__main__":
    main()
