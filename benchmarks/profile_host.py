"""Where the host time of one eager MoE block call goes, on the GPU machine: cProfile of CALLS
calls of the patched first block (host_cost's one-layer models at real widths), top functions by
own time and by cumulative time, for the shapes named (default: all of host_cost.SHAPES) at
T = 1, eager (graph_buckets=None) and replaying per-layer graphs (the default).

    PYTHONPATH=src python benchmarks/profile_host.py [qwen3-30b-a3b llama4-scout ...]
"""

from __future__ import annotations

import cProfile
import pstats
import sys

import torch

from shufflemoe.bench.suites import host_cost
from shufflemoe.integrations.transformers import patch
from shufflemoe.integrations.transformers.models import build_model

CALLS = 300


def main(names: list[str]) -> None:
    for shape in host_cost.SHAPES:
        if names and shape.name not in names:
            continue
        model = build_model(host_cost.config(shape), torch.bfloat16, "cuda")
        x = torch.randn(1, 1, shape.fields["hidden_size"], device="cuda", dtype=torch.bfloat16)
        for mode, buckets in (("eager", None), ("per-layer graphs", "auto")):
            block = host_cost.first_block(patch(model, graph_buckets=buckets))
            with torch.no_grad():
                for _ in range(10):
                    block(x)
                torch.cuda.synchronize()
                prof = cProfile.Profile()
                prof.enable()
                for _ in range(CALLS):
                    block(x)
                prof.disable()
                torch.cuda.synchronize()
            print(f"== {shape.name} T=1 {mode}: {CALLS} calls")
            stats = pstats.Stats(prof)
            stats.sort_stats("tottime").print_stats(22)
            stats.sort_stats("cumulative").print_stats(30)
        del model, block
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1:])
