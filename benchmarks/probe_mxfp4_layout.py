"""What a load-time permutation of mxfp4's packed bytes would buy the MMA tiles, before anyone
builds it: one swapped tile kernel (weights the wgmma's register operand, 16 tokens, TMA loads,
mxfp4_values' table decode) over each preset's stacked expert weights, with the bytes stored as
the checkpoint has them and stored permuted within each 16-byte run (physical 4 t + q holds
logical 4 q + t, so a thread of the register operand finds its four bytes together: one shared
load instead of four `LDS.U8`; the kernel un-permutes by a reshape that only renames registers).
Both are checked against float32, then timed in CUDA graphs over rotated weight copies; the
ratio is what the permutation gives the K loop alone (no routing, no epilogue beyond a store).
--warps: each layout also with these (warps, stages) pairs (more warps issue the decode faster?).

    PYTHONPATH=src python benchmarks/probe_mxfp4_layout.py --out $OUT [--warps 8,3 4,2]
"""

from __future__ import annotations

import argparse
import json
import pathlib

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from shufflemoe.bench.report import metadata
from shufflemoe.bench.timing import rotations, time_fn
from shufflemoe.ops.quantize.kernel import mxfp4_values
from shufflemoe.ops.quantize.reference import dequantize_mxfp4

BLOCK_N, BLOCK_M, BLOCK_K = 128, 16, 256
# (name, rows N of the stacked experts' weights, K): the decode GEMMs of the layer suite's presets
SHAPES = (("scout-tp8 gate_up", 16 * 2048, 5120), ("scout-tp8 down", 16 * 5120, 1024),
          ("qwen3 gate_up", 128 * 1536, 2048), ("qwen3 down", 128 * 2048, 768),
          ("mixtral-tp2 gate_up", 8 * 7168 * 2, 4096))


@triton.jit
def _tile_kernel(x_desc, w_desc, s_ptr, out_ptr, K, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_K: tl.constexpr, PERMUTED: tl.constexpr):
    n0 = tl.program_id(0) * BLOCK_N
    rows = n0 + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        packed = w_desc.load([n0, k0 // 2])
        if PERMUTED:  # physical 4t + q -> logical 4q + t: a reshape and permute of registers
            packed = packed.reshape(BLOCK_N, BLOCK_K // 32, 4, 4).permute(0, 1, 3, 2)
            packed = packed.reshape(BLOCK_N, BLOCK_K // 2)
        gs = k0 // 32 + tl.arange(0, BLOCK_K // 32)
        s = tl.load(s_ptr + rows.to(tl.int64)[:, None] * (K // 32) + gs[None, :])
        x = x_desc.load([0, k0])
        acc = tl.dot(mxfp4_values(packed, s, BLOCK_N, BLOCK_K, False, False), x.T, acc)
    cols = tl.arange(0, BLOCK_M)
    tl.store(out_ptr + rows.to(tl.int64)[:, None] * BLOCK_M + cols[None, :], acc)


def permute_runs(packed: torch.Tensor) -> torch.Tensor:
    """[N, K / 2] bytes -> the same with each 16-byte run stored as physical 4 t + q <- 4 q + t."""
    N, B = packed.shape
    return packed.reshape(N, B // 16, 4, 4).transpose(-1, -2).reshape(N, B).contiguous()


def run_case(name: str, N: int, K: int, tiles: tuple = ((4, 3),)) -> dict:
    torch.manual_seed(0)
    dev = "cuda"
    packed = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, device=dev)
    scales = torch.randint(118, 128, (N, K // 32), dtype=torch.uint8, device=dev)
    x = torch.randn(BLOCK_M, K, device=dev, dtype=torch.bfloat16)
    copies = rotations(packed.numel() + scales.numel())
    row = dict(shape=name, N=N, K=K, copies=copies, bytes=packed.numel() + scales.numel())
    want = None
    for label, permuted in (("as stored", False), ("permuted", True)):
        stored = permute_runs(packed) if permuted else packed
        ws = [stored] + [stored.clone() for _ in range(copies - 1)]
        ss = [scales] + [scales.clone() for _ in range(copies - 1)]
        descs = [TensorDescriptor(w, list(w.shape), [w.shape[1], 1], [BLOCK_N, BLOCK_K // 2])
                 for w in ws]
        x_desc = TensorDescriptor(x, list(x.shape), [K, 1], [BLOCK_M, BLOCK_K])
        outs = [torch.full((N, BLOCK_M), float("nan"), device=dev) for _ in range(copies)]

        for warps, stages in tiles:
            def call(i: int) -> None:
                _tile_kernel[(N // BLOCK_N,)](x_desc, descs[i], ss[i], outs[i], K,
                                              BLOCK_N=BLOCK_N, BLOCK_M=BLOCK_M, BLOCK_K=BLOCK_K,
                                              PERMUTED=permuted, num_warps=warps,
                                              num_stages=stages)

            outs[0].fill_(float("nan"))
            call(0)
            torch.cuda.synchronize()
            if want is None:  # float32 of the same bf16 values, on 2048 rows
                w = dequantize_mxfp4(packed[:2048], scales[:2048])
                want = w @ x.float().T
            err = ((outs[0][:2048] - want).norm() / want.norm()).item()
            t = time_fn(call, copies, graph=True, reps=30)
            key = label if (warps, stages) == tiles[0] else f"{label} w{warps} s{stages}"
            row[key] = dict(us=t.median_us, p20=t.p20_us, p80=t.p80_us, rel_l2=err,
                            tbps=row["bytes"] / t.median_us / 1e6)
    row["ratio"] = row["as stored"]["us"] / row["permuted"]["us"]
    return row


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=pathlib.Path)
    p.add_argument("--warps", nargs="*", default=[], help="more (warps,stages) pairs, e.g. 8,3")
    args = p.parse_args()
    tiles = ((4, 3),) + tuple(tuple(int(v) for v in w.split(",")) for w in args.warps)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, N, K in SHAPES:
        row = run_case(name, N, K, tiles)
        rows.append(row)
        print(json.dumps(row), flush=True)
    tag = "_warps" if args.warps else ""
    (args.out / f"probe_mxfp4_layout{tag}.json").write_text(
        json.dumps(dict(meta=metadata(), rows=rows), indent=1))


if __name__ == "__main__":
    main()
