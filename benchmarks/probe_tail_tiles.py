"""Tail rows (TileConfig.tail_m) where groups hold about one tile of rows (one GPU call, ~2 min)

    PYTHONPATH=src python benchmarks/probe_tail_tiles.py --out $OUT

probe_prefill_groups.py (results/probe_prefill_groups.json, H200) found Llama 4 Maverick TP8's
routed GEMMs at T = 16384 (128 +- 11 rows a group, 189 row tiles of 128 for 128 groups) 1.20-1.29x
slower than on the same rows in equal groups (128 tiles). With tail_m, a group's last m-tile takes
up to tail_m rows past its block_m, multiplied by the same weight tile in a second, swapped dot:
a group of up to block_m + tail_m rows reads its weights once. At 7cd442f every last tile ran the
tail dot, also on rows it did not have (results/probe_tail_tiles_7cd442f.json: routed groups
faster, equal groups of exactly 128 rows 10-30% slower); now only tiles whose group has rows past
block_m run it, the rest run the plain K loop. This times the routed GEMMs alone (CUDA graphs,
timing.time_fn) at about 128 rows a group: Maverick TP8 T = 16384, Qwen3-30B-A3B T = 2048 (top-8
of 128), Scout TP8 T = 2048 (16 experts), Mixtral TP2 T = 512 (top-2 of 8); bf16 and fp8 rowwise;
the shipped tile, and where it has tail rows the same tile without them, flattened (the tile
shipped before) or not, with 3 stages (shipped before 4, results/probe_tail_tiles_fb637d6.json),
on routed rows (a bincount of a uniform draw) and on equal groups. At 76d4515 it also timed
every shipped tile with its last, partial wave split along K over the idle programs
(results/probe_tail_tiles_76d4515.json: 0.99-1.25x the shipped tile's time, so the split
was taken out). Every variant's output is compared with the shipped tile's (max relative
difference: the same sums in another MMA shape round alike, so ~0). Writes
$OUT/probe_tail_tiles.json.
"""

from __future__ import annotations

import argparse
import json
import pathlib

import torch

from shufflemoe import preset
from shufflemoe.bench.report import metadata

from probe_prefill_groups import _max_rel_diff, _operands, _time_tile

CASES = {  # name: (preset, tp, T)
    "maverick-tp8 T=16384": ("llama4-maverick", 8, 16384),
    "qwen3-30b-a3b T=2048": ("qwen3-30b-a3b", 1, 2048),
    "scout-tp8 T=2048": ("llama4-scout", 8, 2048),
    "mixtral-tp2 T=512": ("mixtral-8x7b", 2, 512),
}


def _sizes(A: int, E: int, routing: str, dev: str) -> torch.Tensor:
    if routing == "equal":
        return torch.full((E,), A // E, dtype=torch.int32, device=dev)
    torch.manual_seed(1)
    return torch.bincount(torch.randint(0, E, (A,), device=dev), minlength=E).to(torch.int32)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=pathlib.Path)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    dev, rows = "cuda", []
    for case, (name, tp, T) in CASES.items():
        cfg = preset(name, tp=tp)
        E, D, I, A = cfg.num_experts, cfg.hidden_size, cfg.intermediate_size, T * cfg.top_k
        for fmt in ("bf16", "fp8_rowwise"):
            for gemm, (N, K) in {"gate_up": (2 * I, D), "down": (D, I)}.items():
                x, w, kw, out, shipped = _operands(fmt, N, K, E, dev, rows=A)
                tiles = {"shipped": shipped}
                if shipped.tail_m:
                    tiles["no tail rows, flattened"] = shipped.with_(tail_m=0, flatten=True)
                    tiles["no tail rows"] = shipped.with_(tail_m=0)
                    tiles["3 stages"] = shipped.with_(num_stages=3)
                for routing in ("routed", "equal"):
                    m = _sizes(A, E, routing, dev)
                    want = None
                    for label, tile in tiles.items():
                        try:
                            t = _time_tile(tile, x, w, m, out, kw)
                        except Exception as e:  # a tile past the shared memory: say so, go on
                            print(json.dumps(dict(case=case, format=fmt, gemm=gemm,
                                                  variant=label, error=str(e)[:200])))
                            continue
                        if want is None:
                            want = out.float().clone()
                        row = dict(case=case, format=fmt, gemm=gemm, routing=routing,
                                   variant=label, tile=str(tile), us=t.median_us, us_lo=t.p20_us,
                                   us_hi=t.p80_us, max_rel_diff=_max_rel_diff(out, want),
                                   tflops=2.0 * A * N * K / t.median_us / 1e6)
                        print(json.dumps({k: v for k, v in row.items() if k != "tile"}),
                              flush=True)
                        rows.append(row)
                del x, w, out
                torch.cuda.empty_cache()
    (args.out / "probe_tail_tiles.json").write_text(json.dumps(
        dict(meta=metadata(), rows=rows), indent=1))


if __name__ == "__main__":
    main()
