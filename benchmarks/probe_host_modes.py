"""Whether a process's host speed depends on where it runs (one GPU call, ~2-3 min)

    PYTHONPATH=src python benchmarks/probe_host_modes.py --out $OUT [--procs 8]

e2e_hf's host-bound rows on the H200 host are one process's draw: the Scout compile row gave
1.19-1.82x (ours against transformers, interleaved in the process) over four processes of two
source trees (probe_compile_ab, notes/e2e_hf.md). This probe starts --procs processes unpinned,
then one pinned to the GPU's local cores (the CPU affinity of `nvidia-smi topo -m`) and one
pinned to each of 8 single cores spread over the allowed ones, and in each times the host's work of
a decode step's kinds, median of ROUNDS rounds: a Python loop, a CPU aten op, a CUDA aten launch
(no sync), a Triton launch (no sync), and the CPU the process ran on. Writes
$OUT/probe_host_modes.json (with the run's metadata: set SHUFFLEMOE_COMMIT) and prints each
process's line.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import time

ROUNDS, N = 5, 2000


def _cpu() -> int:
    return int(pathlib.Path("/proc/self/stat").read_text().split()[38])


def child() -> dict:
    import torch
    import triton
    import triton.language as tl

    from shufflemoe.bench.ceilings import python_loop_ms  # the suites' host_loop_ms, one round

    @triton.jit
    def _noop(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)

    x_gpu = torch.zeros(16, device="cuda")
    x_cpu = torch.zeros(16)
    _noop[(1,)](x_gpu, 16, BLOCK=16)
    torch.cuda.synchronize()

    def per_call_us(fn) -> float:
        t0 = time.perf_counter()
        for _ in range(N):
            fn()
        us = (time.perf_counter() - t0) * 1e6 / N
        torch.cuda.synchronize()
        return us

    kinds = dict(python_ms=python_loop_ms, cpu_aten_us=lambda: per_call_us(lambda: x_cpu.add_(1)),
                 cuda_aten_us=lambda: per_call_us(lambda: x_gpu.add_(1)),
                 triton_us=lambda: per_call_us(lambda: _noop[(1,)](x_gpu, 16, BLOCK=16)))
    samples = {k: [] for k in kinds}
    cpus = []
    for _ in range(ROUNDS):
        for k, fn in kinds.items():
            samples[k].append(fn())
            cpus.append(_cpu())
    return dict({k: statistics.median(v) for k, v in samples.items()}, cpus=sorted(set(cpus)))


def _gpu_local_cpus(topo: str) -> str | None:
    """GPU 0's CPU affinity column of `nvidia-smi topo -m`'s output (e.g. "0-15"), if it has one."""
    lines = re.sub(r"\x1b\[[0-9;]*m", "", topo).splitlines()  # (its header is underlined)
    head = next((ln.split("\t") for ln in lines if "CPU Affinity" in ln), None)
    row = next((ln.split("\t") for ln in lines if ln.startswith("GPU0")), None)
    if head is None or row is None:
        return None
    col = next(i for i, c in enumerate(head) if "CPU Affinity" in c)
    return row[col].strip() if col < len(row) else None


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=pathlib.Path)
    p.add_argument("--procs", type=int, default=8)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child()))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    allowed = sorted(os.sched_getaffinity(0))
    topo = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True).stdout
    local = _gpu_local_cpus(topo)
    pins = [None] * args.procs
    if local:
        pins += [local]
    pins += [str(c) for c in allowed[:: max(1, len(allowed) // 8)]]
    runs = []
    for pin in pins:
        cmd = [sys.executable, __file__, "--out", str(args.out), "--child"]
        if pin is not None:
            cmd = ["taskset", "-c", pin] + cmd
        proc = subprocess.run(cmd, capture_output=True, text=True)
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        res = json.loads(line[0][7:]) if line else dict(error=proc.stderr[-2000:])
        res["pin"] = pin
        runs.append(res)
        print(json.dumps(res), flush=True)
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    from shufflemoe.bench.report import metadata
    (args.out / "probe_host_modes.json").write_text(json.dumps(
        dict(meta=metadata(), allowed=allowed, gpu_local=local, runs=runs, topo=topo, lscpu=lscpu),
        indent=1))


if __name__ == "__main__":
    main()
