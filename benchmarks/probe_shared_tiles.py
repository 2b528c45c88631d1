"""The shared expert as more groups of the routed grouped GEMMs (one GPU call, ~1.5 min)

    PYTHONPATH=src python benchmarks/probe_shared_tiles.py --out $OUT

Llama 4 Maverick TP8's prefill reads 68% of dense cuBLAS (bf16, H200, results/h200/layer.md at
048af10; the target is 75%). Its routed GEMMs stream 2.7 + 1.3 GB of weights for 16384 rows
(about 128 rows an expert: bound by the weights' bytes more than by the MMAs) and the shared
expert (the same widths, all 16384 rows: bound by the MMAs) runs after them, each at its own
limit. Put into the same grouped GEMM as groups of their own (w[E] = the shared weights, the
tokens' rows gathered by id, router weight 1), the shared tiles could fill the MMA units while
the routed ones wait on HBM, if the persistent programs run both kinds at once: the shared rows
are cut into chunks placed between the routed groups (weight_ids picks each group's weights).

Times, bf16, CUDA graphs (timing.time_fn, us), for Llama 4 Maverick TP8 and Scout TP8 at T =
16384 (uniform top-1 routing):
- gate_up: the routed GEMM13 as the layer runs it (x gathered by id, scaled by the router
  weights in the epilogue), the shared one as the layer runs it (cuBLAS F.linear), both in one
  graph, and one grouped GEMM over both (shared rows last / in chunks between the routed groups);
- down: the shared one stored by cuBLAS then the routed one added without atomics (as the
  layer), against one grouped GEMM over both adding atomically into zeros (bf16 atomics: the
  order, so the bits, vary; a timing only);
- dense cuBLAS over all 2T rows of one expert's weights (the same FLOPs).
Each combined output is compared with the separate ones (max relative difference). Writes
$OUT/probe_shared_tiles.json.
"""

from __future__ import annotations

import argparse
import json
import pathlib

import torch
import torch.nn.functional as F

from shufflemoe import preset
from shufflemoe.bench.report import metadata
from shufflemoe.bench.timing import time_fn
from shufflemoe.ops import grouped_gemm

T = 16384
CASES = ("llama4-maverick", "llama4-scout")


def layout(counts: list[int], ids: torch.Tensor, T: int, chunks: int, dev: str) -> dict:
    """Groups for one grouped GEMM over the routed rows (expert e: counts[e] rows, their token ids
    in ids) and the shared expert's T rows (weights index E), cut into ``chunks`` pieces spread
    evenly between the routed groups (the last one after every routed group when chunks = 1):
    m_sizes, weight_ids, x_ids (token of each row) and shared (whether a row is the shared
    expert's) in group order."""
    E = len(counts)
    starts = [0]
    for c in counts:
        starts.append(starts[-1] + c)
    bounds = [T * i // chunks for i in range(chunks + 1)]
    after = {(j + 1) * E // chunks - 1: j for j in range(chunks)}  # routed group -> chunk after it
    m, wid, xid, shared = [], [], [], []
    tokens = torch.arange(T, dtype=torch.int32)
    for e in range(E):
        m.append(counts[e]), wid.append(e), xid.append(ids[starts[e]:starts[e + 1]])
        shared.append(torch.zeros(counts[e], dtype=torch.bool))
        if e in after:
            j = after[e]
            n = bounds[j + 1] - bounds[j]
            m.append(n), wid.append(E), xid.append(tokens[bounds[j]:bounds[j + 1]])
            shared.append(torch.ones(n, dtype=torch.bool))
    return dict(m_sizes=torch.tensor(m, dtype=torch.int32, device=dev),
                weight_ids=torch.tensor(wid, dtype=torch.int32, device=dev),
                x_ids=torch.cat(xid).to(device=dev, dtype=torch.int32),
                shared=torch.cat(shared).to(dev))


def _row(rows: list, case: str, gemm: str, variant: str, t, flops: float, **extra) -> None:
    row = dict(case=case, gemm=gemm, variant=variant, us=t.median_us, us_lo=t.p20_us,
               us_hi=t.p80_us, tflops=flops / t.median_us / 1e6, **extra)
    print(json.dumps(row), flush=True)
    rows.append(row)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


def run_case(name: str, rows: list, dev: str = "cuda") -> None:
    cfg = preset(name, tp=8)
    E, D, I, Is = (cfg.num_experts, cfg.hidden_size, cfg.intermediate_size,
                   cfg.shared_intermediate_size)
    assert Is == I, "the shared expert joins the routed weights: the same widths"
    bf = torch.bfloat16
    g = torch.Generator(device="cpu").manual_seed(0)
    gd = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(T, D, generator=gd, device=dev).to(bf)
    w13 = (torch.randn(E + 1, 2 * I, D, generator=gd, device=dev) * 0.02).to(bf)  # [E]: shared
    w2 = (torch.randn(E + 1, D, I, generator=gd, device=dev) * 0.02).to(bf)
    expert = torch.randint(0, E, (T,), generator=g)
    order = torch.argsort(expert, stable=True)
    counts = torch.bincount(expert, minlength=E).tolist()
    ids = order.to(torch.int32)
    w_in = torch.rand(T, generator=g).to(dev)[order.to(dev)]  # router weights, group order
    m_routed = torch.tensor(counts, dtype=torch.int32, device=dev)
    ids_dev = ids.to(dev)
    routed_w13, routed_w2 = w13[:E], w2[:E]  # contiguous views of the same weights
    sw13, sw2 = w13[E], w2[E]
    flops13, flops2 = 2.0 * 2 * T * 2 * I * D, 2.0 * 2 * T * D * I

    # gate_up: separately, as the layer runs it
    h_r = torch.empty(T, 2 * I, device=dev, dtype=bf)
    h_s = torch.empty(T, 2 * I, device=dev, dtype=bf)

    def routed13(i):
        grouped_gemm(x, routed_w13, m_routed, out=h_r, x_ids=ids_dev, row_weights=w_in)

    t = time_fn(routed13, 1, reps=20)
    _row(rows, name, "gate_up", "routed alone (gathered, router weights in the epilogue)", t,
         flops13 / 2)
    t = time_fn(lambda i: torch.mm(x, sw13.t(), out=h_s), 1, reps=20)
    _row(rows, name, "gate_up", "shared alone (cuBLAS)", t, flops13 / 2)
    t = time_fn(lambda i: (routed13(i), torch.mm(x, sw13.t(), out=h_s)), 1, reps=20)
    _row(rows, name, "gate_up", "routed then shared (the layer)", t, flops13)

    for chunks in (1, 8, E):
        lay = layout(counts, ids, T, chunks, dev)
        rw = torch.ones(2 * T, device=dev)
        rw[~lay["shared"]] = w_in
        h = torch.empty(2 * T, 2 * I, device=dev, dtype=bf)
        run = lambda i: grouped_gemm(x, w13, lay["m_sizes"], weight_ids=lay["weight_ids"],
                                     x_ids=lay["x_ids"], row_weights=rw, out=h)
        t = time_fn(run, 1, reps=20)
        h.fill_(float("nan"))
        run(0)
        torch.cuda.synchronize()
        diff = max(_rel(h[~lay["shared"]], h_r), _rel(h[lay["shared"]], h_s))
        _row(rows, name, "gate_up", f"one grouped GEMM, shared rows in {chunks} chunk(s)", t,
             flops13, max_rel_diff=diff, groups=int(lay["m_sizes"].numel()))

    # down: a = SwiGLU(h); separately (shared stored by cuBLAS, routed added without atomics)
    # against one grouped GEMM adding both atomically into zeros
    a_r = (F.silu(h_r[:, :I].float()) * h_r[:, I:].float()).to(bf)
    a_s = (F.silu(h_s[:, :I].float()) * h_s[:, I:].float()).to(bf)
    out = torch.empty(T, D, device=dev, dtype=bf)

    def down_layer(i):
        torch.mm(a_s, sw2.t(), out=out)
        grouped_gemm(a_r, routed_w2, m_routed, scatter_ids=ids_dev, out=out,
                     scatter="add_unique")

    t = time_fn(down_layer, 1, reps=20)
    _row(rows, name, "down", "shared stored, then routed added (the layer)", t, flops2)
    down_layer(0)
    torch.cuda.synchronize()
    want = out.clone()
    for chunks in (1, 8, E):
        lay = layout(counts, ids, T, chunks, dev)
        a = torch.empty(2 * T, I, device=dev, dtype=bf)
        a[~lay["shared"]] = a_r
        a[lay["shared"]] = a_s
        run = lambda i: (out.zero_(), grouped_gemm(a, w2, lay["m_sizes"],
                                                   weight_ids=lay["weight_ids"],
                                                   scatter_ids=lay["x_ids"], out=out,
                                                   scatter="add"))
        t = time_fn(run, 1, reps=20)
        run(0)
        torch.cuda.synchronize()
        _row(rows, name, "down", f"zeros, one grouped GEMM adding atomically, shared rows in "
             f"{chunks} chunk(s)", t, flops2, max_rel_diff=_rel(out, want),
             groups=int(lay["m_sizes"].numel()))

    xx = torch.randn(2 * T, D, generator=gd, device=dev).to(bf)
    t = time_fn(lambda i: torch.mm(xx, sw13.t()), 1, reps=20)
    _row(rows, name, "gate_up", "dense cuBLAS, 2T rows of one expert", t, flops13)
    aa = torch.randn(2 * T, I, generator=gd, device=dev).to(bf)
    t = time_fn(lambda i: torch.mm(aa, sw2.t()), 1, reps=20)
    _row(rows, name, "down", "dense cuBLAS, 2T rows of one expert", t, flops2)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=pathlib.Path)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    for name in CASES:
        run_case(name, rows)
        torch.cuda.empty_cache()
    (args.out / "probe_shared_tiles.json").write_text(json.dumps(
        dict(meta=metadata(), T=T, tp=8, rows=rows), indent=1))


if __name__ == "__main__":
    main()
