"""The MoE layer on the GPU (issue 5): model presets in BF16 and FP8, against the bandwidth floor,
a dense cuBLAS GEMM of the same FLOPs, and the peers a user would otherwise run; plus the
strategy shoot-out (padding / slicing / concatenation / shuffling, blockwise, decode strategies).

Timing: time_fn (CUDA-graph replays where the path has no host sync, eager otherwise), rotating
through several input batches so every call routes differently (different experts loaded).
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass

import torch

from ... import EXPERTS, MoE, MoEConfig, naive_moe, preset
from ...planner import must_read_bytes
from ...testing import compare, tolerance_key
from ..peers import _dequantized, hf_block, hf_block_forward, per_expert_loop, torch_pipeline
from ..timing import Timing, time_fn
from . import SUITES, Context, SuiteResult

N_SETS = 8  # input batches rotated through per timing


@dataclass(frozen=True)
class Preset:
    name: str
    cfg: MoEConfig
    hf_type: str  # transformers model_type of the matching block
    hf_experts: str | None  # its experts implementation (None: the block's only one)
    decode: tuple[int, ...]
    prefill: tuple[int, ...]


PRESETS = [
    Preset("llama4-scout-tp8", preset("llama4-scout", tp=8), "llama4_text", None,
           (1, 8, 64, 128), (2048, 16384)),
    Preset("llama4-maverick-tp8", preset("llama4-maverick", tp=8), "llama4_text", None,
           (1, 8, 64, 128), (2048, 16384)),
    Preset("qwen3-30b-a3b", preset("qwen3-30b-a3b"), "qwen3_moe", "grouped_mm", (1, 64), (2048,)),
    Preset("mixtral-8x7b-tp2", preset("mixtral-8x7b", tp=2), "mixtral", "grouped_mm",
           (1, 16, 128), (1024,)),
]
SPEC_SCOUT_T64_US = 197.456  # the spec's Llama 4 Scout BF16 decode trace, T=64, H100


def _time(fn, xs, graph: bool, reps: int) -> Timing:
    if graph:
        try:
            return time_fn(lambda i: fn(xs[i]), len(xs), graph=True, reps=reps)
        except RuntimeError:  # the path syncs after all (capture refused): time it eagerly
            torch.cuda.synchronize()
    return time_fn(lambda i: fn(xs[i]), len(xs), graph=False, reps=reps)


def _flops(layer: MoE, routings, T: int) -> tuple[float, float]:
    """(routed experts' FLOPs, shared expert's and router's FLOPs) of one call."""
    c = layer.config
    pairs = sum(int(r.num_valid) for r in routings) / len(routings)
    return (6 * pairs * c.hidden_size * c.intermediate_size,
            6 * T * c.hidden_size * c.shared_intermediate_size + 2 * T * c.hidden_size * c.num_experts)


def _dense_us(T: int, D: int, flops: float, fp8: bool) -> float:
    """Time of one dense cuBLAS GEMM [T, D] x [D, N], N chosen for ``flops`` (bf16, or fp8
    rowwise through torch._scaled_mm)."""
    N = max(128, round(flops / (2 * T * D) / 128) * 128)
    a = torch.randn(T, D, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(N, D, device="cuda", dtype=torch.bfloat16)
    if fp8:
        a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
        sa, sb = torch.ones(T, 1, device="cuda"), torch.ones(1, N, device="cuda")
        t = time_fn(lambda i: torch._scaled_mm(a8, b8.t(), scale_a=sa, scale_b=sb,
                                               out_dtype=torch.bfloat16), 1, graph=False, reps=10)
    else:
        t = time_fn(lambda i: a @ b.t(), 1, graph=False, reps=10)
    return t.median_us * 2 * T * D * N / flops  # scaled to exactly ``flops``


def _dense_tflops(T: int, D: int, routed_flops: float, other_flops: float, fp8: bool) -> float:
    """TFLOP/s of dense cuBLAS GEMMs doing the layer's FLOPs in the layer's precisions: the
    routed experts' in fp8 when quantized, the shared expert's and router's in bf16 (the spec
    keeps those in bf16)."""
    us = _dense_us(T, D, routed_flops, fp8) + (_dense_us(T, D, other_flops, False) if other_flops else 0.0)
    return (routed_flops + other_flops) / us / 1e6


def _check(layer: MoE, x) -> str:
    """Layer output against the float64 reference: 'ok' or why not."""
    routing = layer.route(x)
    ref, mag = naive_moe(layer, x, routing, with_magnitude=True)
    c = compare(layer(x), ref, tolerance_key(layer.config), magnitude=mag)
    return "ok" if c.ok else c.why


def _preset_rows(p: Preset, dtype_name: str, ctx: Context, bf16_us: dict) -> list[dict]:
    cfg = p.cfg.replace(quantization="fp8_rowwise" if dtype_name == "fp8" else "none")
    torch.manual_seed(0)
    layer = MoE(cfg, device="cuda")
    hf = None
    if dtype_name == "bf16":
        try:
            hf = hf_block(p.hf_type, layer, p.hf_experts)
        except Exception as e:  # transformers missing or changed: report, keep the rest
            print(f"{p.name}: no HF block peer ({e})")
    loop_weights = _dequantized(layer)
    decode = p.decode[:2] if ctx.quick else p.decode
    prefill = p.prefill[:1] if ctx.quick else p.prefill
    rows = []
    checked = _check(layer, torch.randn(64, cfg.hidden_size, device="cuda", dtype=cfg.dtype))
    for T in decode + prefill:
        phase = "decode" if T in decode else "prefill"
        xs = [torch.randn(T, cfg.hidden_size, device="cuda", dtype=cfg.dtype) for _ in range(N_SETS)]
        routings = [layer.route(x) for x in xs]
        active = sum(int((r.counts > 0).sum()) for r in routings) / len(routings)
        must_read = must_read_bytes(cfg, active)
        routed_flops, other_flops = _flops(layer, routings, T)
        flops = routed_flops + other_flops
        reps = 10 if T >= 8192 else 30
        ours = _time(layer, xs, graph=True, reps=reps)
        row = dict(preset=p.name, dtype=dtype_name, T=T, phase=phase, us=ours.median_us,
                   graph=ours.graph, active_experts=active, must_read_mb=must_read / 1e6,
                   floor_us=must_read / (ctx.ceilings.copy_gbps * 1e3),
                   gbps=must_read / ours.median_us / 1e3, tflops=flops / ours.median_us / 1e6)
        row["x_floor"] = row["us"] / row["floor_us"]
        row["pct_copy_bw"] = 100 * row["gbps"] / ctx.ceilings.copy_gbps
        peer = _time(lambda x: torch_pipeline(layer, x), xs, graph=True, reps=reps)
        row.update(torch_us=peer.median_us, vs_torch=peer.median_us / ours.median_us)
        if dtype_name == "bf16":
            loop = _time(lambda x: per_expert_loop(layer, x, *loop_weights), xs, graph=False,
                         reps=min(reps, 15))
            row.update(loop_us=loop.median_us, vs_loop=loop.median_us / ours.median_us)
            if hf is not None:
                h = _time(lambda x: hf_block_forward(hf, x), xs, graph=True, reps=min(reps, 15))
                row.update(hf_us=h.median_us, hf_graph=h.graph, vs_hf=h.median_us / ours.median_us)
            bf16_us[(p.name, T)] = ours.median_us
        elif (p.name, T) in bf16_us:
            row["vs_bf16"] = ours.median_us / bf16_us[(p.name, T)]
        if phase == "prefill" and T >= 8192:
            dense = _dense_tflops(T, cfg.hidden_size, routed_flops, other_flops, dtype_name == "fp8")
            row.update(dense_tflops=dense, pct_dense=100 * row["tflops"] / dense)
        row["check"] = checked
        rows.append(row)
    return rows


def _shootout(p: Preset, T: int) -> list[dict]:
    torch.manual_seed(0)
    layer = MoE(p.cfg, device="cuda")
    xs = [torch.randn(T, p.cfg.hidden_size, device="cuda", dtype=p.cfg.dtype) for _ in range(N_SETS)]
    rows = []
    for name in EXPERTS.names():
        layer.set_experts(name)
        t = _time(layer, xs, graph=EXPERTS.get(name).graph_safe, reps=15)
        rows.append(dict(preset=p.name, T=T, strategy=name, us=t.median_us, graph=t.graph))
        torch.cuda.empty_cache()
    base = next(r["us"] for r in rows if r["strategy"] == "shuffled")
    for r in rows:
        r["x_shuffled"] = r["us"] / base
    return rows


def _targets(rows: list[dict]) -> list[dict]:
    targets = []

    def add(target: str, measured: float, ok: bool) -> None:
        targets.append(dict(target=target, measured=round(measured, 3), met=bool(ok)))

    for r in rows:
        if r["phase"] == "shoot-out":
            continue
        key = f"{r['preset']} {r['dtype']} T={r['T']}"
        if r["preset"] == "llama4-scout-tp8" and r["dtype"] == "bf16" and r["T"] == 64:
            add(f"{key}: time <= 1.10 x floor", r["x_floor"], r["x_floor"] <= 1.10)
            add(f"{key}: time (us) < spec's 197", r["us"], r["us"] < SPEC_SCOUT_T64_US)
            # nothing beats the bytes floor, so torch_us / floor_us bounds any kernel's speedup
            add(f"{key}: >= 2.5x stock-torch pipeline (attainable: "
                f"{r['torch_us'] / r['floor_us']:.2f}x at the floor)", r["vs_torch"], r["vs_torch"] >= 2.5)
            add(f"{key}: >= 10x per-expert loop", r["vs_loop"], r["vs_loop"] >= 10)
        if r["phase"] == "decode":
            add(f"{key}: >= 85% of copy bandwidth", r["pct_copy_bw"], r["pct_copy_bw"] >= 85)
            if r["dtype"] == "fp8" and "vs_bf16" in r:
                add(f"{key}: fp8 time <= 0.6 x bf16", r["vs_bf16"], r["vs_bf16"] <= 0.6)
        if "pct_dense" in r:
            add(f"{key}: >= 85% of dense cuBLAS TFLOP/s", r["pct_dense"], r["pct_dense"] >= 85)
        if r["check"] != "ok":
            add(f"{key}: output within tolerance", 0.0, False)
    return targets


def _plot(shootout: list[dict]):
    def plot(out_dir: str) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        Ts = sorted({r["T"] for r in shootout})
        presets = list(dict.fromkeys(r["preset"] for r in shootout))
        strategies = list(dict.fromkeys(r["strategy"] for r in shootout))
        fig, axes = plt.subplots(1, len(Ts), figsize=(7 * len(Ts), 4.5), squeeze=False)
        width = 0.8 / len(strategies)
        for ax, T in zip(axes[0], Ts):
            for j, s in enumerate(strategies):
                ys = [next((r["us"] for r in shootout if r["preset"] == p and r["T"] == T
                            and r["strategy"] == s), float("nan")) for p in presets]
                ax.bar([i + j * width for i in range(len(presets))], ys, width, label=s)
            ax.set_xticks([i + 0.4 - width / 2 for i in range(len(presets))], presets, rotation=15)
            ax.set_yscale("log")
            ax.set_ylabel("time per layer (us, log)")
            ax.set_title(f"MoE layer strategies, T = {T} tokens, bf16")
        axes[0][0].legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(pathlib.Path(out_dir) / "layer.png", dpi=120)

    return plot


COLUMNS = ["preset", "dtype", "T", "phase", "us", "graph", "floor_us", "x_floor", "pct_copy_bw",
           "tflops", "pct_dense", "active_experts", "torch_us", "vs_torch", "loop_us", "vs_loop",
           "hf_us", "vs_hf", "vs_bf16", "check"]


@SUITES.register("layer")
def run(ctx: Context) -> SuiteResult:
    presets = PRESETS[:1] + PRESETS[2:3] if ctx.quick else PRESETS
    rows, bf16_us = [], {}
    for p in presets:
        for dtype_name in ("bf16", "fp8"):
            print(f"layer: {p.name} {dtype_name}", flush=True)
            rows += _preset_rows(p, dtype_name, ctx, bf16_us)
            torch.cuda.empty_cache()
    shootout = []
    for p in presets:
        for T in ((64,) if ctx.quick else (64, 2048)):
            print(f"shoot-out: {p.name} T={T}", flush=True)
            shootout += _shootout(p, T)
    for r in shootout:
        rows.append(dict(preset=r["preset"], dtype="bf16", T=r["T"], phase="shoot-out",
                         us=r["us"], graph=r["graph"], check=f"{r['strategy']} ({r['x_shuffled']:.2f}x shuffled)"))
    notes = ("us: median per layer call; graph: timed as CUDA-graph replays. floor: bytes that must "
             "be read (active experts + shared expert + router) over the copy bandwidth measured in "
             "this run. Peers on the same weights: torch = the same pipeline in stock torch ops with "
             "torch._grouped_mm / torch._scaled_grouped_mm; loop = HF-style per-expert loop; hf = "
             "transformers' own block (grouped_mm experts for Qwen3/Mixtral, Llama 4's default). "
             "vs_x = peer time / ours. Shoot-out rows: every strategy on the same layer.")
    return SuiteResult(rows, _targets(rows), COLUMNS, notes, _plot(shootout))
