"""The router's logits past the GEMV with its weights out of L2, as in the layer: F.linear
(cuBLAS split-K and its reduction), the GEMV kernel, the tensor-core tiles of branch router-mma
(one program a [16 tokens, 64 experts] tile) and those tiles split along D, the last program of
a tile summing the splits' fp32 partials in split order (deterministic), one GPU call.

    PYTHONPATH=src python benchmarks/probe_router_cold.py --out $OUT

Why: probe_router_mma.py (router-mma at cf12746, H100) timed the tiles at 5.1 us against
F.linear's 6.5 for Qwen3-30B-A3B at T = 64, yet the layer with them was 1% slower (228.5 ->
230.5 us) and Llama 4 Maverick TP8's rows 2-6% slower: its 8 rotated weight sets stayed in L2,
where in the layer the router's weights come from HBM, and a program of one tile has too few
bytes in flight for that. Here every sample first writes a 96 MB buffer (evicting L2); its time
alone is measured and subtracted (the cold columns), and the warm columns skip it. CUDA-graph
replays, medians over 8 rotated inputs and weights; every output checked against float64 as
tests/ops/test_router.py. Writes $OUT/probe_router_cold.json. The split kernel lives here only:
it is a measurement of what a split router would buy, not the library's.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from shufflemoe.bench.report import metadata
from shufflemoe.bench.timing import time_fn
from shufflemoe.ops.router import kernel

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from probe_router_tokens import within_a_step  # noqa: E402

SHAPES = {"qwen3": (128, 2048), "llama4 maverick": (128, 5120), "gpt-oss (no bias)": (128, 2880),
          "deepseek-v3": (256, 7168), "llama4 scout": (16, 5120)}
TOKENS = (16, 32, 64, 128, 256)
SPLITS = (1, 2, 4, 8, 16)
N = 8
BLOCK_T, BLOCK_E, BLOCK_D = 16, 64, 128


@triton.jit
def _split_kernel(x_ptr, w_ptr, part_ptr, words_ptr, out_ptr, T, D, E, cols, split,
                  BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr):
    pe, pt, s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    es = pe * BLOCK_E + tl.arange(0, BLOCK_E)
    ts = pt * BLOCK_T + tl.arange(0, BLOCK_T)
    e_ok, t_ok = es < E, ts < T
    acc = tl.zeros([BLOCK_E, BLOCK_T], tl.float32)
    d_end = tl.minimum(s * cols + cols, D)
    for d0 in range(s * cols, d_end, BLOCK_D):
        ds = d0 + tl.arange(0, BLOCK_D)
        d_ok = (ds < d_end)[None, :]
        x = tl.load(x_ptr + ts.to(tl.int64)[:, None] * D + ds[None, :], mask=t_ok[:, None] & d_ok,
                    other=0.0)
        w = tl.load(w_ptr + es.to(tl.int64)[:, None] * D + ds[None, :], mask=e_ok[:, None] & d_ok,
                    other=0.0)
        acc = tl.dot(w, x.T, acc)
    at = tl.arange(0, BLOCK_E)[:, None] * BLOCK_T + tl.arange(0, BLOCK_T)[None, :]
    out_at = ts[None, :].to(tl.int64) * E + es[:, None]
    ok = e_ok[:, None] & t_ok[None, :]
    if split == 1:
        tl.store(out_ptr + out_at, acc.to(out_ptr.dtype.element_ty), mask=ok)
    else:
        tile = pe * tl.num_programs(1) + pt
        tiles = tl.num_programs(0) * tl.num_programs(1)
        tl.store(part_ptr + (s * tiles + tile) * (BLOCK_E * BLOCK_T) + at, acc)
        tl.debug_barrier()
        if tl.atomic_add(words_ptr + tile, 1, sem="acq_rel") == split - 1:
            tl.atomic_xchg(words_ptr + tile, 0)
            total = tl.zeros([BLOCK_E, BLOCK_T], tl.float32)
            j = 0
            while j < split:
                total += tl.load(part_ptr + (j * tiles + tile) * (BLOCK_E * BLOCK_T) + at,
                                 cache_modifier=".cg")
                j += 1
            tl.store(out_ptr + out_at, total.to(out_ptr.dtype.element_ty), mask=ok)


def split_router(x, w, out, split, part, words):
    T, D = x.shape
    E = w.shape[0]
    cols = triton.cdiv(triton.cdiv(D, split), BLOCK_D) * BLOCK_D
    grid = (triton.cdiv(E, BLOCK_E), triton.cdiv(T, BLOCK_T), split)
    _split_kernel[grid](x, w, part, words, out, T, D, E, cols, split, BLOCK_T=BLOCK_T,
                        BLOCK_E=BLOCK_E, BLOCK_D=BLOCK_D, num_warps=4, num_stages=3)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=pathlib.Path)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    bf = torch.bfloat16
    flush = torch.empty(96 << 20, dtype=torch.uint8, device="cuda")
    words = torch.zeros(4096, dtype=torch.int32, device="cuda")
    part = torch.empty(max(SPLITS) * 4 * 16 * BLOCK_E * BLOCK_T, device="cuda")
    flush_us = time_fn(lambda i: flush.fill_(i), N, graph=True, reps=40).median_us
    rows = []
    for name, (E, D) in SHAPES.items():
        ws = [(torch.randn(E, D, device="cuda") / D ** 0.5).to(bf) for _ in range(N)]
        for T in TOKENS:
            xs = [torch.randn(T, D, device="cuda").to(bf) for _ in range(N)]
            outs = [torch.empty(T, E, device="cuda", dtype=bf) for _ in range(N)]
            fns = {"F.linear": lambda i: outs[i].copy_(F.linear(xs[i], ws[i]))}
            if kernel.uses_kernel(T, E):
                fns["gemv"] = lambda i: kernel._router_op(xs[i], ws[i], None, outs[i])
            for s in SPLITS:
                fns[f"split {s}"] = lambda i, s=s: split_router(xs[i], ws[i], outs[i], s, part,
                                                                words)
            row = dict(model=name, E=E, D=D, T=T, flush_us=flush_us)
            for key, fn in fns.items():
                outs[0].fill_(float("nan"))
                fn(0)
                ok = within_a_step(outs[0], xs[0], ws[0], None)
                warm = time_fn(fn, N, graph=True, reps=40).median_us

                def cold(i, fn=fn):
                    flush.fill_(i)
                    fn(i)
                row[key] = dict(warm=warm, cold=time_fn(cold, N, graph=True, reps=40).median_us
                                - flush_us, check=ok)
            print(name, T, " ".join(f"{k}={v['cold']:.2f}/{v['warm']:.2f}{'' if v['check'] else '!'}"
                                    for k, v in row.items() if isinstance(v, dict)), flush=True)
            rows.append(row)
    (args.out / "probe_router_cold.json").write_text(json.dumps(
        dict(meta=dict(metadata(), device=torch.cuda.get_device_name()), rows=rows), indent=1,
        default=str))


if __name__ == "__main__":
    main()
