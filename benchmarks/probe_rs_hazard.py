"""The shipped register-operand tiles under repetition (one GPU call, no timing).

The weight-only formats (fp8_w8a16, mxfp4) convert the weight tile in registers and, on swapped
tiles, feed it to the wgmma as its register (A) operand. Triton 3.6 splits such a dot into k16
wgmmas and lets the previous K step's last ones run while the next step's converted tile is
written: in the sm_90 SASS of these tiles the loop's head rewrites registers that in-flight
HGMMAs read (benchmarks/notes/layer.md, "The swapped 256-token tile"). The 256-token swapped tile
gave garbage there (probe_swap256); this asks whether the tiles select() ships ever do, over
many K (the loop's length; the SASS is the same for every K) and the three row regimes that
pick different register-operand tiles (about 8 rows a group: the decode tiles; 32: the mid
tiles; 128: FORMAT_PREFILL_TILES), each GEMM run --reps times against float64. Writes
$OUT/probe_rs_hazard.json.

    PYTHONPATH=src python benchmarks/probe_rs_hazard.py --out $OUT [--reps 20] [--budget 300]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import torch

import probe_swap256 as swap
from shufflemoe.bench.report import metadata
from shufflemoe.ops import grouped_gemm
from shufflemoe.ops.grouped_gemm import configs
from shufflemoe.testing import poisoned

KS = (256, 512, 768, 1024, 1536, 2048, 2880, 4096)
ROWS = (8, 32, 128)  # average rows a group, 128 groups
N = 2048


def run(fmt_name: str, K: int, rows: int, reps: int) -> dict:
    swap.FORMS["probe"] = dict(N=N, K=K, glu=False)
    gen = torch.Generator().manual_seed(K + rows)
    sizes = torch.bincount(torch.randint(0, 128, (128 * rows,), generator=gen),
                           minlength=128).tolist()
    c = swap.case(fmt_name, "probe", sizes, K + rows)
    ms = torch.tensor(sizes, dtype=torch.int32, device=swap.DEV)
    tile = configs.select(c["M"], N, K, 128, torch.bfloat16, fmt_name)
    wrong = 0
    out = poisoned(c["M"], N, dtype=torch.bfloat16, device=swap.DEV)
    for _ in range(reps):
        out.fill_(float("nan"))
        y = grouped_gemm(c["x"], c["w"], ms, out=out, **c["kw"])
        wrong += not swap.within(y, c["ref"], fmt_name)
    row = dict(format=fmt_name, K=K, rows=rows, tile=repr(tile), reps=reps, wrong=wrong)
    print(json.dumps(row), flush=True)
    return row


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=pathlib.Path)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--budget", type=float, default=300.0)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    deadline = time.time() + args.budget
    rows = []
    for rows_a_group in ROWS:
        for K in KS:
            for fmt_name in ("fp8_w8a16", "mxfp4"):
                if time.time() > deadline:
                    rows.append(dict(format=fmt_name, K=K, rows=rows_a_group,
                                     skipped="time budget"))
                    continue
                rows.append(run(fmt_name, K, rows_a_group, args.reps))
    (args.out / "probe_rs_hazard.json").write_text(json.dumps(dict(meta=metadata(), rows=rows),
                                                              indent=1))
