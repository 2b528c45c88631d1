"""Decode rows chosen in the layer, one table key at a time, in the cases probe_device_rows.py
judges: tune_decode.py times each GEMM of the routed experts by itself, while a layer call runs the
router, index_shuffle, the shared expert (merged into the routed launches at small T) and both
GEMMs. One GPU call: for each preset and weight format, the --tokens are grouped by the table key
of their routed launches (Llama 4's merged T = 1 and unmerged T = 2 share A = 2), and each key's
row is varied one part at a time, the other keys keeping theirs (coordinate descent: down's tile,
one pair or MMA; down with K split past what the SMs need; gate_up's tile; the PDL bit), scored
by the sum over the key's T of the layer's time (decode_check's layers and inputs, as the judge:
CUDA-graph replays over rotated weights and 8 routings). Each best is checked against float64 at
every T and timed again beside the table's row. --write-table FILE: tuned.py with each key's best
that beats its row by --min-speedup in its place, for probe_device_rows.py --against FILE to
judge in turns (own / base > 1: the candidate rows are faster).

    PYTHONPATH=src python benchmarks/probe_merged_tiles.py --out $OUT [--budget 420]
    PYTHONPATH=src python benchmarks/probe_merged_tiles.py --dry-run --out /tmp/x   (CPU)

Writes $OUT/probe_merged_tiles.json: per key its T, the table's row and time at each T, the best,
the speedup (the table's sum, the smaller of its two timings, over the best's) and every try; the
keys not begun within --budget under "skipped" (one begun stops its descent at the budget's end,
then is checked and timed with the best it found).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import sys
import time

if "--dry-run" in sys.argv and not os.environ.get("TRITON_INTERPRET"):
    os.environ["TRITON_INTERPRET"] = "1"  # before triton decorates any kernel

import torch  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from decode_check import inputs, layers_for, tiny, weight_sets  # noqa: E402
from probe_combine import _check  # noqa: E402
from tune_decode import DTYPES, N_INPUTS, PRESETS, fields, quant_at, time_us  # noqa: E402

from shufflemoe.bench.report import metadata  # noqa: E402
from shufflemoe.ops import use_impl  # noqa: E402
from shufflemoe.ops.moe_decode import configs  # noqa: E402

# one pair a tile (block_m = 1): (block_n, bytes of K a step, warps); tune_decode's GEMV_TILES
GEMV = ((4, 2048, 4), (4, 4096, 4), (4, 4096, 8), (8, 2048, 8), (8, 4096, 8), (16, 1024, 4),
        (32, 512, 4), (64, 256, 4))
MMA = ((64, 256, 4, 3), (32, 256, 4, 4), (64, 128, 4, 4))  # down only: (block_n, bytes, warps, stages)
# down only, one pair a tile with K in this many ranges whatever the SMs need (a short chain a
# program: one or two K steps): (block_n, bytes, warps, split)
SPLIT = ((32, 512, 4, 2), (64, 256, 4, 2), (64, 256, 4, 4), (128, 256, 8, 4))


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
    make(tile) (a GemmConfig, or the PDL bit) in place of best's part, timed by time_with(plan);
    the fastest plan is kept. Appends {part: what, "us" or "error"} to tried; returns the best."""
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


def routed_keys(cfg, layer, x, gpu: str) -> set:
    """The configs.select keys of one call's routed launches (E = the layer's experts; a merged
    shared expert's rows are in their A); none where the call takes the unfused path. The call
    recorded is the second: on a GPU the first also reserves the fused kernels' arrival words,
    selecting a plan for every A the Switch fuses (moe_decode.reserve)."""
    seen = set()

    def record(k):
        if k[1] == cfg.num_experts:
            seen.add(k)
        return configs.planned(k, quant_at(k, cfg), gpu)
    with torch.no_grad():
        layer(x)
        with configs.override(record):
            layer(x)
    return seen


def only_at(cfg, tkey: tuple, plan: configs.DecodeConfig, gpu: str):
    """An override: ``plan`` for the routed launches whose table key is ``tkey``, every other
    launch its row as the GPU ``gpu`` reads the tables."""
    def chosen(k):
        quant = quant_at(k, cfg)
        if k[1] == cfg.num_experts and configs.table_key(*k, quant=quant) == tkey:
            return plan
        return configs.planned(k, quant, gpu)
    return chosen


def key_cases(cfg, tokens, device: str, gpu: str, dry: bool) -> dict:
    """{table key: [(T, raw key, layers, inputs)]} for the T whose routed launches take the
    fused kernels. One set of layers serves every T (layers_for seeds layer i with i: the
    judge's weight sets at each T are a prefix of the largest)."""
    sets = {T: 1 if dry else weight_sets(cfg, T) for T in tokens}
    every = layers_for(cfg, max(sets.values()), device)
    out: dict = {}
    for T in tokens:
        layers = every[:sets[T]]
        xs = inputs(cfg, T, device, 2 if dry else N_INPUTS)
        for k in sorted(routed_keys(cfg, layers[0], xs[0], gpu)):
            tkey = configs.table_key(*k, quant=cfg.quantization)
            out.setdefault(tkey, []).append((T, k, layers, xs))
    return out


def key_row(cfg, tkey, cases, gpu: str, deadline: float, dry: bool) -> dict:
    """The descent for one key over its cases (see the module's docstring)."""
    E, D, I, k = cfg.num_experts, cfg.hidden_size, cfg.intermediate_size, cfg.top_k
    sms = cases[0][1][5]  # the layer's: configs.select's key ends with the SMs
    itemsize = cases[0][2][0].w13.dtype.itemsize
    merged = [c[1][0] > c[0] * k for c in cases]  # rows planned past T k: the shared expert's
    active = min(E, cases[0][0] * k) + merged[0]  # weight sets streamed (the shared expert's too)
    table = configs.planned(cases[0][1], cfg.quantization, gpu)

    def times(plan) -> list[float]:
        out = []
        with configs.override(only_at(cfg, tkey, plan, gpu)), torch.no_grad():
            for _, _, layers, xs in cases:
                run = lambda i, layers=layers, xs=xs: layers[i % len(layers)](xs[i])  # noqa: E731
                if dry:
                    run(0)
                    out.append(float("nan"))
                else:
                    out.append(time_us(run, len(xs), 30))
        return out

    row = dict(key=tkey, T=[c[0] for c in cases], A=[c[1][0] for c in cases],
               merged=merged, table=[table.gate_up.__dict__, table.down.__dict__, table.pdl])
    row["table_us"] = times(table)
    few = (lambda t: t[:1]) if dry else (lambda t: t)
    parts = (("down", few(GEMV + MMA), lambda t: gemm(t, itemsize, active * -(-D // t[0]), I, sms,
                                                      True)),
             ("down", few(SPLIT), lambda t: gemm(t[:3], itemsize, 0, I, sms, True, t[3])),
             ("gate_up", few(GEMV), lambda t: gemm(t, itemsize, active * -(-I // t[0]), D, sms,
                                                   not any(merged))),  # merged: unsplit, early
             ("pdl", (not table.pdl,), lambda t: t))
    tried: list = []
    best = descend(table, sum(row["table_us"]), parts, lambda p: sum(times(p)), deadline, tried)
    with configs.override(only_at(cfg, tkey, best, gpu)), torch.no_grad():
        row["check"] = [_check(c[2][0], c[3][0]) for c in cases]
    row["best"] = [best.gate_up.__dict__, best.down.__dict__, best.pdl]
    row["best_us"] = times(best)
    row["table_again_us"] = times(table)
    row["speedup"] = round(min(sum(row["table_us"]), sum(row["table_again_us"]))
                           / sum(row["best_us"]), 3)
    row["tried"] = tried
    return row


def write_table(path: pathlib.Path, rows) -> None:
    """tuned.py with each row's best in TABLE at its key (the base table: BASE_DEVICE's rows), for
    probe_device_rows.py --against to judge in the suite's cases."""
    src = (pathlib.Path(configs.__file__).parent / "tuned.py").read_text().splitlines()
    end = src.index("}")  # TABLE's closing brace: the first at the start of a line
    for r in rows:
        gate_up, down, pdl = r["best"]
        key = tuple(r["key"])
        gate_up, down = (fields(configs.GemmConfig(**c)) for c in (gate_up, down))
        line = f"    {key!r}: ({gate_up}, {down}, {pdl}),"
        at = [i for i, s in enumerate(src[:end]) if s.startswith(f"    {key!r}:")]
        if at:
            src[at[0]] = line
        else:
            src.insert(end, line)
            end += 1
        print("candidate row:", line, flush=True)
    path.write_text("\n".join(src) + "\n")


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, type=pathlib.Path)
    p.add_argument("--budget", type=float, default=420.0)
    p.add_argument("--dtypes", nargs="+", default=["bf16", "fp8"], choices=list(DTYPES))
    p.add_argument("--presets", nargs="+", default=["scout-tp8", "maverick-tp8"])
    p.add_argument("--tokens", nargs="+", type=int, default=[1, 2])
    p.add_argument("--write-table", type=pathlib.Path, default=None,
                   help="a copy of tuned.py with each best that beats its row by --min-speedup")
    p.add_argument("--min-speedup", type=float, default=1.02)
    p.add_argument("--dry-run", action="store_true")
    args = p.parse_args(argv)
    dry = args.dry_run
    device = "cpu" if dry else "cuda"
    gpu = "" if dry else torch.cuda.get_device_name()
    if args.write_table and gpu not in ("", configs.BASE_DEVICE):
        p.error(f"--write-table writes the base table ({configs.BASE_DEVICE}'s), not {gpu}'s")
    deadline = time.time() + args.budget
    meta, rows, skipped = metadata(), [], []  # skipped: the keys the budget left untried
    with use_impl("triton"):
        for name in args.presets:
            for dtype in args.dtypes:
                cfg = PRESETS[name].replace(quantization=DTYPES[dtype])
                cfg = tiny(cfg) if dry else cfg
                for tkey, cases in key_cases(cfg, args.tokens, device, gpu, dry).items():
                    if time.time() > deadline:
                        skipped.append(dict(preset=name, dtype=dtype, key=tkey,
                                            T=[c[0] for c in cases]))
                        continue
                    row = dict(preset=name, dtype=dtype,
                               **key_row(cfg, tkey, cases, gpu, deadline, dry))
                    rows.append(row)
                    print(json.dumps({k: v for k, v in row.items() if k != "tried"}), flush=True)
                if not dry:
                    torch.cuda.empty_cache()
    meta["seconds"] = round(time.time() - deadline + args.budget)
    result = dict(meta=meta, rows=rows, skipped=skipped)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "probe_merged_tiles.json").write_text(json.dumps(result, indent=1, default=str))
    if args.write_table:
        args.write_table.parent.mkdir(parents=True, exist_ok=True)
        write_table(args.write_table, [r for r in rows if set(r["check"]) == {"ok"}
                                       and not math.isnan(r["speedup"])
                                       and r["speedup"] >= args.min_speedup])
    return result


if __name__ == "__main__":
    main()
