"""The four-launch path's glue at decode row counts: GEMM13 taking the GLU (shuffled.GLU_MAX_ROWS)
and gathering x's rows itself (shuffled._gathers_in_gemm) past today's limits (one GPU call).

probe_timeline at 2588615 (H200, results/probe_timeline_h200_2588615.txt): Mixtral TP2 bf16 at
T = 128 (32 pairs an expert) spends ~20 us of its 368 outside the two GEMMs, which stream at
97-98% of the read ceiling: router 4.0, routing 4.8, the gather copy 2.0 (2I = 14336 > the
gather rule's 4096), silu_mul 4.3 (32 rows > GLU_MAX_ROWS = 16), token sum 2.3. Both rules were
set on throughput-bound shapes (Mixtral T = 2048, Qwen3 T = 2048); at a few dozen rows an expert
GEMM13 is bound by its weights' bytes, where the GLU paid at <= 16 rows. Variants, the layer in
CUDA graphs over rotated weights and inputs (the suite's _Case), each checked against float64:
shipped; glu32 (GLU_MAX_ROWS 32); glu64; gather (GEMM13 gathers bf16 / fp8_w8a16 rows wherever
the pairs average <= 64 an expert); glu32+gather; shipped again. Writes
$OUT/probe_decode_glue.json.

--set tiles: at 33-64 pairs an expert (where bf16 takes unswapped 128 x 128 tiles whose x box
loads 128 rows whatever a group holds), the gather against swapped 64-row tiles (swap64, the
tile of <= 32 rows) and both, into $OUT/probe_decode_glue_tiles.json. (Both rules it measured
ship since 894ff1d: configs.MID_SWAP_ROWS and shuffled.GATHER_MAX_ROWS, so "shipped" there is
no longer the 128 x 128 tile at 33-48 rows.)

--set gather: the gather alone at 20-512 pairs an expert where 2I passes the width rule (Mixtral
TP2 and TP1, gpt-oss-120b in bf16), with the rows limit at 64, 128 and 256 (gather64, ...), into
$OUT/probe_decode_glue_gather.json.

    PYTHONPATH=src python benchmarks/probe_decode_glue.py --out $OUT [--budget 400]
        [--set gather|tiles]
"""

from __future__ import annotations

import contextlib
import json
import time

import torch

from probe_fused_limit import new_case, probe_start, rotated_layers, timed
from shufflemoe import preset
from shufflemoe.bench.report import metadata
from shufflemoe.bench.suites.layer import PRESETS
from shufflemoe.experts import shuffled
from shufflemoe.ops.grouped_gemm import configs as gemm_configs

CASES = (
    ("mixtral-8x7b-tp2", "none", (64, 128, 256)),
    ("qwen3-30b-a3b", "none", (128, 256, 512)),
    ("mixtral-8x7b-tp2", "fp8_w8a16", (64, 128)),
    ("llama4-scout-tp8", "none", (256, 512)),
    ("qwen3-30b-a3b", "fp8_w8a16", (64, 128)),
)
GATHER_CASES = (
    ("mixtral-8x7b", 2, "none", (160, 256, 384, 512, 1024)),
    ("mixtral-8x7b", 1, "none", (128, 256, 512)),
    ("gpt-oss-120b", 1, "none", (640, 1024, 2048, 4096)),
)
TILE_CASES = (
    ("mixtral-8x7b", 2, "none", (160, 192, 224, 256)),
    ("mixtral-8x7b", 1, "none", (160, 256)),
    ("gpt-oss-120b", 1, "none", (1280, 1536, 2048)),
)
SWAP64 = gemm_configs.TileConfig(64, 128, 128, num_stages=3, swap_ab=True, ctas_per_sm=2)
_shipped_gathers = shuffled._gathers_in_gemm


def _swap64(key):
    M, N, K, G, dtype = key
    if G > 1 and dtype == torch.bfloat16 and 32 < -(-M // G) <= 64:
        return SWAP64
    return gemm_configs._heuristic(M, N, K, G, dtype)  # select() without the override (bf16)


@contextlib.contextmanager
def variant(name: str):
    glu = shuffled.GLU_MAX_ROWS
    if "glu32" in name:
        shuffled.GLU_MAX_ROWS = 32
    if "glu64" in name:
        shuffled.GLU_MAX_ROWS = 64
    if "gather" in name:
        most = int(name.split("gather")[1] or 64)

        def gathers(x, w, w_in, num_pairs, num_experts):
            return _shipped_gathers(x, w, w_in, num_pairs, num_experts) or (
                not isinstance(x, shuffled.QuantizedRows) and w_in is None
                and w.quantization in ("none", "fp8_w8a16") and _ROWS[0] <= most)
        shuffled._gathers_in_gemm = gathers
    tiles = gemm_configs.override(_swap64) if "swap64" in name else contextlib.nullcontext()
    try:
        with tiles:
            yield
    finally:
        shuffled.GLU_MAX_ROWS = glu
        shuffled._gathers_in_gemm = _shipped_gathers


_ROWS = [0]  # pairs an expert of the case being timed


def main() -> None:
    args, start, out = probe_start("probe_decode_glue",
                                   set=dict(default="glue", choices=("glue", "gather", "tiles")))
    by_name = {p.name: p for p in PRESETS}
    if args.set in ("gather", "tiles"):
        variants = (("shipped", "gather64", "gather128", "gather256", "shipped again")
                    if args.set == "gather" else
                    ("shipped", "gather64", "swap64", "swap64+gather64", "shipped again"))
        cases = [(f"{n}-tp{tp}", preset(n, tp=tp).replace(quantization=f), Ts)
                 for n, tp, f, Ts in (GATHER_CASES if args.set == "gather" else TILE_CASES)]
    else:
        variants = ("shipped", "glu32", "glu64", "gather", "glu32+gather", "shipped again")
        cases = [(n, by_name[n].cfg.replace(quantization=f), Ts) for n, f, Ts in CASES]
    rows = []
    for name, cfg, Ts in cases:
        fmt = cfg.quantization
        if time.time() - start > args.budget:
            rows.append(dict(preset=name, format=fmt, note="skipped: budget"))
            continue
        layers = rotated_layers(cfg, max(Ts))
        for T in Ts:
            _ROWS[0] = T * cfg.top_k / cfg.num_experts
            row = dict(preset=name, format=fmt, T=T, rows_an_expert=_ROWS[0])
            if time.time() - start > args.budget:
                rows.append(dict(row, note="skipped: budget"))
                continue
            case = new_case(layers, T)
            for v in variants:
                row[v] = timed(case, variant(v), args.reps)
            rows.append(row)
            print(json.dumps(row), flush=True)
        del layers
        torch.cuda.empty_cache()
    meta = dict(metadata(), seconds=round(time.time() - start))
    suffix = "" if args.set == "glue" else f"_{args.set}"
    (out / f"probe_decode_glue{suffix}.json").write_text(
        json.dumps(dict(meta=meta, rows=rows), indent=1))
    for r in rows:
        print(r["preset"], r["format"], r.get("T"), r.get("rows_an_expert"),
              *(f"{v}={r.get(v, {}).get('us')}" for v in variants),
              *(r.get(v, {}).get("check") or r.get(v, {}).get("note", "") for v in variants
                if r.get(v, {}).get("check") != "ok"), r.get("note", ""))


if __name__ == "__main__":
    main()
