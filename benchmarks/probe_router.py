"""Scratch probe: the router GEMM at decode sizes (H100, CUDA graphs, rotated inputs): F.linear
(cuBLAS GEMM), torch.mv (cuBLAS GEMV, T = 1), and a one-launch Triton GEMV (a program per expert
row). PYTHONPATH=src python benchmarks/probe_router.py"""
import json, os
import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from shufflemoe.bench.timing import time_fn


@triton.jit
def _router(x_ptr, w_ptr, out_ptr, T, D, E, BLOCK_D: tl.constexpr, BLOCK_T: tl.constexpr):
    e = tl.program_id(0)
    ts = tl.arange(0, BLOCK_T)
    acc = tl.zeros([BLOCK_T, BLOCK_D], tl.float32)
    for d0 in range(0, D, BLOCK_D):
        ds = d0 + tl.arange(0, BLOCK_D)
        w = tl.load(w_ptr + e * D + ds, mask=ds < D, other=0.0).to(tl.float32)
        x = tl.load(x_ptr + ts[:, None] * D + ds[None, :], mask=(ts < T)[:, None] & (ds < D)[None, :], other=0.0)
        acc += x.to(tl.float32) * w[None, :]
    tl.store(out_ptr + ts * E + e, tl.sum(acc, 1).to(out_ptr.dtype.element_ty), mask=ts < T)


def tri(x, w, out, bd, warps):
    T, D = x.shape
    _router[(w.shape[0],)](x, w, out, T, D, w.shape[0], BLOCK_D=bd, BLOCK_T=triton.next_power_of_2(T), num_warps=warps)
    return out


SHAPES = {"scout": (16, 5120), "qwen3": (128, 2048), "mixtral": (8, 4096), "gpt-oss": (128, 2880), "deepseek": (256, 7168)}
rows = []
for name, (E, D) in SHAPES.items():
    ws = [torch.randn(E, D, device="cuda", dtype=torch.bfloat16) / D**0.5 for _ in range(8)]
    for T in (1, 2, 4, 8):
        xs = [torch.randn(T, D, device="cuda", dtype=torch.bfloat16) for _ in range(8)]
        outs = [torch.empty(T, E, device="cuda", dtype=torch.bfloat16) for _ in range(8)]
        r = dict(model=name, T=T)
        r["linear"] = time_fn(lambda i: F.linear(xs[i], ws[i]), 8, graph=True, reps=50).median_us
        if T == 1:
            r["mv"] = time_fn(lambda i: torch.mv(ws[i], xs[i][0]), 8, graph=True, reps=50).median_us
        r["mm_t"] = time_fn(lambda i: torch.mm(ws[i], xs[i].t()), 8, graph=True, reps=50).median_us
        for bd in (1024, 2048, 4096, 8192):
            for warps in (2, 4, 8):
                if bd * triton.next_power_of_2(T) > 16384:
                    continue
                ref = F.linear(xs[0], ws[0]).float()
                got = tri(xs[0], ws[0], outs[0], bd, warps).float()
                assert (got - ref).abs().max() < 0.05 * ref.abs().max(), (name, T, bd)
                r[f"tri bd{bd} w{warps}"] = time_fn(lambda i: tri(xs[i], ws[i], outs[i], bd, warps), 8, graph=True, reps=50).median_us
        best = min((v, k) for k, v in r.items() if k.startswith("tri"))
        print(name, T, {k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items() if not k.startswith("tri")}, "best triton", best, flush=True)
        rows.append(r)
json.dump(dict(gpu=torch.cuda.get_device_name(), rows=rows), open(os.path.join(os.environ.get("OUT", "/tmp"), "probe_router.json"), "w"), indent=1)
