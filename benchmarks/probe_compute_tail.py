"""Tail rows on the compute-bound prefill tiles (one GPU call, ~4 min)

    PYTHONPATH=src python benchmarks/probe_compute_tail.py --out $OUT

Past 128 rows a group the heuristic ships 128 x 256 tiles with the flattened loop and no tail
rows. A group of 1024 + r rows (Llama 4 Scout TP8 at T = 16384: 16 experts, 1024 +- 32 rows)
then takes a ninth, nearly empty m-tile that streams the whole K: Scout's routed GEMM13 runs
about 1088 tiles on 132 SMs (8.2 waves, so 9), against 1024 (7.8, so 8) on equal groups, and
probe_ws_gemm found it 0.95x torch._grouped_mm routed but 1.03x on equal groups. With
TileConfig.tail_m the last m-tile takes up to tail_m rows past its 128 in a second, swapped dot
against the same weight tile (the rule Maverick's 128-row groups use); it needs the plain,
not flattened loop. This times, on the routed GEMMs alone (CUDA graphs, timing.time_fn): the
shipped tile, the same not flattened (the control), with 32 and with 64 tail rows (offline
sm_90: 245 / 255 registers, no spills, 213 / 229 KB shared memory at 4 stages), and
torch._grouped_mm / torch._scaled_grouped_mm, for Scout TP8 T = 4096 and 16384, Qwen3-30B-A3B
T = 16384 (top-8 of 128: 1024 rows a group) and Mixtral TP2 T = 4096 (top-2 of 8), bf16 and
fp8 rowwise, on routed rows (a bincount of a uniform draw) and on equal groups. Each variant's
output is compared with the shipped tile's. Then the whole Scout TP8 layer at T = 16384 (bf16,
fp8 rowwise) with every compute-bound tile changed alike (configs.override), in turns, two
rounds. Writes $OUT/probe_compute_tail.json. Results: results/probe_compute_tail_7c23fc6.json
(this form: tail rows lost; one input set, so x stays in L2 between replays where it fits,
42 MB at Scout T = 4096: probe_prefill_vs_torch.py compares with torch in the suite's rotated
sets), _276bc48.json (the same with TileConfig.split_last_wave, on branch
`split`: mixed, not taken); benchmarks/notes/layer.md says why (the power cap).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pathlib

import torch

from shufflemoe import MoE, preset
from shufflemoe.bench.peers import _scaled_grouped_mm
from shufflemoe.bench.report import metadata
from shufflemoe.bench.timing import time_fn
from shufflemoe.ops.grouped_gemm import configs

from probe_prefill_groups import _max_rel_diff, _operands, _time_tile
from probe_tail_tiles import _sizes

CASES = {  # name: (preset, tp, T)
    "scout-tp8 T=16384": ("llama4-scout", 8, 16384),
    "scout-tp8 T=4096": ("llama4-scout", 8, 4096),
    "qwen3-30b-a3b T=16384": ("qwen3-30b-a3b", 1, 16384),
    "mixtral-tp2 T=4096": ("mixtral-8x7b", 2, 4096),
}
TAILS = (32, 64)


def _compute_bound(tile: configs.TileConfig) -> bool:
    return tile.flatten and tile.block_m == 128 and tile.block_n == 256 and not tile.tail_m


def _variants(shipped: configs.TileConfig) -> dict:
    tiles = {"shipped": shipped, "not flattened": shipped.with_(flatten=False)}
    for tail in TAILS:
        tiles[f"tail {tail}"] = shipped.with_(flatten=False, tail_m=tail)
    return tiles


def _peer(fmt: str, x, w, m, kw: dict):
    offs = torch.cumsum(m, 0).to(torch.int32)
    if fmt == "bf16":
        return lambda i: torch._grouped_mm(x, w.transpose(1, 2), offs=offs)
    return lambda i: _scaled_grouped_mm(x, kw["x_scale"], w, kw["w_scale"], offs)


def gemm_rows() -> list[dict]:
    rows = []
    for case, (name, tp, T) in CASES.items():
        cfg = preset(name, tp=tp)
        E, D, I, A = cfg.num_experts, cfg.hidden_size, cfg.intermediate_size, T * cfg.top_k
        for fmt in ("bf16", "fp8_rowwise"):
            for gemm, (N, K) in {"gate_up": (2 * I, D), "down": (D, I)}.items():
                x, w, kw, out, shipped = _operands(fmt, N, K, E, "cuda", rows=A)
                if not _compute_bound(shipped):
                    print(json.dumps(dict(case=case, format=fmt, gemm=gemm,
                                          skipped=f"ships {shipped}")))
                    continue
                for routing in ("routed", "equal"):
                    m = _sizes(A, E, routing, "cuda")
                    base = dict(case=case, format=fmt, gemm=gemm, routing=routing,
                                rows_max=int(m.max()), rows_min=int(m.min()))
                    want = None
                    for label, tile in _variants(shipped).items():
                        try:
                            t = _time_tile(tile, x, w, m, out, kw)
                        except Exception as e:  # a tile past the shared memory: say so, go on
                            print(json.dumps(dict(base, variant=label, error=str(e)[:200])))
                            continue
                        if want is None:
                            want = out.float().clone()
                        rows.append(_row(base, label, t, A, N, K,
                                         max_rel_diff=_max_rel_diff(out, want),
                                         nan_rows=int(out.isnan().any(1).sum())))
                    t = time_fn(_peer(fmt, x, w, m, kw), 1, reps=20)
                    rows.append(_row(base, "torch", t, A, N, K))
                del x, w, out
                torch.cuda.empty_cache()
    return rows


def _row(base: dict, variant: str, t, A: int, N: int, K: int, **extra) -> dict:
    row = dict(base, variant=variant, us=t.median_us, us_lo=t.p20_us, us_hi=t.p80_us,
               tflops=2.0 * A * N * K / t.median_us / 1e6, **extra)
    print(json.dumps(row), flush=True)
    return row


def _tail_rule(tail: int):
    """An override: the heuristic's tiles, its compute-bound ones with tail rows, not flattened."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count

    def pick(key):
        tile = configs._for_format(*key, "none", sms, False)
        return tile.with_(flatten=False, tail_m=tail) if _compute_bound(tile) else tile
    return pick


def layer_rows(rounds: int = 2) -> list[dict]:
    rows, T = [], 16384
    for fmt in ("none", "fp8_rowwise"):
        torch.manual_seed(0)
        layer = MoE(preset("llama4-scout", tp=8).replace(quantization=fmt), device="cuda")
        x = torch.randn(T, layer.config.hidden_size, device="cuda", dtype=torch.bfloat16)
        rules = {"shipped": None, **{f"tail {t}": _tail_rule(t) for t in TAILS}}
        want = layer(x).float()
        for r in range(rounds):
            for label, rule in rules.items():
                with configs.override(rule) if rule else contextlib.nullcontext():
                    t = time_fn(lambda i: layer(x), 1, reps=20)
                    got = layer(x).float()
                row = dict(case="scout-tp8 layer T=16384", format=fmt, variant=label, round=r,
                           us=t.median_us, us_lo=t.p20_us, us_hi=t.p80_us,
                           max_rel_diff=_max_rel_diff(got, want))
                print(json.dumps(row), flush=True)
                rows.append(row)
        del layer, x
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=pathlib.Path)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = gemm_rows() + layer_rows()
    (args.out / "probe_compute_tail.json").write_text(json.dumps(
        dict(meta=metadata(), rows=rows), indent=1))


if __name__ == "__main__":
    main()
