"""Three programs an SM, one GEMM at a time: the layer in CUDA graphs (weights and inputs
rotating, probe_combine's helpers), each row checked against float64, with select()'s choice for
one GEMM (gate_up: K = D; down: N = D) changed and the other left as shipped. Where a whole-layer
probe (probe_mxfp4_dot.py) shows a rule winning on some presets and losing on others, this says
which GEMM shape wins or loses. The variants:

    mxfp4, 16-row swapped tiles at 128-value steps (139 registers): ctas_per_sm=3;
           at 256-value steps: k_parts=2 and ctas_per_sm=3 (168 registers);
    fp8_w8a16, 16-row swapped tiles: block_k=128 and ctas_per_sm=3 (142 registers);
    --set steps_256: mxfp4 16-row tiles at 128-value steps in 256-value steps of two parts,
    three programs an SM (steps_256);
    --set steps_256_back: that rule, landed for mxfp4 below K = 1024, taken back at the T it
    changed that no other run timed (two_at_128);
    --set fp8_block: its swapped 16 x 128 tiles (128-value steps, a scale block each, 18 KB a
    stage) with three programs an SM (three), or four stages at two (four_stages);
    --set dense: bf16 and fp8_rowwise 16-row swapped tiles, whose stages (36 KB each) hold them
    to two programs an SM: half the K step four stages deep (half_k), or two stages (two_stages),
    with ctas_per_sm=3;
    --set mid_mxfp4: mxfp4 (and fp8_w8a16) at 33-64 rows a group, WEIGHT_ONLY_MID_TILE taken back to the
    heuristic's tile for one GEMM (heuristic): which GEMM loses at Scout TP8 T = 1024;
    --set mid_back: 5aac30c's rule (the heuristic's tile there) against 05ee44a's, in turns;
    --set waves: bf16 and fp8_rowwise swapped 16 x 128 tiles at two programs an SM made 16 x 64
    (n64; twice the tiles: Scout TP8's down has 640 on 264 slots, 2.4 waves), or 16 x 64 at
    three an SM (n64_three).

The shipped layer is timed first and last (drift shows). Writes $OUT/probe_ctas[_<set>].json:

    PYTHONPATH=src:benchmarks python benchmarks/probe_ctas.py --out $OUT [--set <set>] [--budget s]
    python benchmarks/probe_ctas.py --table $OUT/probe_ctas.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import pathlib
import time

import torch

from probe_combine import N_SETS, _check, _graph_us, _layers
from shufflemoe import preset
from shufflemoe.bench.report import metadata
from shufflemoe.ops.grouped_gemm import configs as gg

CASES = (("mxfp4", "qwen3-30b-a3b", 1, (8, 64)), ("mxfp4", "gpt-oss-120b", 1, (8, 64)),
         ("mxfp4", "llama4-scout", 8, (16, 128)), ("mxfp4", "llama4-maverick", 8, (64,)),
         ("mxfp4", "mixtral-8x7b", 2, (8, 64)),
         ("fp8_w8a16", "qwen3-30b-a3b", 1, (8, 64)), ("fp8_w8a16", "llama4-scout", 8, (16, 128)),
         ("fp8_w8a16", "llama4-maverick", 8, (8, 64)), ("fp8_w8a16", "mixtral-8x7b", 2, (8, 64)))


def three_an_sm(cfg: gg.TileConfig, quant: str, key=None) -> gg.TileConfig:
    """The variant of a shipped tile (itself where none applies)."""
    if not (cfg.swap_ab and cfg.block_m == 16 and cfg.block_n == 128) or cfg.ctas_per_sm == 3:
        return cfg
    if quant == "mxfp4":
        if cfg.block_k // cfg.k_parts <= 128:
            return cfg.with_(ctas_per_sm=3)
        return cfg.with_(k_parts=2, ctas_per_sm=3)
    if quant == "fp8_w8a16":
        return cfg.with_(block_k=128, ctas_per_sm=3)
    return cfg


def _swapped_16(change, block_n: int | None = None):
    """A variant: ``change`` on the swapped 16-row tiles at two programs an SM (of ``block_n``
    columns where given), the other tiles as shipped."""
    def variant(cfg: gg.TileConfig, quant: str, key=None) -> gg.TileConfig:
        if not (cfg.swap_ab and cfg.block_m == 16 and cfg.ctas_per_sm == 2
                and block_n in (None, cfg.block_n)):
            return cfg
        return change(cfg)
    return variant


DENSE_CASES = (("none", "llama4-scout", 8, (64, 128)), ("fp8_rowwise", "llama4-scout", 8, (64, 128)),
               ("none", "qwen3-30b-a3b", 1, (64,)), ("fp8_rowwise", "qwen3-30b-a3b", 1, (64,)),
               ("fp8_rowwise", "llama4-maverick", 8, (64, 128)),
               ("fp8_rowwise", "mixtral-8x7b", 2, (64,)))


def steps_256(cfg: gg.TileConfig, quant: str, key=None) -> gg.TileConfig:
    """mxfp4 16-row tiles at 128-value steps: 256-value steps in two parts, three an SM (half
    the K loop's steps, as many registers: Qwen3-30B-A3B's down at K = 768 lost with three
    programs an SM at six steps)."""
    if quant != "mxfp4" or not (cfg.swap_ab and cfg.block_m == 16 and cfg.block_k == 128):
        return cfg
    return cfg.with_(block_k=256, k_parts=2, ctas_per_sm=3)


def two_at_128(cfg: gg.TileConfig, quant: str, key=None) -> gg.TileConfig:
    """steps_256's rule taken back (shipped at ce0962e for mxfp4 below K = 1024): 128-value
    steps in one part, two programs an SM."""
    if quant != "mxfp4" or not (cfg.swap_ab and cfg.block_m == 16 and cfg.k_parts == 2):
        return cfg
    return cfg.with_(block_k=128, k_parts=1, ctas_per_sm=2)


def mid_heuristic(cfg: gg.TileConfig, quant: str, key=None) -> gg.TileConfig:
    """WEIGHT_ONLY_MID_TILE taken back: the heuristic's tile for the key (98f68a4's)."""
    if quant not in gg.WEIGHT_ONLY_MID_FORMATS or cfg != gg.WEIGHT_ONLY_MID_TILE:
        return cfg
    M, N, K, G, dtype = key
    return gg._heuristic(gg.m_bucket(M), N, K, G, dtype)


MID_CASES = (("mxfp4", "llama4-scout", 8, (1024,)), ("mxfp4", "qwen3-30b-a3b", 1, (1024,)),
             ("mxfp4", "mixtral-8x7b", 2, (256,)), ("fp8_w8a16", "llama4-scout", 8, (1024,)),
             ("fp8_w8a16", "qwen3-30b-a3b", 1, (1024,)), ("fp8_w8a16", "mixtral-8x7b", 2, (256,)))
def mid_back(cfg: gg.TileConfig, quant: str, key=None) -> gg.TileConfig:
    """5aac30c's rule taken back: mxfp4 at 33-64 rows a group of few weight tiles gets
    WEIGHT_ONLY_MID_TILE again (05ee44a's choice)."""
    M, N, K, G, dtype = key
    if quant != "mxfp4" or G <= 1 or not 32 < -(-gg.m_bucket(M) // G) <= 64:
        return cfg
    return gg.WEIGHT_ONLY_MID_TILE


# deep K with many tiles (Maverick's gate_up: K = 5120 like Scout's, 2048 tiles not 256)
MID_WIDE_CASES = (("mxfp4", "llama4-maverick", 8, (8192,)), ("mxfp4", "deepseek-v3", 8, (2048,)),
                  ("mxfp4", "gpt-oss-120b", 1, (2048,)))
WAVE_CASES = (("none", "llama4-scout", 8, (64, 128)), ("fp8_rowwise", "llama4-scout", 8, (64, 128)),
              ("fp8_rowwise", "llama4-maverick", 8, (64,)), ("fp8_rowwise", "mixtral-8x7b", 2, (64,)),
              ("fp8_rowwise", "qwen3-30b-a3b", 1, (64, 128)))
BLOCK_CASES = tuple(("fp8_block", name, tp, (8, 64)) for name, tp in (
    ("qwen3-30b-a3b", 1), ("llama4-scout", 8), ("llama4-maverick", 8), ("mixtral-8x7b", 2)))
SETS = {"weight_only": (CASES, {"three": three_an_sm}),
        "steps_256": (CASES[:5], {"steps_256": steps_256}),
        # the rows at which the landed steps_256 rule changed Qwen3's down but the layer suite
        # does not time (T = 8 and 64 are steps_256's own rows)
        "steps_256_back": ((("mxfp4", "qwen3-30b-a3b", 1, (4, 16, 32, 128, 256)),),
                           {"two_at_128": two_at_128}),
        "fp8_block": (BLOCK_CASES, {
            "three": _swapped_16(lambda c: c.with_(ctas_per_sm=3), 128),
            "four_stages": _swapped_16(lambda c: c.with_(num_stages=4), 128)}),
        # Maverick T = 64 lost with three (its fp8_block and fp8_w8a16 rows are bimodal in the
        # layer suite): again, beside T = 16 and 128, T = 64 twice
        "fp8_block_maverick": ((("fp8_block", "llama4-maverick", 8, (16, 64, 128, 64)),), {
            "three": _swapped_16(lambda c: c.with_(ctas_per_sm=3), 128)}),
        "dense": (DENSE_CASES, {
            "half_k": _swapped_16(lambda c: c.with_(block_k=c.block_k // 2, num_stages=4,
                                                    ctas_per_sm=3)),
            "two_stages": _swapped_16(lambda c: c.with_(num_stages=2, ctas_per_sm=3))}),
        "mid_mxfp4": (MID_CASES, {"heuristic": mid_heuristic}),
        "mid_mxfp4_wide": (MID_WIDE_CASES, {"heuristic": mid_heuristic}),
        "mid_back": ((MID_CASES[0], MID_CASES[2]) * 2, {"back": mid_back}),
        "waves": (WAVE_CASES, {
            "n64": _swapped_16(lambda c: c.with_(block_n=64), 128),
            "n64_three": _swapped_16(lambda c: c.with_(block_n=64, ctas_per_sm=3), 128)})}


def _patched(which: str, D: int, variant, changed: set):
    shipped = gg.select

    def select(M, N, K, G, dtype, quant="none", sms=gg.TUNED_SMS):
        cfg = shipped(M, N, K, G, dtype, quant, sms)
        mine = (which == "gate_up" and K == D and N != D) or (which == "down" and N == D)
        new = variant(cfg, quant, key=(M, N, K, G, dtype)) if mine else cfg
        if new != cfg:
            changed.add(f"{N}x{K}: {cfg} -> {new}")
        return new
    return shipped, select


def measure(out: pathlib.Path, budget: float, which_set: str) -> None:
    deadline = time.time() + budget
    cases, variants = SETS[which_set]
    rows = []
    for quant, name, tp, Ts in cases:
        cfg = preset(name, tp=tp).replace(quantization=quant)
        layers = _layers(cfg, "cuda", False)
        for T in Ts:
            row = dict(quant=quant, preset=name, tp=tp, T=T)
            if time.time() > deadline:
                rows.append(dict(row, skipped="time budget"))
                continue
            xs = [torch.randn(T, cfg.hidden_size, device="cuda", dtype=cfg.dtype)
                  for _ in range(N_SETS)]
            with torch.no_grad():
                row["shipped"] = _graph_us(layers, xs, False)
                for (vname, variant), which in itertools.product(variants.items(),
                                                                 ("gate_up", "down")):
                    changed: set = set()
                    shipped, patched = _patched(which, cfg.hidden_size, variant, changed)
                    gg.select = patched
                    try:
                        check = _check(layers[0], xs[0])
                        got = dict(check=check, **_graph_us(layers, xs, False))
                    finally:
                        gg.select = shipped
                    row[which if vname == "three" else f"{which} {vname}"] = dict(
                        got, changed=sorted(changed))
                row["shipped_again"] = _graph_us(layers, xs, False)
            rows.append(row)
            print(json.dumps(row), flush=True)
        del layers
        torch.cuda.empty_cache()
    name = "probe_ctas.json" if which_set == "weight_only" else f"probe_ctas_{which_set}.json"
    (out / name).write_text(json.dumps(dict(meta=metadata(), rows=rows), indent=1))


def table(path: pathlib.Path) -> str:
    """Markdown: the shipped layer (first, last) and each GEMM's variant, us and shipped / variant
    (the mean of the two shipped times over the variant's)."""
    result = json.loads(path.read_text())
    names = [k for k in result["rows"][0] if k.startswith(("gate_up", "down"))]
    lines = ["| format | preset | T | shipped us (first, last) | " + " | ".join(names) + " |",
             "| --- " * (4 + len(names)) + "|"]
    for r in result["rows"]:
        if "shipped" not in r:
            continue
        base = (r["shipped"]["us"] + r["shipped_again"]["us"]) / 2
        cells = []
        for which in names:
            v = r[which]
            cells.append("unchanged" if not v["changed"] else
                         f"{v['us']:.1f} ({base / v['us']:.3f}x){'' if v['check'] == 'ok' else ' ' + v['check']}")
        lines.append(f"| {r['quant']} | {r['preset']} TP{r['tp']} | {r['T']} | "
                     f"{r['shipped']['us']:.1f}, {r['shipped_again']['us']:.1f} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=pathlib.Path)
    ap.add_argument("--budget", type=float, default=240.0, help="seconds before rows are skipped")
    ap.add_argument("--set", default="weight_only", choices=sorted(SETS))
    ap.add_argument("--table", type=pathlib.Path, help="print a result file's table")
    args = ap.parse_args()
    if args.table:
        print(table(args.table), end="")
        return
    args.out.mkdir(parents=True, exist_ok=True)
    measure(args.out, args.budget, args.set)


if __name__ == "__main__":
    main()
