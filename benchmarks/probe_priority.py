"""Does a high-priority routed path help where the shared expert runs on its side stream?

In a CUDA graph at decode (T = 2..512) a layer with a shared expert forks it onto a side stream
before the router (MoE.start_shared), so the shared expert's first GEMM and the router start
together. probe_timeline at T = 64 (H100, results/probe_timeline_tokens64_0bc76b1.txt): Llama 4
Scout TP8's router kernel took 7-11 us beside the shared expert's cuBLAS GEMM against 3-5 us
alone, and the routing, the gather and GEMM13 wait for it. Here the layer's graph is captured
on a stream of default priority (as now) and on a high-priority stream (the side stream keeps
the default, lowest, priority), each checked against float64 and timed as CUDA-graph replays
over rotated weight copies (probe_combine's helpers), in turns. Writes
$OUT/probe_priority.json.

    PYTHONPATH=src:benchmarks python benchmarks/probe_priority.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import pathlib

import torch

from probe_combine import N_SETS, _check, _graph_us, _layers
from shufflemoe import preset
from shufflemoe.bench.report import metadata

CASES = [("scout-tp8", "none", (2, 8, 64, 128)), ("scout-tp8", "fp8_rowwise", (8, 64, 128)),
         ("maverick-tp8", "none", (8, 64)), ("maverick-tp8", "fp8_rowwise", (64,))]
# --fused: where the shared expert runs in the fused decode kernels beside the routed ones (bf16,
# T <= 16), the rows the layer suite at f867b9a found slower, and the fp8 rows again
FUSED = [("maverick-tp8", "none", (4, 8, 16)), ("scout-tp8", "none", (4, 16)),
         ("scout-tp8", "fp8_rowwise", (64, 128)), ("maverick-tp8", "fp8_rowwise", (64, 128))]
PRESETS = {"scout-tp8": preset("llama4-scout", tp=8), "maverick-tp8": preset("llama4-maverick", tp=8)}
ROUNDS = 3


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=pathlib.Path)
    p.add_argument("--fused", action="store_true", help="the FUSED cases instead of CASES")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    streams = {"default capture stream": torch.cuda.Stream(),
               "high-priority capture stream": torch.cuda.Stream(priority=-1)}
    print(f"priorities: {[(k, s.priority) for k, s in streams.items()]}", flush=True)
    rows = []
    for name, fmt, Ts in FUSED if args.fused else CASES:
        cfg = PRESETS[name].replace(quantization=fmt)
        layers = _layers(cfg, "cuda", False)
        for T in Ts:
            xs = [torch.randn(T, cfg.hidden_size, device="cuda", dtype=cfg.dtype)
                  for _ in range(N_SETS)]
            row = dict(preset=name, format=fmt, T=T, check=_check(layers[0], xs[0]))
            for r in range(ROUNDS):
                for label, s in streams.items():
                    torch.cuda.graph.default_capture_stream = s
                    row.setdefault(label, []).append(_graph_us(layers, xs, False)["us"])
            rows.append(row)
            print(f"{name} {fmt} T={T} ({row['check']}): " + ", ".join(
                f"{k} {sorted(v)[1]:.1f} us {[round(u, 1) for u in v]}" for k, v in row.items()
                if isinstance(v, list)), flush=True)
        del layers
        torch.cuda.empty_cache()
    (args.out / f"probe_priority{'_fused' if args.fused else ''}.json").write_text(json.dumps(dict(meta=metadata(), rows=rows),
                                                             indent=1))


if __name__ == "__main__":
    main()
