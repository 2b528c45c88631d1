"""The router's logits past 8 tokens: ops/router's kernel (token blocks on a second grid axis)
against F.linear (cuBLAS, a split-K GEMM and its reduction at these sizes), one GPU call.

    PYTHONPATH=src python benchmarks/probe_router_tokens.py --out $OUT

probe_timeline.py --tokens 64,128 (3c9b2f2, H100) showed F.linear taking 10-13 us and a 2 us
reduction for Llama 4 Scout TP8's router at T = 64 and 128 ([T, 5120] x [5120, 16]), ahead of the
routing and every expert kernel. Here, per router shape (E, D) and T: F.linear and the kernel at
a few token blocks and tiles, CUDA-graph replays over 8 rotated inputs and weights, median us;
each kernel output checked against float64 (within one step of the rounded value, >= 98% equal
to it, as tests/ops/test_router.py). Writes $OUT/probe_router_tokens.json.
(results/probe_router_tokens_9f8fa1e.json: the kernel then read a TOKEN_BLOCK_TILE for blocks past
8 tokens, which the variants below now put in its _TILES; the same launches.)
"""

from __future__ import annotations

import argparse
import json
import pathlib

import torch
import torch.nn.functional as F

from shufflemoe.bench.report import metadata
from shufflemoe.bench.timing import time_fn
from shufflemoe.ops.router import kernel

SHAPES = {"scout/maverick E": [(16, 5120), (128, 5120)], "qwen3": [(128, 2048)], "mixtral": [(8, 4096)],
          "gpt-oss (bias)": [(128, 2880)], "deepseek": [(256, 7168)]}
TOKENS = (8, 16, 32, 64, 128, 256, 512)
VARIANTS = {"block 16, 1024 x 8 warps": (16, (1024, 8)), "block 16, 512 x 4 warps": (16, (512, 4)),
            "block 32, 512 x 8 warps": (32, (512, 8)), "block 8, 2048 x 8 warps": (8, (2048, 8))}
N = 8


def within_a_step(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor, b) -> bool:
    ref = x.double() @ w.double().t() + (0.0 if b is None else b.double())
    want = ref.to(got.dtype)
    step = (want.double().abs() * torch.finfo(got.dtype).eps).clamp_min(2.0 ** -126)
    sum_err = 2 * x.shape[1] ** 0.5 * torch.finfo(torch.float32).eps * (x.double().abs() @ w.double().abs().t())
    off = (got.double() - want.double()).abs()
    return bool((off <= step * 1.001 + sum_err).all()) and float((got == want).double().mean()) >= 0.98


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=pathlib.Path)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    bf = torch.bfloat16
    for name, shapes in SHAPES.items():
        for E, D in shapes:
            ws = [(torch.randn(E, D, device="cuda") / D ** 0.5).to(bf) for _ in range(N)]
            bs = [torch.randn(E, device="cuda").to(bf) if "bias" in name else None for _ in range(N)]
            for T in TOKENS:
                xs = [torch.randn(T, D, device="cuda").to(bf) for _ in range(N)]
                outs = [torch.empty(T, E, device="cuda", dtype=bf) for _ in range(N)]
                row = dict(model=name, E=E, D=D, T=T)
                row["F.linear"] = time_fn(lambda i: F.linear(xs[i], ws[i], bs[i]), N, graph=True, reps=30).median_us
                for label, (block, tile) in VARIANTS.items():
                    kernel.TOKEN_BLOCK = block
                    kernel._TILES[block] = tile if block > 8 else kernel._TILES[block]
                    outs[0].fill_(float("nan"))
                    kernel._router_op(xs[0], ws[0], bs[0], outs[0])
                    ok = within_a_step(outs[0], xs[0], ws[0], bs[0])
                    us = time_fn(lambda i: kernel._router_op(xs[i], ws[i], bs[i], outs[i]), N, graph=True,
                                 reps=30).median_us
                    row[label] = us if ok else f"wrong ({us:.1f} us)"
                print(json.dumps(row), flush=True)
                rows.append(row)
    (args.out / "probe_router_tokens.json").write_text(json.dumps(
        dict(meta=dict(metadata(), device=torch.cuda.get_device_name()), rows=rows), indent=1, default=str))


if __name__ == "__main__":
    main()
