"""The unfused path's first grouped GEMM doing more than its product, in the layer, one GPU
call: gathering its rows itself (ops.grouped_gemm's x_ids: pointer loads of x's rows,
the weights still through TMA, where shuffled._gathers_in_gemm says so) and the GLU in its
epilogue (glu=: a [A, I] from the fp32 sums instead of h [A, 2I] for silu_mul; formats whose
GEMM2 takes a in the model dtype, shuffled._glu_in_gemm). Variants: "default" (the layer as
shipped); "no_glu" (h stored, silu_mul after); "separate" (neither: gather_scale's [A, D] copy,
a TMA-fed GEMM, silu_mul, as before both). Each checked against float64; "separate" and GEMM13
gathering wherever the rows are not scaled (without the GLU) give the same bits. Timed as CUDA-graph
replays over rotated weight copies (probe_combine's helpers), ROUNDS rounds in turns. Writes
$OUT/probe_gather_gemm.json. (results/probe_gather_gemm_ab92b7b.json: at ab92b7b, before the
GLU, where the layer's GEMM13 gathered for every 16-bit format, rows scaled at the input too,
x_weights in registers, since removed from the kernel; results/probe_gather_gemm_2809e21.json
ran this version on an H200.)

    PYTHONPATH=src:benchmarks python benchmarks/probe_gather_gemm.py --out $OUT
    PYTHONPATH=src:benchmarks python benchmarks/probe_gather_gemm.py --dry-run --out /tmp/x
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import sys
import time

if "--dry-run" in sys.argv and not os.environ.get("TRITON_INTERPRET"):
    os.environ["TRITON_INTERPRET"] = "1"  # before triton decorates any kernel

import torch  # noqa: E402

from probe_combine import N_SETS, _check, _graph_us, _layers  # noqa: E402
from shufflemoe import preset  # noqa: E402
from shufflemoe.bench.report import metadata  # noqa: E402
from shufflemoe.experts import shuffled  # noqa: E402

CASES = [("scout-tp8", "llama4-scout", 8, "none", (128, 16384)),
         ("maverick-tp8", "llama4-maverick", 8, "none", (16384,)),
         ("qwen3-30b-a3b", "qwen3-30b-a3b", 1, "none", (64, 128, 2048, 16384)),
         ("qwen3-30b-a3b", "qwen3-30b-a3b", 1, "fp8_w8a16", (64,)),
         ("qwen3-30b-a3b", "qwen3-30b-a3b", 1, "mxfp4", (64,)),
         ("mixtral-tp2", "mixtral-8x7b", 2, "none", (64, 2048))]
ROUNDS = 2


@contextlib.contextmanager
def patched(**choices):
    """shuffled's rules replaced: _gathers_in_gemm=..., _glu_in_gemm=... (None: as shipped)."""
    real = {name: getattr(shuffled, name) for name in choices}
    for name, choice in choices.items():
        if choice is not None:
            setattr(shuffled, name, choice)
    try:
        yield
    finally:
        for name, fn in real.items():
            setattr(shuffled, name, fn)


def _always(x, w, w_in) -> bool:
    return not isinstance(x, tuple) and w_in is None


def _never(*args) -> bool:
    return False


VARIANTS = {"default": {}, "no_glu": dict(_glu_in_gemm=_never),
            "separate": dict(_gathers_in_gemm=_never, _glu_in_gemm=_never)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=pathlib.Path)
    p.add_argument("--budget", type=float, default=200.0)
    p.add_argument("--dry-run", action="store_true")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    dry, device = args.dry_run, "cpu" if args.dry_run else "cuda"
    deadline = time.time() + args.budget
    rows = []
    for name, model, tp, fmt, tokens in CASES:
        cfg = preset(model, tp=tp).replace(quantization=fmt)
        if dry:
            cfg = cfg.replace(hidden_size=64, intermediate_size=64, num_experts=8,
                              shared_intermediate_size=64 if cfg.shared_intermediate_size else 0)
            tokens = tokens[:1]
        layers = _layers(cfg, device, dry)
        for T in tokens:
            row = dict(preset=name, format=fmt, T=T)
            if time.time() > deadline:
                rows.append(dict(row, note="skipped: time budget"))
                continue
            xs = [torch.randn(T, cfg.hidden_size, device=device, dtype=cfg.dtype)
                  for _ in range(2 if T >= 8192 else N_SETS)]
            use = layers[:2] if T >= 8192 else layers
            for label, choices in VARIANTS.items():
                with patched(**choices):
                    row[f"check_{label}"] = _check(layers[0], xs[0])
            with patched(_gathers_in_gemm=_always, _glu_in_gemm=_never):
                gathered = layers[0](xs[0])
            with patched(**VARIANTS["separate"]):
                row["bits_equal"] = torch.equal(gathered, layers[0](xs[0]))
            for r in range(1 if dry else ROUNDS):
                for label, choices in VARIANTS.items():
                    with patched(**choices):
                        row[f"{label}_{r}"] = _graph_us(use, xs, dry)
            if not dry:
                best = {v: min(row[f"{v}_{r}"]["us"] for r in range(ROUNDS)) for v in VARIANTS}
                for v in ("no_glu", "separate"):
                    row[f"{v}_over_default"] = best[v] / best["default"]
            rows.append(row)
            print(json.dumps(row), flush=True)
        del layers
        if device == "cuda":
            torch.cuda.empty_cache()
    (args.out / "probe_gather_gemm.json").write_text(
        json.dumps(dict(meta=metadata(), rows=rows), indent=1))


if __name__ == "__main__":
    main()
