"""The fp8 rowwise gather row-major against token-major (one amax a token, its k rows scaled and
stored without a reduction of their own) at D = 5120, T = 2048..16384 (x from 20 MB, inside the
L2, to 160 MB), k = 2, 4, 8: CUDA-graph replays over rotating input sets, 30 samples, every
output checked bit for bit against the torch reference. fp8 orders: "row" (no positions),
"token" / "token8" (the token-major kernel on 4 / 8 warps), "op" (positions given: what
fp8_token_major picks). The bf16 gather row / token beside it. % of the run's copy ceiling for
the bytes moved. Writes $OUT/probe_fp8_tokens.json.

    PYTHONPATH=src python benchmarks/probe_fp8_tokens.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import pathlib

import torch

from shufflemoe.bench.ceilings import measure_ceilings
from shufflemoe.bench.report import metadata
from shufflemoe.bench.timing import rotations, time_fn
from shufflemoe.ops import FP8_DTYPE, gather_scale
from shufflemoe.ops.gather_scale import kernel

D = 5120
CASES = [(2048, 2), (2048, 4), (2048, 8), (4096, 2), (4096, 4), (8192, 2), (8192, 4),
         (16384, 2), (16384, 4)]


def fp8_tokens(s: dict, warps: int):
    """The token-major fp8 kernel, launched directly (the op's rule may pick row-major)."""
    T, A = s["x"].shape[0], s["pos"].shape[0]
    q = torch.empty(A, D, dtype=FP8_DTYPE, device="cuda")
    scale = torch.empty(A, device="cuda")
    kernel._gather_tokens_fp8_kernel[(T,)](
        s["x"], s["pos"], s["w"], None, q, scale, A, D, K=A // T, HAS_W=True, HAS_NV=False,
        INTERPRET=False, BLOCK_D=8192, num_warps=warps)
    return q, scale


def run(s: dict, quant: bool, order: str):
    if order.startswith("token") and quant:
        return fp8_tokens(s, 8 if order == "token8" else 4)
    pos = s["pos"] if order in ("token", "op") else None
    return gather_scale(s["x"], s["ids"], s["w"], quantize=quant, positions=pos, impl="triton")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/probe_fp8_tokens")
    args = ap.parse_args()
    ceil = measure_ceilings()
    rows = []
    for T, k in CASES:
        A = T * k
        g = torch.Generator(device="cuda").manual_seed(A)
        sets = []
        for _ in range(rotations(T * D * 2 + A * D * 2)):
            perm = torch.randperm(A, device="cuda", generator=g)
            sets.append(dict(x=torch.randn(T, D, device="cuda", generator=g).to(torch.bfloat16),
                             ids=(perm // k).int(), pos=perm.argsort().int(),
                             w=torch.rand(A, device="cuda", generator=g)))
        for quant in (True, False):
            refs = [gather_scale(s["x"], s["ids"], s["w"], quantize=quant, impl="torch")
                    for s in sets]
            moved = T * D * 2 + A * 8 + (A * D + A * 4 if quant else A * D * 2)
            for order in ("row", "token", "token8", "op") if quant else ("row", "token"):
                t = time_fn(lambda i: run(sets[i], quant, order), len(sets), reps=30,
                            keep_outputs=True)
                if quant:
                    ok = all(torch.equal(o[0].view(torch.uint8), r[0].view(torch.uint8))
                             and torch.equal(o[1], r[1]) for o, r in zip(t.outputs, refs))
                else:
                    ok = all(torch.equal(o, r) for o, r in zip(t.outputs, refs))
                pct = moved / (t.median_us * 1e-6) / 1e9 / ceil.copy_gbps * 100
                row = dict(op="fp8" if quant else "bf16", order=order, T=T, k=k, D=D,
                           us=round(t.median_us, 2), p20=round(t.p20_us, 2),
                           p80=round(t.p80_us, 2), pct_copy=round(pct, 1), ok=ok)
                rows.append(row)
                print(row, flush=True)
        del sets, refs
        torch.cuda.empty_cache()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "probe_fp8_tokens.json").write_text(json.dumps(dict(
        meta=dict(metadata(), gpu=torch.cuda.get_device_name(), ceilings=ceil.as_dict()),
        rows=rows), indent=1))


if __name__ == "__main__":
    main()
