"""Does a long queue of GPU work raise the host time host_cost measures? host_cost times CALLS = 30
back-to-back block calls from a drained queue; where a call's GPU time is several times its host
time (Mixtral-8x7B at T = 1: 259 us of GPU work a call), the queue grows by the difference every
call. One GPU call: host_cost's models and paths (ours eager and per-layer graphs; transformers'
grouped_mm), host us per call for runs of 3, 10 and 30 calls, every (path, run length)
interleaved within each of ROUNDS rounds; median [p20, p80].

    PYTHONPATH=src python benchmarks/probe_host_queue.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import pathlib

import torch

from shufflemoe.bench.report import metadata
from shufflemoe.bench.suites import host_cost as hc
from shufflemoe.integrations.transformers import patch
from shufflemoe.integrations.transformers.models import build_model

RUNS = (3, 10, 30)
ROUNDS = 15
MODELS = ("mixtral-8x7b", "llama4-scout", "qwen3-30b-a3b")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=pathlib.Path)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for shape in [s for s in hc.SHAPES if s.name in MODELS]:
        cfg = hc.config(shape)
        impl = shape.experts[0]
        paths = {"ours eager": hc.first_block(patch(build_model(cfg, torch.bfloat16, "cuda"),
                                                    graph_buckets=None)),
                 "ours graphs": hc.first_block(patch(build_model(cfg, torch.bfloat16, "cuda"))),
                 f"transformers {impl or 'default'}": hc.first_block(
                     build_model(cfg, torch.bfloat16, "cuda", experts_implementation=impl))}
        x = torch.randn(1, 1, shape.fields["hidden_size"], device="cuda", dtype=torch.bfloat16)
        fns = {name: hc._alternating(block, (x, x.clone())) for name, block in paths.items()}
        samples = {(n, c): [] for n in fns for c in RUNS}
        with torch.no_grad():
            for fn in fns.values():
                for _ in range(3):
                    fn()
            gpu = {n: hc.gpu_us(fn) for n, fn in fns.items()}
            for _ in range(ROUNDS):
                for (n, c), s in samples.items():
                    s.append(hc._sample(fns[n], c)[0])
        for (n, c), s in samples.items():
            s.sort()
            rows.append(dict(model=shape.name, path=n, calls=c, host_us=s[len(s) // 2],
                             p20=s[len(s) // 5], p80=s[(4 * len(s)) // 5], gpu_us=gpu[n]))
            print(json.dumps(rows[-1]), flush=True)
        del paths, fns
        torch.cuda.empty_cache()
    (args.out / "probe_host_queue.json").write_text(json.dumps(dict(meta=metadata(), rows=rows),
                                                               indent=1))


if __name__ == "__main__":
    main()
