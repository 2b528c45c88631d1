"""cProfile of a patched block's host path (per-layer graphs, T = 1): where the Python time
between the block call and GraphedMoE goes, per host_cost shape (first argument: a shape name,
default all). Prints the top functions by own time.

    PYTHONPATH=src python benchmarks/profile_block.py [qwen3-30b-a3b]
"""

from __future__ import annotations

import cProfile
import pstats
import sys

import torch

from shufflemoe.bench.suites.host_cost import SHAPES, _models, first_block

CALLS = 3000


def main() -> None:
    for shape in SHAPES:
        if len(sys.argv) > 1 and shape.name not in sys.argv[1:]:
            continue
        block = first_block(_models(shape)["ours graphs"])
        x = torch.randn(1, 1, shape.fields["hidden_size"], device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            for _ in range(20):
                block(x)
            torch.cuda.synchronize()
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(CALLS):
                block(x)
            prof.disable()
            torch.cuda.synchronize()
        print(f"== {shape.name}: {CALLS} calls")
        pstats.Stats(prof).sort_stats("tottime").print_stats(14)


if __name__ == "__main__":
    main()
