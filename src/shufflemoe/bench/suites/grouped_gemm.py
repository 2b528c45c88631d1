"""Grouped GEMM benchmarks: the spec's kernel tables and a batch sweep, against torch's own.

``grouped_gemm``: the eight (G, M per group, N, K) shapes of spec 000's prefill and decode
tables, BF16 and FP8 rowwise, with the published time beside ours. ``grouped_gemm_sweep``: spec
002's batch sweep (Llama-4-Scout TP8, Qwen2-57B-A14B TP4; GEMM13 and GEMM2) with random top-k
routing, batch 1..4096. Peers, timed in the same run: torch._grouped_mm (bf16) and
torch._scaled_grouped_mm (fp8 rowwise, fast accumulation, like the spec). Everything runs as
CUDA-graph replays over enough input sets that weights do not stay in L2.

Bytes = x + w (non-empty groups only) + out, scales excluded (as the spec counts them);
FLOPs = 2 * rows * N * K. The floor is max(bytes / copy bandwidth, FLOPs / dense GEMM rate),
both measured in this run (ctx.ceilings).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...ops import FP8_DTYPE, grouped_gemm
from ...ops.grouped_gemm import configs
from ..timing import rotations, time_fn
from . import SUITES, Context, SuiteResult

# (G, M per group, N, K) -> published time in us (spec 000, H100, FBGEMM warp-specialized kernel)
SPEC_US = {
    "bf16": {(16, 1024, 2048, 5120): 523.85, (16, 1024, 5120, 1024): 294.95,
             (128, 128, 2048, 5120): 975.41, (128, 128, 5120, 1024): 510.78,
             (16, 8, 2048, 5120): 112.54, (16, 8, 5120, 1024): 60.00,
             (128, 1, 2048, 5120): 861.22, (128, 1, 5120, 1024): 433.15},
    "fp8": {(16, 1024, 2048, 5120): 286.89, (16, 1024, 5120, 1024): 182.41,
            (128, 128, 2048, 5120): 517.16, (128, 128, 5120, 1024): 290.25,
            (16, 8, 2048, 5120): 59.81, (16, 8, 5120, 1024): 34.86,
            (128, 1, 2048, 5120): 440.53, (128, 1, 5120, 1024): 225.14},
}
DEVICE = "cuda"  # benchmarks run on the GPU (a CPU dry run of the logic patches this)
DECODE_M = 8  # shapes with at most this many rows per group are memory bound (the decode table)

# name: (experts, top_k, [(gemm, N, K)]) of one tensor-parallel rank
SWEEP_MODELS = {
    "llama4-scout-tp8": (16, 1, [("gemm13", 2048, 5120), ("gemm2", 5120, 1024)]),
    "qwen2-57b-a14b-tp4": (64, 8, [("gemm13", 1280, 3584), ("gemm2", 3584, 640)]),
}
COLUMNS = ["dtype", "shape", "us", "tflops", "gbps", "pct_copy", "floor_us", "torch_us", "speedup",
           "spec_us", "err_vs_torch", "config"]


@dataclass
class Case:
    dtype: str  # "bf16" | "fp8"
    m_sizes: list[int]
    N: int
    K: int

    @property
    def rows(self) -> int:
        return sum(self.m_sizes)

    def nbytes(self) -> int:
        item = 1 if self.dtype == "fp8" else 2
        used = sum(1 for m in self.m_sizes if m)
        return (self.rows * self.K + used * self.N * self.K) * item + self.rows * self.N * 2

    def flops(self) -> int:
        return 2 * self.rows * self.N * self.K


def _inputs(case: Case, seed: int) -> dict:
    """One input set on the GPU: random values (never zeros), weights [G, N, K] K-contiguous."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    G, M, N, K = len(case.m_sizes), case.rows, case.N, case.K
    x = torch.randn(M, K, device=DEVICE, dtype=torch.bfloat16, generator=g)
    w = torch.empty(G, N, K, device=DEVICE, dtype=torch.bfloat16)
    for e in range(G):  # one expert at a time keeps the fp32 temporaries small
        w[e] = torch.randn(N, K, device=DEVICE, generator=g) / K**0.5
    ms = torch.tensor(case.m_sizes, dtype=torch.int32, device=DEVICE)
    d = dict(x=x, w=w, m_sizes=ms, offs=torch.cumsum(ms, 0, dtype=torch.int32),
             out=torch.empty(M, N, device=DEVICE, dtype=torch.bfloat16))
    if case.dtype == "fp8":
        d["x_scale"] = x.float().abs().amax(1).clamp_min(1e-12) / 448
        d["x"] = (x.float() / d["x_scale"][:, None]).to(FP8_DTYPE)
        w_scale = torch.empty(G, N, device=DEVICE)
        wq = torch.empty(G, N, K, device=DEVICE, dtype=FP8_DTYPE)
        for e in range(G):
            w_scale[e] = w[e].float().abs().amax(1).clamp_min(1e-12) / 448
            wq[e] = (w[e].float() / w_scale[e][:, None]).to(FP8_DTYPE)
        d.update(w=wq, w_scale=w_scale)
    return d


def _ours(d: dict) -> torch.Tensor:
    return grouped_gemm(d["x"], d["w"], d["m_sizes"], x_scale=d.get("x_scale"),
                        w_scale=d.get("w_scale"), out=d["out"])


def _torch(d: dict) -> torch.Tensor:
    wt = d["w"].transpose(-2, -1)  # [G, K, N], column-major as both torch ops want
    if "x_scale" in d:
        return torch._scaled_grouped_mm(d["x"], wt, d["x_scale"], d["w_scale"], offs=d["offs"],
                                        out_dtype=torch.bfloat16, use_fast_accum=True)
    return torch._grouped_mm(d["x"], wt, offs=d["offs"])


def _config_name(c: configs.TileConfig) -> str:
    flags = [f"w{c.num_warps}", f"s{c.num_stages}", f"cta{c.ctas_per_sm}", c.tma]
    flags += ["swap"] if c.swap_ab else []
    flags += ["flat"] if c.flatten else []
    return f"{c.block_m}x{c.block_n}x{c.block_k} " + " ".join(flags)


def measure(case: Case, ctx: Context, *, reps: int, spec_us: float | None = None,
            label: str = "") -> dict:
    """Time ours and torch's on ``case``; one result row."""
    n_sets = rotations(case.nbytes())
    sets = [_inputs(case, seed) for seed in range(n_sets)]
    ours = time_fn(lambda i: _ours(sets[i]), n_sets, reps=reps)
    us = ours.median_us
    row = dict(dtype=case.dtype, shape=label, us=us, tflops=case.flops() / us / 1e6,
               gbps=case.nbytes() / us / 1e3)
    c = ctx.ceilings
    rate = (c.fp8_tflops if case.dtype == "fp8" and c.fp8_tflops else c.bf16_tflops) * 1e6
    row.update(pct_copy=100 * row["gbps"] / c.copy_gbps,
               floor_us=max(case.nbytes() / c.copy_gbps / 1e3, case.flops() / rate))
    try:
        peer = time_fn(lambda i: _torch(sets[i]), n_sets, reps=reps)
        ref = _torch(sets[0]).float()
        err = ((_ours(sets[0]).float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
        row.update(torch_us=peer.median_us, speedup=peer.median_us / ours.median_us,
                   err_vs_torch=err)
    except (RuntimeError, TypeError) as e:  # the peer does not take this case: say why
        row.update(torch_us=None, speedup=None, err_vs_torch=None, torch_error=str(e)[:200])
    dtype = FP8_DTYPE if case.dtype == "fp8" else torch.bfloat16
    chosen = configs.select(case.rows, case.N, case.K, len(case.m_sizes), dtype)
    row.update(spec_us=spec_us, config=_config_name(chosen))
    torch.cuda.empty_cache()
    return row


def _target(name: str, measured, ok: bool) -> dict:
    return dict(target=name, measured=measured, met=bool(ok))


@SUITES.register("grouped_gemm")
def spec_shapes(ctx: Context) -> SuiteResult:
    rows, targets = [], []
    for dtype in ("bf16", "fp8"):
        for (G, M, N, K), spec in SPEC_US[dtype].items():
            row = measure(Case(dtype, [M] * G, N, K), ctx, reps=15 if ctx.quick else 40,
                          spec_us=spec, label=f"G={G} M={M} N={N} K={K}")
            rows.append(row)
            sp = row["speedup"]
            peer = "torch._scaled_grouped_mm" if dtype == "fp8" else "torch._grouped_mm"
            name = f"{dtype} {row['shape']}"
            shown = None if sp is None else round(sp, 3)
            if M > DECODE_M:
                targets.append(_target(f"{name}: >= 1.0x {peer}", shown,
                                       sp is not None and sp >= 1.0))
            else:
                targets.append(_target(f"{name}: >= 92% of copy bandwidth",
                                       f"{row['pct_copy']:.1f}%", row["pct_copy"] >= 92))
                targets.append(_target(f"{name}: >= 1.15x {peer}", shown,
                                       sp is not None and sp >= 1.15))
    return SuiteResult(rows, targets, COLUMNS, notes=(
        "Spec shapes (spec 000 tables; spec_us = FBGEMM's warp-specialized kernel on its H100). "
        "pct_copy = GB/s over the copy bandwidth measured in this run."))


def topk_m_sizes(T: int, E: int, k: int, seed: int) -> list[int]:
    """Rows per expert when T tokens each pick k distinct experts uniformly at random."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.rand(T, E, generator=g).topk(k, dim=1).indices
    return torch.bincount(ids.flatten(), minlength=E).tolist()


@SUITES.register("grouped_gemm_sweep")
def batch_sweep(ctx: Context) -> SuiteResult:
    batches = [1, 8, 64, 512, 4096] if ctx.quick else [2**i for i in range(13)]
    rows = []
    for model, (E, k, gemms) in SWEEP_MODELS.items():
        for gemm, N, K in gemms:
            for dtype in ("bf16", "fp8"):
                for T in batches:
                    case = Case(dtype, topk_m_sizes(T, E, k, seed=T), N, K)
                    row = measure(case, ctx, reps=10 if ctx.quick else 30,
                                  label=f"{model} {gemm} T={T}")
                    row.update(model=model, gemm=gemm, batch=T)
                    rows.append(row)
    slow = [r for r in rows if r["speedup"] is not None and r["speedup"] < 1.0]
    worst = min((r["speedup"] for r in rows if r["speedup"] is not None), default=None)
    targets = [_target("faster than torch at every batch (min speedup)",
                       None if worst is None else round(worst, 3), not slow)]
    return SuiteResult(rows, targets, COLUMNS, plot=lambda folder: _plot(rows, folder),
                       notes="Spec 002's sweep: random top-k routing, A = batch * k rows.")


def _plot(rows: list[dict], folder: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(r["model"], r["gemm"], r["dtype"]) for r in rows})
    fig, axes = plt.subplots(2, (len(panels) + 1) // 2, figsize=(4 * ((len(panels) + 1) // 2), 7),
                             squeeze=False)
    for ax, (model, gemm, dtype) in zip(axes.flat, panels):
        sel = [r for r in rows if (r["model"], r["gemm"], r["dtype"]) == (model, gemm, dtype)]
        b = [r["batch"] for r in sel]
        ax.plot(b, [r["us"] for r in sel], "o-", label="shufflemoe")
        ax.plot(b, [r["torch_us"] for r in sel], "s--", label="torch")
        ax.plot(b, [r["floor_us"] for r in sel], ":", color="gray", label="floor")
        ax.set(xscale="log", yscale="log", title=f"{model} {gemm} {dtype}", xlabel="batch",
               ylabel="us")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(f"{folder}/grouped_gemm_sweep.png", dpi=120)
    plt.close(fig)
