"""The unfused path's gather in the first grouped GEMM's loads, against gather_scale's own pass,
in the layer, one GPU call. Since <this commit> ``shuffled`` gathers (and scales) 16-bit rows in
GEMM13's loads (ops.grouped_gemm's x_ids / x_weights: pointer loads of x's rows, the weights
still through TMA) instead of writing the [A, D] copy first; "separate" patches the strategy
back to gather_scale + a TMA-fed GEMM. Each variant checked against float64, then timed as
CUDA-graph replays over rotated weight copies (probe_combine's helpers), three rounds in turns.
Writes $OUT/probe_gather_gemm.json.

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
import types

if "--dry-run" in sys.argv and not os.environ.get("TRITON_INTERPRET"):
    os.environ["TRITON_INTERPRET"] = "1"  # before triton decorates any kernel

import torch  # noqa: E402

from probe_combine import N_SETS, _check, _graph_us, _layers  # noqa: E402
from shufflemoe import preset  # noqa: E402
from shufflemoe.bench.report import metadata  # noqa: E402
from shufflemoe.experts import shuffled  # noqa: E402

CASES = [("scout-tp8", "llama4-scout", 8, "none", (128, 2048, 16384)),
         ("maverick-tp8", "llama4-maverick", 8, "none", (16384,)),
         ("qwen3-30b-a3b", "qwen3-30b-a3b", 1, "none", (64, 128, 2048, 16384)),
         ("qwen3-30b-a3b", "qwen3-30b-a3b", 1, "fp8_w8a16", (64,)),
         ("qwen3-30b-a3b", "qwen3-30b-a3b", 1, "mxfp4", (64,)),
         ("mixtral-tp2", "mixtral-8x7b", 2, "none", (64, 2048)),
         ("mixtral-tp2", "mixtral-8x7b", 2, "fp8_w8a16", (64,))]


@contextlib.contextmanager
def separate():
    """shuffled as before: every format's rows through gather_input, then the GEMM."""
    real = shuffled.FORMATS
    shuffled.FORMATS = {k: types.SimpleNamespace(activation="separate") for k in real}
    try:
        yield
    finally:
        shuffled.FORMATS = real


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
            row["check_fused"] = _check(layers[0], xs[0])
            with separate():
                row["check_separate"] = _check(layers[0], xs[0])
                same = torch.equal(layers[0](xs[0]), layers[0](xs[0]))
                ref = layers[0](xs[0])
            row["bits_equal"] = bool(same and torch.equal(layers[0](xs[0]), ref))
            for r in range(1 if dry else 3):
                row[f"fused_{r}"] = _graph_us(use, xs, dry)
                with separate():
                    row[f"separate_{r}"] = _graph_us(use, xs, dry)
            if not dry:
                f = min(row[f"fused_{r}"]["us"] for r in range(3))
                s = min(row[f"separate_{r}"]["us"] for r in range(3))
                row["separate_over_fused"] = s / f
            rows.append(row)
            print(json.dumps(row), flush=True)
        del layers
        if device == "cuda":
            torch.cuda.empty_cache()
    (args.out / "probe_gather_gemm.json").write_text(
        json.dumps(dict(meta=metadata(), rows=rows), indent=1))


if __name__ == "__main__":
    main()
