"""What does a tail row cost? Maverick's routed GEMMs, equal groups of R rows (one GPU call, ~1 min)

    PYTHONPATH=src python benchmarks/probe_tail_rows.py --out $OUT

probe_tail_tiles at 76d4515 (results/probe_tail_tiles_76d4515.json, H200): Llama 4 Maverick TP8's
routed gate_up at T = 16384 (128 +- 11 rows a group) takes 841 us in the shipped tile (128 x 256,
up to 32 tail rows), 739 us on equal groups of exactly 128 rows: the same weight bytes, about
half the tiles running the tail loop. This asks whether a tile's time follows its rows: equal
groups of R rows, R = 96 .. 160 (every group's last tile with R - 128 tail rows past 128), with
the tile the layer ships for T = 16384, and the same tile without tail rows (a second row tile
where R > 128). If the shipped tile's time stays flat over R, the routed rows' extra time is
elsewhere (the branch, or the imbalance between tiles); if it grows with R, the tail loop is
slower than its bytes. CUDA graphs (timing.time_fn), us and the weights' GB/s; each variant's
output compared with the first's (max relative difference). At 128 and 144 rows also: a
128 x 128 and a 64 x 256 tile without tail rows and the shipped tile with 16 tail rows, to tell
whether the tile is bound by HBM or by the bytes its loads move into the SMs (L2 hits included),
and the shipped tile in three stages (four since d115239; the tail dot first since 7113bf8).
Writes $OUT/probe_tail_rows.json.
"""

from __future__ import annotations

import argparse
import json
import pathlib

import torch

from shufflemoe import preset
from shufflemoe.bench.report import metadata
from shufflemoe.ops.grouped_gemm import configs

from probe_prefill_groups import _max_rel_diff, _operands, _time_tile

ROWS = (96, 112, 128, 129, 144, 160, 129)  # 129 again: its spread between two passes


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=pathlib.Path)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cfg = preset("llama4-maverick", tp=8)
    E, D, I = cfg.num_experts, cfg.hidden_size, cfg.intermediate_size
    dev, rows = "cuda", []
    for fmt in ("bf16", "fp8_rowwise"):
        for gemm, (N, K) in {"gate_up": (2 * I, D), "down": (D, I)}.items():
            x, w, kw, out, _ = _operands(fmt, N, K, E, dev, rows=E * max(ROWS))
            shipped = configs.select(16384, N, K, E, x.dtype, kw.get("quantization", "none"))
            tiles = {"shipped": shipped, "no tail rows": shipped.with_(tail_m=0)}
            # Where R <= 144: bytes into the SMs against HBM's. A 128 x 128 tile loads each
            # group's x rows twice as often, a 64 x 256 tile its weights (the second time from
            # L2 if the group's m-tiles run together); 16 tail rows load half the tail's x.
            more = {"128 x 128, no tail rows": shipped.with_(block_n=128, tail_m=0),
                    "64 x 256, no tail rows": shipped.with_(block_m=64, num_warps=4, tail_m=0),
                    "16 tail rows": shipped.with_(tail_m=16),
                    "3 stages": shipped.with_(num_stages=3)}
            w_bytes = w.numel() * w.element_size()
            for R in ROWS:
                m = torch.full((E,), R, dtype=torch.int32, device=dev)
                xr, o = x[: E * R], out[: E * R]
                kwr = {**kw, "x_scale": kw["x_scale"][: E * R]} if kw else kw
                want = None
                for label, tile in {**tiles, **(more if R in (128, 144) else {})}.items():
                    try:
                        t = _time_tile(tile, xr, w, m, o, kwr)
                    except Exception as e:  # a tile past the shared memory: say so, go on
                        print(json.dumps(dict(format=fmt, gemm=gemm, variant=label,
                                              error=str(e)[:200])))
                        continue
                    if want is None:
                        want = o.float().clone()
                    row = dict(format=fmt, gemm=gemm, rows_a_group=R, variant=label,
                               tile=str(tile), us=t.median_us, us_lo=t.p20_us, us_hi=t.p80_us,
                               weight_gbps=w_bytes / t.median_us / 1e3,
                               max_rel_diff=_max_rel_diff(o, want))
                    print(json.dumps({k: v for k, v in row.items() if k != "tile"}), flush=True)
                    rows.append(row)
            del x, w, out
            torch.cuda.empty_cache()
    (args.out / "probe_tail_rows.json").write_text(json.dumps(
        dict(meta=metadata(), rows=rows), indent=1))


if __name__ == "__main__":
    main()
