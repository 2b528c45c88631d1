"""The decode switch past its pair limit: the fused two-kernel path (configs.ALWAYS) against the
unfused one (configs.NEVER) at T = 16..256, one GPU call; probe_combine.py's switch part (CUDA-
graph replays over rotated weight copies and 8 inputs, each path checked against float64) at
larger T and with Llama 4 Maverick TP8. Writes $OUT/probe_switch_tokens.json.

    PYTHONPATH=src python benchmarks/probe_switch_tokens.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import probe_combine
from shufflemoe import preset
from shufflemoe.bench.report import metadata

probe_combine.SWITCH = {"scout-tp8": preset("llama4-scout", tp=8),
                        "maverick-tp8": preset("llama4-maverick", tp=8),
                        "qwen3-30b-a3b": preset("qwen3-30b-a3b"),
                        "mixtral-tp2": preset("mixtral-8x7b", tp=2)}
probe_combine.SWITCH_T = (16, 32, 64, 128, 256)

if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=pathlib.Path)
    p.add_argument("--budget", type=float, default=300.0)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = probe_combine.switch_rows("cuda", False, time.time() + args.budget)
    result = dict(meta=metadata(), rows=rows)
    (args.out / "probe_switch_tokens.json").write_text(json.dumps(result, indent=1))
    print(probe_combine.markdown(result))
