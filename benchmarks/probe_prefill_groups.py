"""What do the part-filled row tiles cost Maverick's prefill? (one GPU call, ~1 min)

    PYTHONPATH=src python benchmarks/probe_prefill_groups.py --out $OUT

Llama 4 Maverick TP8 at T = 16384 reads 65 / 69% of dense cuBLAS (bf16 / fp8 rowwise, H200,
results/h200/layer.md at 2076e6c; the target is 75%). Top-1 over 128 experts gives each group
128 +- 11 rows, so with 128-row tiles about half the groups take a second, mostly empty tile:
189 row tiles expected for 128 groups (configs.expected_tiles), 1.48x the MMA work of full
tiles, and each group's weight strip asked for twice (the second ask likely served by L2: a
group's row tiles are adjacent in the tile order, so they run side by side). This probe times
the routed GEMMs alone (gate_up N = 2I, K = D; down N = D, K = I) on the same 16384 rows:
routed (bincount of a uniform draw, as the layer suite's random routing) against balanced (128
rows in every group, one tile each), with the shipped tile, 64-row tiles (8 warps; 4 warps, 4 stages) and 128 x 128 tiles two an
SM, next to
torch._grouped_mm (bf16) and dense cuBLAS over the same rows and one expert's weights (the
FLOPs alike). If balanced is much faster than routed, the part-filled tiles are worth a
remainder tile; if not, the time goes elsewhere. CUDA graphs (timing.time_fn), us, TFLOP/s and
the weights' GB/s. Writes $OUT/probe_prefill_groups.json.
"""

from __future__ import annotations

import argparse
import json
import pathlib

import torch

from shufflemoe import preset
from shufflemoe.bench.report import metadata
from shufflemoe.bench.timing import time_fn
from shufflemoe.ops import grouped_gemm
from shufflemoe.ops.grouped_gemm import configs

T = 16384
FP8 = torch.float8_e4m3fn


def _sizes(E: int, routing: str, dev: str) -> torch.Tensor:
    if routing == "balanced":
        return torch.full((E,), T // E, dtype=torch.int32, device=dev)
    torch.manual_seed(1)
    return torch.bincount(torch.randint(0, E, (T,), device=dev), minlength=E).to(torch.int32)


def _operands(fmt: str, N: int, K: int, E: int, dev: str, rows: int = T):
    """x [rows, K], w [E, N, K] (bf16, or fp8 rowwise with their scales), the grouped_gemm
    keywords they need, out [rows, N] bf16, and the tile the heuristic ships for them."""
    x = torch.randn(rows, K, device=dev, dtype=torch.bfloat16)
    w = torch.randn(E, N, K, device=dev, dtype=torch.bfloat16) * 0.02
    kw = {}
    if fmt != "bf16":
        xs, ws = x.abs().amax(1).float() / 448, w.abs().amax(2).float() / 448
        x, w = (x / xs[:, None]).to(FP8), (w / ws[:, :, None]).to(FP8)
        kw = dict(x_scale=xs, w_scale=ws, quantization="fp8_rowwise")
    out = torch.empty(rows, N, device=dev, dtype=torch.bfloat16)
    shipped = configs.select(rows, N, K, E, x.dtype, kw.get("quantization", "none"))
    return x, w, kw, out, shipped


def _row(fmt, gemm, variant, t, flops, w_bytes) -> dict:
    row = dict(format=fmt, gemm=gemm, variant=variant, us=t.median_us, us_lo=t.p20_us,
               us_hi=t.p80_us, tflops=flops / t.median_us / 1e6, weight_gbps=w_bytes / t.median_us / 1e3)
    print(json.dumps(row), flush=True)
    return row


def _time_tile(tile, x, w, m, out, kw: dict):
    """grouped_gemm(x, w, m, out=out, **kw) under tile, timed (CUDA graphs, timing.time_fn);
    then out poisoned (NaN) and written by one more call. Raises where the tile does not
    compile (shared memory)."""
    with configs.override(tile):
        t = time_fn(lambda i: grouped_gemm(x, w, m, out=out, **kw), 1, reps=20)
        out.fill_(float("nan"))
        grouped_gemm(x, w, m, out=out, **kw)
    torch.cuda.synchronize()
    return t


def _max_rel_diff(out, want) -> float:
    return ((out.float() - want).abs().max() / want.abs().max()).item()


def _time_tiles(tiles: dict, x, w, m, out, kw: dict, fmt: str, gemm: str, prefix: str,
                flops: float, w_bytes: float) -> list[dict]:
    """grouped_gemm(x, w, m) under each tile (a row each, as _row; variant = prefix + its name),
    its output compared with the first tile's (same_as_shipped), and its row tiles; a tile that
    does not compile (shared memory) is printed and skipped."""
    rows, want = [], None
    for label, tile in tiles.items():
        try:
            t = _time_tile(tile, x, w, m, out, kw)
        except Exception as e:
            print(json.dumps(dict(format=fmt, gemm=gemm, variant=label, error=str(e)[:200])))
            continue
        row = _row(fmt, gemm, prefix + label, t, flops, w_bytes)
        if want is None:
            want = out.clone()
        row["same_as_shipped"] = bool(torch.equal(out, want))
        row["row_tiles"] = int((-(-m // tile.block_m)).sum())
        rows.append(row)
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=pathlib.Path)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cfg = preset("llama4-maverick", tp=8)
    E, D, I, dev = cfg.num_experts, cfg.hidden_size, cfg.intermediate_size, "cuda"
    rows = []
    for fmt in ("bf16", "fp8_rowwise"):
        for gemm, (N, K) in {"gate_up": (2 * I, D), "down": (D, I)}.items():
            x, w, kw, out, shipped = _operands(fmt, N, K, E, dev)
            flops, w_bytes = 2.0 * T * N * K, float(w.numel() * w.element_size())
            tiles = {"shipped": shipped, "64-row tiles": shipped.with_(block_m=64),
                     "64-row tiles, 4 warps, 4 stages": shipped.with_(block_m=64, num_warps=4,
                                                                      num_stages=4),
                     "128 x 128, two an SM": shipped.with_(block_n=128, ctas_per_sm=2)}
            for routing in ("routed", "balanced"):
                m = _sizes(E, routing, dev)
                rows += _time_tiles(tiles, x, w, m, out, kw, fmt, gemm, f"{routing}, ", flops,
                                    w_bytes)
                if fmt == "bf16":
                    offs = torch.cumsum(m, 0).to(torch.int32)
                    t = time_fn(lambda i: torch._grouped_mm(x, w.transpose(1, 2), offs=offs), 1, reps=20)
                    rows.append(_row(fmt, gemm, f"{routing}, torch._grouped_mm", t, flops, w_bytes))
            if fmt == "bf16":
                t = time_fn(lambda i: torch.mm(x, w[0].t(), out=out), 1, reps=20)
            else:
                one = w[0].t()
                t = time_fn(lambda i: torch._scaled_mm(x, one, scale_a=kw["x_scale"][:, None],
                                                       scale_b=kw["w_scale"][0][None, :],
                                                       out_dtype=torch.bfloat16), 1, reps=20)
            rows.append(_row(fmt, gemm, "dense cuBLAS, one expert's weights", t, flops,
                             w_bytes / E))
            del x, w, out
            torch.cuda.empty_cache()
    (args.out / "probe_prefill_groups.json").write_text(json.dumps(
        dict(meta=metadata(), T=T, preset="llama4-maverick-tp8", rows=rows), indent=1))


if __name__ == "__main__":
    main()
