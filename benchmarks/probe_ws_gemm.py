"""Does Triton 3.6's automatic warp specialization help the prefill grouped GEMM? (one GPU call)

    PYTHONPATH=src python benchmarks/probe_ws_gemm.py --out $OUT

Triton 3.6 splits a K loop marked `tl.range(..., warp_specialize=True)` into a TMA producer and
two consumer warp groups on Hopper (num_warps = 4 gives 12 warps), but its pass fails on the
shipped grouped GEMM (a persistent loop with the group lookup and the tail-row branch around the
K loop: "Other parent ops are not supported"). This probe's kernel is the plainest grouped GEMM
that the pass accepts: one program a (row tile, column tile), the row tiles listed on the host
(each group's rows cut into BLOCK_M tiles, a group's tiles next to each other), x and w through
device TMA descriptors, a masked store. The same kernel without the flag (8 warps, one consumer
layout) separates the specialization from the structure; the shipped grouped_gemm and
torch._grouped_mm are timed beside them. bf16, Llama 4 Maverick TP8 and Scout TP8 at T = 16384
(gate_up N = 2I, K = D; down N = D, K = I), routed (a uniform top-1 draw) and balanced groups.
CUDA graphs (timing.time_fn), us and the weights' GB/s; each output's max relative difference
from the shipped one and its rows holding NaN (at f33562a every specialized output held NaN; the
4-warp kernel without the flag is the control for that). Under TRITON_INTERPRET=1 (--check) it
runs small shapes against a float64 reference instead. Writes $OUT/probe_ws_gemm.json.
"""

from __future__ import annotations

import argparse
import json
import pathlib

import torch
import triton
import triton.language as tl

from shufflemoe import preset
from shufflemoe.bench.report import metadata
from shufflemoe.bench.timing import time_fn
from shufflemoe.ops import grouped_gemm

from probe_prefill_groups import T, _max_rel_diff, _sizes


@triton.jit
def _ws_kernel(x_ptr, w_ptr, out_ptr, tile_group_ptr, tile_row0_ptr, group_end_ptr, M, N, K, E,
               n_tiles, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               WS: tl.constexpr, INTERPRET: tl.constexpr):
    pid = tl.program_id(0)
    mt, nt = pid // n_tiles, pid % n_tiles  # a row tile's column tiles run side by side
    g = tl.load(tile_group_ptr + mt)
    row0 = tl.load(tile_row0_ptr + mt)
    end = tl.load(group_end_ptr + g)
    x_desc = tl.make_tensor_descriptor(x_ptr, [M, K], [K, 1], [BLOCK_M, BLOCK_K])
    w_desc = tl.make_tensor_descriptor(w_ptr, [E * N, K], [K, 1], [BLOCK_N, BLOCK_K])
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if INTERPRET:  # the interpreter's ranges take no runtime bounds
        k = 0
        while k < K:
            a = x_desc.load([row0, k])
            b = w_desc.load([g * N + nt * BLOCK_N, k])
            acc = tl.dot(a, b.T, acc)
            k += BLOCK_K
    else:
        for k in tl.range(0, K, BLOCK_K, warp_specialize=WS):
            a = x_desc.load([row0, k])
            b = w_desc.load([g * N + nt * BLOCK_N, k])
            acc = tl.dot(a, b.T, acc)
    rows = row0 + tl.arange(0, BLOCK_M)
    cols = nt * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < end)[:, None] & (cols < N)[None, :]
    tl.store(out_ptr + rows[:, None].to(tl.int64) * N + cols[None, :],
             acc.to(out_ptr.dtype.element_ty),
             mask=mask)


def _tiles(m: torch.Tensor, block_m: int):
    """The row tiles of groups of m[g] rows (host lists, on m's device): each tile's group and
    first row, and each group's end row."""
    sizes = m.tolist()
    groups, row0s, ends, start = [], [], [], 0
    for g, n in enumerate(sizes):
        for r in range(start, start + n, block_m):
            groups.append(g)
            row0s.append(r)
        start += n
        ends.append(start)
    as_t = lambda v: torch.tensor(v, dtype=torch.int32, device=m.device)  # noqa: E731
    return as_t(groups), as_t(row0s), as_t(ends)


def ws_gemm(x, w, m, out, block_m=128, block_n=256, block_k=64, ws=True, num_warps=None,
            num_stages=3, tiles=None):
    """out[rows of group g] = x[those rows] @ w[g].T, bf16, groups of m[g] rows in order."""
    E, N, K = w.shape
    tg, tr, te = tiles if tiles is not None else _tiles(m, block_m)
    n_tiles = triton.cdiv(N, block_n)
    _ws_kernel[(tg.numel() * n_tiles,)](
        x, w, out, tg, tr, te, x.shape[0], N, K, E, n_tiles, BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_K=block_k, WS=ws, INTERPRET=x.device.type == "cpu",
        num_warps=num_warps or (4 if ws else 8), num_stages=num_stages)
    return out


def _check() -> None:
    """Interpreter: small uneven groups (one empty) against a float64 reference (float32
    operands: the interpreter's numpy has no bfloat16)."""
    torch.manual_seed(0)
    E, N, K, BM = 4, 32, 48, 16
    m = torch.tensor([5, 0, 17, 16], dtype=torch.int32)
    x = torch.randn(int(m.sum()), K)
    w = torch.randn(E, N, K) * 0.1
    out = torch.full((x.shape[0], N), float("nan"))
    ws_gemm(x, w, m, out, block_m=BM, block_n=16, block_k=16, ws=False, num_warps=4)
    ref, start = torch.empty(x.shape[0], N, dtype=torch.float64), 0
    for g, n in enumerate(m.tolist()):
        ref[start:start + n] = x[start:start + n].double() @ w[g].double().T
        start += n
    err = ((out.double() - ref).abs().max() / ref.abs().max()).item()
    assert err < 1e-5, err
    print(f"ok: max relative error {err:.2e}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=pathlib.Path)
    p.add_argument("--check", action="store_true", help="interpreter check on small shapes")
    args = p.parse_args()
    if args.check:
        return _check()
    args.out.mkdir(parents=True, exist_ok=True)
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                 device="cuda"))
    rows = []
    for name in ("llama4-maverick", "llama4-scout"):
        cfg = preset(name, tp=8)
        E, D, I = cfg.num_experts, cfg.hidden_size, cfg.intermediate_size
        for gemm, (N, K) in {"gate_up": (2 * I, D), "down": (D, I)}.items():
            x = torch.randn(T, K, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16) * 0.02
            out = torch.empty(T, N, device="cuda", dtype=torch.bfloat16)
            w_bytes = w.numel() * w.element_size()
            for routing in ("routed", "balanced"):
                m = _sizes(E, routing, "cuda")
                tiles = _tiles(m, 128)
                offs = torch.cumsum(m, 0).to(torch.int32)
                variants = {
                    "shipped grouped_gemm": lambda: grouped_gemm(x, w, m, out=out),
                    "plain tiles, warp-specialized (4 warps a group, 3 stages)":
                        lambda: ws_gemm(x, w, m, out, tiles=tiles),
                    "plain tiles, warp-specialized (4 stages)":
                        lambda: ws_gemm(x, w, m, out, num_stages=4, tiles=tiles),
                    "plain tiles, not specialized (8 warps, 4 stages)":
                        lambda: ws_gemm(x, w, m, out, ws=False, num_stages=4, tiles=tiles),
                    "plain tiles, not specialized (4 warps, 3 stages: the flag's control)":
                        lambda: ws_gemm(x, w, m, out, ws=False, num_warps=4, tiles=tiles),
                    "torch._grouped_mm": lambda: torch._grouped_mm(x, w.transpose(1, 2),
                                                                   offs=offs)}
                want = None
                for label, fn in variants.items():
                    try:
                        t = time_fn(lambda i: fn(), 1, reps=20)
                        out.fill_(float("nan"))
                        got = fn()
                        torch.cuda.synchronize()
                    except Exception as e:  # shared memory or the pass: say so, go on
                        print(json.dumps(dict(preset=name, gemm=gemm, routing=routing,
                                              variant=label, error=str(e)[-300:])), flush=True)
                        continue
                    if want is None:
                        want = got.float().clone()
                    row = dict(preset=name, gemm=gemm, routing=routing, variant=label,
                               us=t.median_us, us_lo=t.p20_us, us_hi=t.p80_us,
                               weight_gbps=w_bytes / t.median_us / 1e3,
                               max_rel_diff=_max_rel_diff(got, want),
                               nan_rows=int(got.isnan().any(1).sum()))
                    print(json.dumps(row), flush=True)
                    rows.append(row)
            del x, w, out
            torch.cuda.empty_cache()
    (args.out / "probe_ws_gemm.json").write_text(json.dumps(
        dict(meta=metadata(), T=T, rows=rows), indent=1))


if __name__ == "__main__":
    main()
