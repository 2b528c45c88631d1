"""Can the shared expert's GEMMs hide beside the routed experts' on their own SMs? (one GPU call)

    PYTHONPATH=src python benchmarks/probe_prefill_partition.py --out $OUT

probe_timeline.py --prefill (9502b68) found Llama 4 Maverick TP8 bf16 at T = 16384 spending 1072
us in the routed gate_up grouped GEMM (2.7 GB of weights at ~2.5 TB/s, its tensor cores about
half idle) and then 428 us in the shared expert's (cuBLAS, compute-bound); a side stream did not
overlap them (probe_prefill_overlap.py): both grids fill every SM. Here the two run at once on
disjoint SMs: the routed grouped GEMM with a persistent grid of r programs (one an SM) on one
stream, the shared expert's GEMM on another, either our grouped GEMM as one group with 132 - r
programs or cuBLAS (which takes the SMs left). Gate_up and down shapes apart (down's shared
product into its own buffer here; the layer adds it into out), CUDA-graph replays, us. Outputs
of the partitioned runs are compared bit for bit with the sequential ones.
Writes $OUT/probe_prefill_partition.json.
"""

from __future__ import annotations

import argparse
import json
import pathlib

import torch

from shufflemoe import preset
from shufflemoe.bench.report import metadata
from shufflemoe.bench.timing import time_fn
from shufflemoe.ops import grouped_gemm
from shufflemoe.ops.grouped_gemm import kernel as gg_kernel

T = 16384
SPLITS = (66, 80, 92, 104, 116)  # programs of the routed grouped GEMM
PROGRAMS = {"cap": None}
_device_sms = gg_kernel.device_sms


def capped(device: torch.device) -> int:
    """The grid's SMs (the tile rules see the cap too: Maverick's 128-row tiles are the same)."""
    return PROGRAMS["cap"] or _device_sms(device)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=pathlib.Path)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    gg_kernel.device_sms = capped
    sms = _device_sms(torch.device("cuda"))
    cfg = preset("llama4-maverick", tp=8)
    E, D, I = cfg.num_experts, cfg.hidden_size, cfg.intermediate_size
    torch.manual_seed(0)
    dev, bf = "cuda", torch.bfloat16
    experts = torch.randint(0, E, (T,), device=dev)
    m_sizes = torch.bincount(experts, minlength=E).to(torch.int32)
    one = torch.tensor([T], dtype=torch.int32, device=dev)
    shapes = {
        "gate_up": dict(xr=torch.randn(T, D, device=dev, dtype=bf), wr=torch.randn(E, 2 * I, D, device=dev, dtype=bf) * 0.02,
                        xs=torch.randn(T, D, device=dev, dtype=bf), ws=torch.randn(2 * I, D, device=dev, dtype=bf) * 0.02),
        "down": dict(xr=torch.randn(T, I, device=dev, dtype=bf), wr=torch.randn(E, D, I, device=dev, dtype=bf) * 0.02,
                     xs=torch.randn(T, I, device=dev, dtype=bf), ws=torch.randn(D, I, device=dev, dtype=bf) * 0.02),
    }
    side = torch.cuda.Stream()
    rows = []
    for gemm, s in shapes.items():
        N = s["wr"].shape[1]
        out_r = torch.empty(T, N, device=dev, dtype=bf)
        out_s = torch.empty(T, N, device=dev, dtype=bf)

        def routed(cap):
            PROGRAMS["cap"] = cap
            grouped_gemm(s["xr"], s["wr"], m_sizes, out=out_r)
            PROGRAMS["cap"] = None

        def shared_ours(cap):
            PROGRAMS["cap"] = cap
            grouped_gemm(s["xs"], s["ws"].view(1, N, -1), one, out=out_s)
            PROGRAMS["cap"] = None

        def shared_cublas():
            torch.mm(s["xs"], s["ws"].t(), out=out_s)

        def together(first, second):
            main = torch.cuda.current_stream()
            side.wait_stream(main)
            first()
            with torch.cuda.stream(side):
                second()
            main.wait_stream(side)

        variants = {
            "routed alone": lambda: routed(None),
            "shared ours alone": lambda: shared_ours(None),
            "shared cuBLAS alone": shared_cublas,
            "sequential, shared cuBLAS": lambda: (routed(None), shared_cublas()),
            "sequential, shared ours": lambda: (routed(None), shared_ours(None)),
        }
        for r in SPLITS:
            variants[f"routed alone on {r}"] = (lambda r=r: routed(r))
            variants[f"shared ours alone on {sms - r}"] = (lambda r=r: shared_ours(sms - r))
            variants[f"together: routed on {r}, shared ours on {sms - r}"] = (
                lambda r=r: together(lambda: routed(r), lambda: shared_ours(sms - r)))
            variants[f"together: routed on {r}, shared cuBLAS beside"] = (
                lambda r=r: together(lambda: routed(r), shared_cublas))
        want = {}
        for label, fn in variants.items():
            t = time_fn(lambda i: fn(), 1, graph=True, reps=15, warmup=1)
            torch.cuda.synchronize()
            same = None
            if "together" in label or "sequential" in label:
                fn()
                torch.cuda.synchronize()
                key = "cuBLAS" if "cuBLAS" in label else "ours"
                if key not in want:
                    want[key] = (out_r.clone(), out_s.clone())
                same = bool(torch.equal(out_r, want[key][0]) and torch.equal(out_s, want[key][1]))
            row = dict(gemm=gemm, variant=label, us=t.median_us, us_lo=t.p20_us, us_hi=t.p80_us, bitwise_same=same)
            print(json.dumps(row), flush=True)
            rows.append(row)
    (args.out / "probe_prefill_partition.json").write_text(json.dumps(
        dict(meta=dict(metadata(), device=torch.cuda.get_device_name()), T=T, preset="llama4-maverick-tp8 bf16",
             rows=rows), indent=1, default=str))


if __name__ == "__main__":
    main()
