"""Why do the fused decode kernels stream a few MB below the read ceiling? Nsight Compute on them.

    PYTHONPATH=src ncu --clock-control none --set detailed --section WarpStateStats \
        --section SchedulerStats --section InstructionStats \
        -k regex:'gate_up|down' --csv --page details \
        python benchmarks/probe_decode_ncu.py qwen3-30b-a3b fp8_rowwise 1 > $OUT/ncu.csv

At T = 1 the layer suite (H200, 7113bf8) reads 55-63% of the read ceiling in bf16 and 34-45%
in fp8 rowwise for Llama 4 Scout TP8 and Qwen3-30B-A3B; probe_timeline has fp8's gate_up
streaming its 25 MB at about 2 TB/s where bf16's streams 50 MB at 3.2. This builds one layer
(preset, format, T), calls it once untimed (compiles) and then once more with a new input (new
routing) inside an NVTX range, so a profiler filtered to the decode kernels sees each of them
twice: the second launch is the one to read (stall reasons, issue slots, occupancy, DRAM
throughput). Results at 07a313c (H200): results/probe_decode_ncu_07a313c_*.csv, read in
benchmarks/notes/layer.md ("Where a decode launch's time goes, per kernel").
"""

from __future__ import annotations

import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from decode_check import PRESETS  # noqa: E402

from shufflemoe import MoE  # noqa: E402


def main(name: str, fmt: str, T: int) -> None:
    cfg = PRESETS[name].replace(quantization=fmt)
    torch.manual_seed(0)
    layer = MoE(cfg, device="cuda")
    xs = [torch.randn(T, cfg.hidden_size, device="cuda", dtype=cfg.dtype) for _ in range(2)]
    layer(xs[0])
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push(f"{name} {fmt} T={T}")
    layer(xs[1])
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
