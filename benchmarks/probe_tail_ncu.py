"""Where does a tail-row tile's time go? Nsight Compute on Maverick's routed GEMMs (one GPU call)

    PYTHONPATH=src ncu --clock-control none --set detailed --section WarpStateStats \
        --section SchedulerStats --section InstructionStats -k regex:grouped_gemm \
        --csv --page details python benchmarks/probe_tail_ncu.py > $OUT/ncu.csv
    PYTHONPATH=src python benchmarks/probe_tail_ncu.py --loop 4   # beside nvidia-smi -lms

probe_tail_rows: equal groups of 129 rows take 4-17% longer than groups of 128 in the shipped
128 x 256 tile, with the same weight bytes (half the row tiles run the loop with the tail dot).
This launches Llama 4 Maverick TP8's routed GEMMs (bf16, gate_up then down) once each on equal
groups of 128 and then 129 rows in the tile the layer ships at T = 16384 (the heuristic alone
picks another tile past 128 rows a group), after one untimed launch of each (compiles; NVTX
range names say which is which), so a profiler can compare the two kernels' stall reasons,
issue slots and memory throughput. Prints the launch order. With --loop S, each case runs
back to back for S seconds instead (its start and end printed with time.time()), for a clock
and power log taken beside it.

With --scout it runs Llama 4 Scout TP8's routed bf16 gate_up at T = 16384 instead (16 experts of
about 1024 rows; the compute-bound 128 x 256 flattened tile the heuristic ships there) on routed
groups (a bincount of a uniform draw) and on equal groups of 1024: routed it takes 1.08-1.11x
longer (probe_compute_tail at 7c23fc6 and 276bc48), and tail rows or a split last wave did not
recover it. Results at 01719eb (results/probe_tail_ncu_scout_01719eb.csv,
probe_tail_power_scout_01719eb*): one launch loses a ninth, partial wave and 5% more tile work;
back to back both run at the 700 W cap (benchmarks/notes/layer.md).
"""

from __future__ import annotations

import argparse
import time

import torch

from shufflemoe import preset
from shufflemoe.ops import grouped_gemm
from shufflemoe.ops.grouped_gemm import configs

from probe_prefill_groups import _operands
from probe_tail_tiles import _sizes


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--loop", type=float, default=0.0, help="seconds of back-to-back launches")
    p.add_argument("--scout", action="store_true", help="Scout's gate_up, routed and equal")
    args = p.parse_args()
    if args.scout:
        return scout(args.loop)
    cfg = preset("llama4-maverick", tp=8)
    E, D, I = cfg.num_experts, cfg.hidden_size, cfg.intermediate_size
    for gemm, (N, K) in {"gate_up": (2 * I, D), "down": (D, I)}.items():
        x, w, kw, out, _ = _operands("bf16", N, K, E, "cuda", rows=E * 129)
        shipped = configs.select(16384, N, K, E, x.dtype, "none")  # with tail rows
        for R in (128, 129):
            m = torch.full((E,), R, dtype=torch.int32, device="cuda")
            with configs.override(shipped):  # as the layer picks at T = 16384, any R
                _launches(lambda: grouped_gemm(x[: E * R], w, m, out=out[: E * R], **kw),
                          f"bf16 {gemm} R={R}", args.loop)


def scout(loop: float) -> None:
    cfg = preset("llama4-scout", tp=8)
    E, D, I, T = cfg.num_experts, cfg.hidden_size, cfg.intermediate_size, 16384
    x, w, kw, out, _ = _operands("bf16", 2 * I, D, E, "cuda", rows=T)
    for routing in ("routed", "equal"):
        m = _sizes(T, E, routing, "cuda")
        _launches(lambda: grouped_gemm(x, w, m, out=out, **kw),
                  f"scout bf16 gate_up {routing} (rows {int(m.min())}-{int(m.max())})", loop)


def _launches(call, label: str, loop: float) -> None:
    """call() once untimed (compiles), then once in an NVTX range (or back to back for loop
    seconds); says which."""
    call()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push(label)
    start, n = time.time(), 0
    while True:
        call()
        n += 1
        if n % 50 == 0 or not loop:
            torch.cuda.synchronize()
            if time.time() - start >= loop:
                break
    torch.cuda.nvtx.range_pop()
    if loop:
        print(f"{label}: {n} launches from {start:.2f} to {time.time():.2f}, "
              f"{(time.time() - start) / n * 1e6:.0f} us a launch", flush=True)
    else:
        print(f"launches: warm-up, then profiled: {label}", flush=True)


if __name__ == "__main__":
    main()
