"""Grouped GEMM benchmarks: the spec's kernel tables and a batch sweep, against torch's own.

``grouped_gemm``: the eight (G, M per group, N, K) shapes of spec 000's prefill and decode
tables, BF16 and FP8 rowwise, with the published time beside ours. ``grouped_gemm_sweep``: spec
002's batch sweep (Llama-4-Scout TP8, Qwen2-57B-A14B TP4; GEMM13 and GEMM2) with random top-k
routing, batch 1..4096. Peers, timed the same way in the same run (graph vs graph):
torch._grouped_mm (bf16) and torch._scaled_grouped_mm (fp8 rowwise, fast accumulation, as ours
and the spec's). Everything runs as CUDA-graph replays over enough input sets (weights included)
that nothing stays in L2; the timed path's output of every set is checked against torch's.

Bytes read = x + the non-empty groups' weights + scales; written = out. FLOPs = 2 * rows * N * K.
The floor is max(reads at the read ceiling + writes at what a copy leaves for them, FLOPs at the
dense GEMM rate of the same precision and accumulation), ceilings measured in this run.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...ops import FP8_DTYPE, grouped_gemm
from ...ops._common import device_sms
from ...ops.grouped_gemm import configs
from ...testing import compare
from ..analysis import ratios, select, span, tally, target
from ..plots import pyplot
from ..timing import rotations, time_fn
from . import Analysis, Context, SuiteResult, suite

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
COLUMNS = ["dtype", "shape", "impl", "mode", "us", "tflops", "gbps", "pct_read", "floor_us", "pct_floor",
           "spec_us", "check", "config"]
KEYS = ["dtype", "shape"]


@dataclass
class Case:
    dtype: str  # "bf16" | "fp8"
    m_sizes: list[int]
    N: int
    K: int

    @property
    def rows(self) -> int:
        return sum(self.m_sizes)

    def read_bytes(self) -> int:
        item = 1 if self.dtype == "fp8" else 2
        used = sum(1 for m in self.m_sizes if m)
        scales = (self.rows + used * self.N) * 4 if self.dtype == "fp8" else 0
        return (self.rows * self.K + used * self.N * self.K) * item + scales + len(self.m_sizes) * 4

    def write_bytes(self) -> int:
        return self.rows * self.N * 2

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
            label: str = "", **extra) -> list[dict]:
    """Time ours and torch's on ``case`` (graph vs graph); two rows. Ours is checked on every
    input set against torch's output from the same set."""
    n_sets = rotations(case.read_bytes() + case.write_bytes())
    sets = [_inputs(case, seed) for seed in range(n_sets)]
    dtype = FP8_DTYPE if case.dtype == "fp8" else torch.bfloat16
    sms = device_sms(torch.device("cuda")) if torch.cuda.is_available() else configs.TUNED_SMS
    chosen = configs.select(case.rows, case.N, case.K, len(case.m_sizes), dtype, sms=sms)
    base = dict(dtype=case.dtype, shape=label, **extra, read_bytes=case.read_bytes(),
                write_bytes=case.write_bytes(), flops=case.flops(), fp8=case.dtype == "fp8", bound="read")
    ours = time_fn(lambda i: _ours(sets[i]), n_sets, reps=reps, keep_outputs=True)
    rows = [dict(base, impl="shufflemoe", side="ours", mode="graph", **ours.fields(), spec_us=spec_us,
                 config=_config_name(chosen))]
    peer = "torch._scaled_grouped_mm" if case.dtype == "fp8" else "torch._grouped_mm"
    try:
        t = time_fn(lambda i: _torch(sets[i]), n_sets, reps=reps)
    except (RuntimeError, TypeError) as e:  # the peer does not take this case: say why
        rows[0]["check"] = f"unchecked: {peer} failed ({str(e)[:120]})"
        return rows
    bad = [i for i, out in enumerate(ours.outputs)
           if not compare(out, _torch(sets[i]).double(), torch.bfloat16).ok]
    rows[0]["check"] = f"MISMATCH vs {peer} (sets {bad[:4]})" if bad else "ok"
    rows.append(dict(base, impl=peer, side="peer", mode="graph", **t.fields()))
    torch.cuda.empty_cache()
    return rows


def _attainable(rows: list[dict], shape: str, dtype: str) -> str:
    """Nothing beats the floor, so the peer's time over the floor bounds any speedup."""
    peer = select(rows, shape=shape, dtype=dtype, side="peer")
    ours = select(rows, shape=shape, dtype=dtype, side="ours")
    if not peer or not ours or not ours[0].get("floor_us"):
        return ""
    return f" (attainable: {peer[0]['us'] / ours[0]['floor_us']:.2f}x at the floor)"


def _rows_per_group(row: dict) -> int:
    return int(row["shape"].split()[1][2:])  # "G=16 M=1024 N=2048 K=5120"


def analyse_spec_shapes(rows: list[dict]) -> Analysis:
    rs = ratios(rows, KEYS)
    targets = []
    for r in select(rows, side="ours"):
        name = f"{r['dtype']} {r['shape']}"
        ok = r.get("check") == "ok"
        ratio = next((x["ratio"] for x in rs if x["shape"] == r["shape"] and x["dtype"] == r["dtype"]), None)
        ratio = ratio if ok else None
        if _rows_per_group(r) > DECODE_M:
            targets.append(target(f"{name} vs torch, graph vs graph", ratio, at_least=1.0, unit="x"))
        else:
            targets.append(target(f"{name} of the bytes floor", r.get("pct_floor") if ok else None,
                                  at_least=92, unit="%"))
            targets.append(target(f"{name} vs torch, graph vs graph{_attainable(rows, r['shape'], r['dtype'])}",
                                  ratio, at_least=1.15, unit="x"))
    decode = {r["shape"] for r in rows if _rows_per_group(r) <= DECODE_M}
    prefill_ratio = lambda d: span((x["ratio"] for x in rs if x["dtype"] == d and x["shape"] not in decode), unit="x")  # noqa: E731
    headlines = [
        dict(what="grouped GEMM, spec prefill shapes, vs torch (graph vs graph), bf16 / fp8",
             result=f"{prefill_ratio('bf16')} / {prefill_ratio('fp8')}"),
        dict(what="grouped GEMM, spec decode shapes: % of the bytes floor (read ceiling); vs torch",
             result=f"{span((r.get('pct_floor') for r in select(rows, side='ours') if r['shape'] in decode), '{:.0f}', unit='%')}; "
                    f"{span((x['ratio'] for x in rs if x['shape'] in decode), unit='x')}"),
        dict(what="grouped GEMM spec-shape targets", result=tally(targets)),
    ]
    return Analysis(rs, targets, headlines)


@suite("grouped_gemm", "the spec's grouped GEMM shapes, bf16 and fp8, vs torch (graph)", est_s=30, part=2)
def spec_shapes(ctx: Context) -> SuiteResult:
    rows = []
    cases = [(d, shape, spec) for d in ("bf16", "fp8") for shape, spec in SPEC_US[d].items()]
    for n, (dtype, (G, M, N, K), spec) in enumerate(cases):
        label = f"G={G} M={M} N={N} K={K}"
        ctx.progress(n, len(cases), f"{dtype} {label}")
        rows += measure(Case(dtype, [M] * G, N, K), ctx, reps=15 if ctx.quick else 40, spec_us=spec,
                        label=label)
    return SuiteResult(rows, analyse_spec_shapes, COLUMNS, notes=(
        "Spec shapes (spec 000 tables; spec_us = FBGEMM's warp-specialized kernel on its H100). "
        "pct_read = bytes read per second over the read ceiling; pct_floor = floor / time."))


def topk_m_sizes(T: int, E: int, k: int, seed: int) -> list[int]:
    """Rows per expert when T tokens each pick k distinct experts uniformly at random."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.rand(T, E, generator=g).topk(k, dim=1).indices
    return torch.bincount(ids.flatten(), minlength=E).tolist()


def analyse_sweep(rows: list[dict]) -> Analysis:
    rs = ratios(rows, KEYS)
    worst = min((r["ratio"] for r in rs), default=None)
    slow = [f"{r['dtype']} {r['shape']} ({r['ratio']:.2f}x)" for r in rs if r["ratio"] < 1.0]
    unchecked = [r for r in select(rows, side="ours") if r.get("check") != "ok"]
    targets = [target("faster than torch at every batch (least ratio, graph vs graph)",
                      None if unchecked else worst, at_least=1.0, unit="x")]
    headlines = [dict(what="grouped GEMM, spec 002 batch sweep (batch 1..4096), vs torch (graph vs graph)",
                      result=f"{span((r['ratio'] for r in rs), unit='x')}; slower in {len(slow)} of {len(rs)}"
                             + (f": {', '.join(slow[:6])}" if slow else ""))]
    return Analysis(rs, targets, headlines)


@suite("grouped_gemm_sweep", "spec 002's batch sweep (Scout TP8, Qwen2-57B TP4), vs torch (graph)",
       est_s=35, part=2)
def batch_sweep(ctx: Context) -> SuiteResult:
    batches = [1, 8, 64, 512, 4096] if ctx.quick else [2**i for i in range(13)]
    cases = [(model, E, k, gemm, N, K, dtype) for model, (E, k, gemms) in SWEEP_MODELS.items()
             for gemm, N, K in gemms for dtype in ("bf16", "fp8")]
    rows = []
    for n, (model, E, k, gemm, N, K, dtype) in enumerate(cases):
        ctx.progress(n, len(cases), f"{model} {gemm} {dtype}")
        for T in batches:
            rows += measure(Case(dtype, topk_m_sizes(T, E, k, seed=T), N, K), ctx,
                            reps=10 if ctx.quick else 20, label=f"{model} {gemm} T={T}",
                            model=model, gemm=gemm, batch=T)
    return SuiteResult(rows, analyse_sweep, COLUMNS, plot=_plot,
                       notes="Spec 002's sweep: random top-k routing, A = batch * k rows.")


def _plot(rows: list[dict], folder: str) -> None:
    plt = pyplot()
    if plt is None:
        return
    panels = sorted({(r["model"], r["gemm"], r["dtype"]) for r in rows})
    cols = (len(panels) + 1) // 2
    fig, axes = plt.subplots(2, cols, figsize=(4 * cols, 7), squeeze=False)
    for ax, (model, gemm, dtype) in zip(axes.flat, panels):
        for side, style, label in (("ours", "o-", "shufflemoe"), ("peer", "s--", "torch")):
            sel = select(rows, model=model, gemm=gemm, dtype=dtype, side=side)
            b = [r["batch"] for r in sel]
            ax.errorbar(b, [r["us"] for r in sel], fmt=style, label=label, capsize=2,
                        yerr=[[r["us"] - r["us_lo"] for r in sel], [r["us_hi"] - r["us"] for r in sel]])
            if side == "ours":
                ax.plot(b, [r["floor_us"] for r in sel], ":", color="gray", label="floor")
        ax.set(xscale="log", yscale="log", title=f"{model} {gemm} {dtype}", xlabel="batch", ylabel="us")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(f"{folder}/grouped_gemm_sweep_batches.png", dpi=120)
    plt.close(fig)
