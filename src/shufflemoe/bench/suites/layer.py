"""The MoE layer on the GPU: model presets in every quantization format MoEConfig offers, against
the read-bandwidth ceiling for the bytes the routing activates, a dense cuBLAS GEMM of the same
FLOPs (same precision and accumulation) at prefill, and the peers a user would otherwise run,
each like for like:
  - graph: ours (CUDA-graph replays) vs the same pipeline in stock torch ops (sync-free) and
    transformers' block where it captures;
  - eager: ours launched from Python vs the torch pipeline, transformers' block (its best experts
    implementation for the case) and the HF-style per-expert loop (syncs);
  - compile: torch.compile'd ours vs the torch.compile'd torch pipeline (a few cases).
  Eager and compiled paths are timed in turns (one call of each per round), so a slow spell of
  the host falls on both sides of a ratio.
Also: Llama 4 Scout at T = 64 on the spec's basis (routing that activates all 16 experts), the
batch-invariant mode's cost, and the strategy shoot-out (padding / slicing / concatenation /
shuffling, blockwise, decode strategies).

Weights rotate with the inputs: several copies of the layer (enough that one pass over the input
sets reads over twice the L2), input set i on copy i % copies. Every timed path is checked: its
output for each set (the first CHECKED_LARGE sets at T >= LARGE_T) against the float64 reference
of that set, under the format's tolerance (shufflemoe.testing).
"""

from __future__ import annotations

import dataclasses
import itertools
import traceback
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ... import EXPERTS, MoE, MoEConfig, naive_moe, preset
from ...config import QUANTIZATIONS
from ...ops import use_impl
from ...testing import compare, tolerance_key
from ..peers import _dequantized, hf_block_candidates, hf_block_forward, per_expert_loop, torch_pipeline
from ..timing import Timing, rotations, time_fn, time_turns
from . import Context, SuiteResult, suite
from .layer_report import COLUMNS, analyse, plot_strategies

DEVICE = "cuda"  # a CPU dry run of the logic (tests/bench) patches this
N_SETS = 8  # input batches per timing
LARGE_T, CHECKED_LARGE = 8192, 2  # float64 references of every set would cost seconds per case there
MAX_COPY_BYTES = 24 << 30  # weight copies rotated through, at most
DECODE_T = (1, 2, 4, 8, 64, 128)
PEER_T = (1, 8, 64)  # decode token counts timed with peers too (and every prefill)
OTHER_FORMAT_T = (1, 8, 64, 2048)  # formats beyond bf16 and fp8 rowwise: fewer shapes
DENSE_FP8 = {"none": False, "fp8_rowwise": True}  # formats with a dense cuBLAS reference
COMPILE_CASES = {("llama4-scout-tp8", 1), ("llama4-scout-tp8", 8), ("qwen3-30b-a3b", 1), ("qwen3-30b-a3b", 8),
                 ("qwen3-30b-a3b", 64)}
BATCH_INVARIANT_CASES = {("llama4-scout-tp8", T) for T in (1, 64, 2048)} | {("qwen3-30b-a3b", T) for T in (1, 64, 2048)}
TURN_REPS = 15  # rounds of the paths launched from Python, one sample of each a round
COMPILE_OPTIONS: dict = {}  # torch.compile's defaults (a CPU dry run uses backend="eager")
SHOOTOUT_T = {"llama4-scout-tp8": (64, 2048)}  # others: (64,)
QUICK_PRESETS = ("llama4-scout-tp8", "qwen3-30b-a3b")
SPEC_SCOUT_T64_US = 197.456  # the spec's Llama 4 Scout BF16 decode trace, T=64, H100, 16 experts


@dataclass(frozen=True)
class Preset:
    name: str
    cfg: MoEConfig
    hf_type: str  # transformers model_type of the matching block
    hf_experts: tuple[str | None, ...]  # its experts implementations to try (None: its only one)
    prefill: tuple[int, ...]


PRESETS = [
    Preset("llama4-scout-tp8", preset("llama4-scout", tp=8), "llama4_text", (None,), (2048, 16384)),
    Preset("llama4-maverick-tp8", preset("llama4-maverick", tp=8), "llama4_text", (None,), (2048, 16384)),
    Preset("qwen3-30b-a3b", preset("qwen3-30b-a3b"), "qwen3_moe", ("grouped_mm", "batched_mm"), (2048,)),
    Preset("mixtral-8x7b-tp2", preset("mixtral-8x7b", tp=2), "mixtral", ("grouped_mm", "batched_mm"), (1024,)),
]


def formats() -> list[str]:
    """Every quantization format MoEConfig knows, by name ('none' is bf16)."""
    return list(QUANTIZATIONS)


def format_label(fmt: str) -> str:
    return "bf16" if fmt == "none" else fmt


def _layer_tensors(layer: MoE):
    return itertools.chain(layer.named_parameters(), layer.named_buffers())


def expert_bytes(layer: MoE) -> float:
    """Bytes of one routed expert as stored: every w13* / w2* tensor (weights and scales) / E."""
    total = sum(t.numel() * t.element_size() for n, t in _layer_tensors(layer) if n.startswith(("w13", "w2")))
    return total / layer.config.num_experts


def fixed_bytes(layer: MoE) -> float:
    """Bytes every call reads whatever the routing: router, shared expert."""
    return sum(t.numel() * t.element_size() for n, t in _layer_tensors(layer) if not n.startswith(("w13", "w2")))


def _copies(layer: MoE, activated_bytes: float) -> int:
    """Weight copies to rotate through: one pass reads > 2x L2, within MAX_COPY_BYTES."""
    total = expert_bytes(layer) * layer.config.num_experts + fixed_bytes(layer)
    return max(1, min(rotations(int(activated_bytes), cap=4), int(MAX_COPY_BYTES // total)))


def covering_inputs(layer: MoE, T: int, seed: int) -> torch.Tensor:
    """x [T, D] whose top-1 routing gives every expert T / E tokens (the spec's Scout trace uses
    all 16 experts at T = 64)."""
    cfg = layer.config
    E = cfg.num_experts
    if cfg.top_k != 1 or T % E:
        raise ValueError("covering_inputs needs top-1 routing and T divisible by E")
    g = torch.Generator(device=layer.w13.device).manual_seed(seed)
    pool = torch.randn(64 * T, cfg.hidden_size, device=layer.w13.device, generator=g).to(cfg.dtype)
    choice = F.linear(pool, layer.router_weight).float().argmax(1)  # top-1 (sigmoid is monotone)
    picks = [pool[choice == e][: T // E] for e in range(E)]
    if any(p.shape[0] < T // E for p in picks):
        raise RuntimeError("the random pool did not reach every expert; raise its size")
    x = torch.cat(picks)
    return x[torch.randperm(T, device=x.device, generator=g)]


def _dense(T: int, D: int, flops: float, fp8: bool, reps: int) -> Timing:
    """Time of one dense cuBLAS GEMM [T, D] x [D, N] doing ``flops`` (bf16, or fp8 rowwise through
    torch._scaled_mm with fast accumulation, as shufflemoe's fp8 kernels accumulate), timed as
    ours is: CUDA-graph replays (eager calls without CUDA: dry runs), ``reps`` samples; scaled to
    exactly ``flops``."""
    N = max(128, round(flops / (2 * T * D) / 128) * 128)
    a = torch.randn(T, D, device=DEVICE, dtype=torch.bfloat16)
    b = torch.randn(N, D, device=DEVICE, dtype=torch.bfloat16)
    if fp8:
        a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
        sa, sb = torch.ones(T, 1, device=DEVICE), torch.ones(1, N, device=DEVICE)
        run = lambda i: torch._scaled_mm(a8, b8.t(), scale_a=sa, scale_b=sb,  # noqa: E731
                                         out_dtype=torch.bfloat16, use_fast_accum=True)
    else:
        run = lambda i: a @ b.t()  # noqa: E731
    t = time_fn(run, 1, graph=torch.cuda.is_available(), reps=reps)
    k = 2 * T * D * N / flops
    return dataclasses.replace(t, median_us=t.median_us * k, p20_us=t.p20_us * k, p80_us=t.p80_us * k,
                               min_us=t.min_us * k, max_us=t.max_us * k)


def _dense_fields(parts: list[Timing], row: dict) -> dict:
    """dense_us [dense_lo, dense_hi]: the dense GEMMs' medians [p20s, p80s] summed; pct_dense =
    dense over our median, its bounds [dense p20 / our p80, dense p80 / our p20]: the target
    judges the median, the bounds say how far the two runs' spreads could move it."""
    lo, mid, hi = (sum(getattr(t, f) for t in parts) for f in ("p20_us", "median_us", "p80_us"))
    return dict(dense_us=mid, dense_lo=lo, dense_hi=hi, pct_dense=100 * mid / row["us"],
                pct_dense_lo=100 * lo / row.get("us_hi", row["us"]),
                pct_dense_hi=100 * hi / row.get("us_lo", row["us"]))


class _Case:
    """One (preset, format, T): rotated layer copies, input sets, their float64 references (made
    on first use, kept on the host) and the row fields they imply."""

    def __init__(self, layers: list[MoE], xs: list[torch.Tensor]):
        self.layers, self.xs = layers, xs
        cfg = layers[0].config
        T = xs[0].shape[0]
        self.refs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        routings = [self.layer(i).route(x) for i, x in enumerate(xs)]
        self.active = sum(int((r.counts > 0).sum()) for r in routings) / len(routings)
        pairs = sum(int(r.num_valid) for r in routings) / len(routings)
        D = cfg.hidden_size
        self.routed_flops = 6 * pairs * D * cfg.intermediate_size
        self.other_flops = 6 * T * D * cfg.shared_intermediate_size + 2 * T * D * cfg.num_experts
        self.fields = dict(active_experts=self.active,
                           read_bytes=self.active * expert_bytes(layers[0]) + fixed_bytes(layers[0]) + T * D * 2,
                           write_bytes=T * D * 2, flops=self.routed_flops + self.other_flops,
                           fp8=DENSE_FP8.get(cfg.quantization, False), bound="read")

    def layer(self, i: int) -> MoE:
        return self.layers[i % len(self.layers)]

    def reference(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(float64 output, error magnitude) of set i on its layer copy, under the layer's routing."""
        if i not in self.refs:
            layer, x = self.layer(i), self.xs[i]
            ref, mag = naive_moe(layer, x, layer.route(x), with_magnitude=True)
            self.refs[i] = (ref.cpu(), mag.cpu())
        return self.refs[i]

    def check(self, outputs: list) -> str:
        """The timed path's outputs against the float64 reference, set by set: 'ok' or why not."""
        key = tolerance_key(self.layers[0].config)
        n = CHECKED_LARGE if self.xs[0].shape[0] >= LARGE_T else len(outputs)
        for i, out in enumerate(outputs[:n]):
            ref, mag = self.reference(i)
            c = compare(out, ref, key, magnitude=mag)
            if not c.ok:
                return f"set {i} vs float64: {c.why}"
        return "ok"

    def time(self, fn, mode: str, reps: int, check: bool = False) -> tuple[dict, str | None]:
        """(row fields, check) of fn(layer, x) over the sets, issued as ``mode``; a path that
        refuses CUDA-graph capture (it syncs) gets a row saying so, without a time."""
        run = lambda i: fn(self.layer(i), self.xs[i])  # noqa: E731
        try:
            t = time_fn(run, len(self.xs), graph=mode == "graph", reps=reps, keep_outputs=check,
                        mode=mode)
        except RuntimeError as e:
            if mode != "graph":
                raise
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            return dict(mode=mode, note=f"capture refused: {str(e)[:100]}"), None
        return dict(mode=t.mode, **t.fields()), (self.check(t.outputs) if check else None)

    def time_turns(self, fns: dict, mode: str, reps: int, check: tuple = ()) -> dict:
        """Paths launched from Python (eager, compile), label -> fn(layer, x), timed in turns
        (timing.time_turns: one sample of each per round, so a slow spell of the host does not
        fall on one side of a ratio): label -> (row fields, check) or the exception it raised."""
        runs = {label: (lambda f: lambda i: f(self.layer(i), self.xs[i]))(fn) for label, fn in fns.items()}
        got = time_turns(runs, len(self.xs), reps=reps, mode=mode, keep_outputs=check)
        return {label: t if isinstance(t, Exception) else
                (dict(mode=t.mode, **t.fields()), self.check(t.outputs) if label in check else None)
                for label, t in got.items()}


def _call(layer: MoE, x: torch.Tensor) -> torch.Tensor:
    return layer(x)


def _peers(p: Preset, fmt: str, T: int, hf: dict, loop_weights: list) -> dict:
    """impl -> (fn(layer, x), the modes it runs in) of every peer of the case."""
    peers = {}
    if fmt in DENSE_FP8:  # the torch pipeline runs bf16 and fp8 rowwise
        peers["torch pipeline"] = (torch_pipeline, ("graph", "eager"))
    if fmt == "none" and T <= 2048:
        peers["per-expert loop (syncs)"] = (
            lambda layer, x: per_expert_loop(layer, x, *loop_weights[id(layer)]), ("eager",))
        for impl, blocks in hf.items():
            if _hf_fits(p, impl, T):
                peers[f"transformers {impl}"] = (
                    (lambda b: lambda layer, x: hf_block_forward(b[id(layer)], x))(blocks), ("graph", "eager"))
    return peers


def _turn_rows(case: _Case, fns: dict, mode: str, reps: int) -> list[dict]:
    """Rows of ours ("shufflemoe", checked) and its peers in ``mode``, timed in turns; a path
    that fails (a compile error) is reported, not fatal."""
    rows = []
    for impl, got in case.time_turns(fns, mode, reps, check=("shufflemoe",)).items():
        side = "ours" if impl == "shufflemoe" else "peer"
        if isinstance(got, Exception):
            rows.append(dict(impl=impl, side=side, mode=mode, note=f"failed: {type(got).__name__}: {str(got)[:120]}"))
            continue
        timing, check = got
        rows.append(dict(impl=impl, side=side, **timing, **(case.fields if side == "ours" else {}),
                         **({"check": check} if check else {})))
    return rows


def _hf_fits(p: Preset, impl: str, T: int) -> bool:
    """batched_mm gathers one weight matrix per token-expert pair: skip it where that alone
    would take more than 8 GB."""
    c = p.cfg
    return impl != "batched_mm" or T * c.top_k * 3 * c.hidden_size * c.intermediate_size * 2 <= 8 << 30


def _batch_invariant_row(case: _Case, reps: int) -> dict:
    bi = []
    for layer in case.layers:
        weights = {n: t for n, t in layer.named_parameters()}
        bi.append(MoE.from_weights(layer.config.replace(batch_invariant=True), **weights))
    with use_impl("triton"):  # the mode needs the kernels (the interpreter in a CPU dry run)
        variant = _Case(bi, case.xs)
        timing, check = variant.time(_call, "graph", reps, check=True)
    return dict(impl="shufflemoe batch_invariant", side="variant", **timing, check=check)


def _preset_rows(p: Preset, fmt: str, ctx: Context) -> list[dict]:
    cfg = p.cfg.replace(quantization=fmt)
    torch.manual_seed(0)
    first = MoE(cfg, device=DEVICE)
    copies = _copies(first, expert_bytes(first) * cfg.top_k + fixed_bytes(first))  # what T = 1 reads
    layers = [first] + [MoE(cfg, device=DEVICE) for _ in range(copies - 1)]
    hf, loop_weights = {}, {}
    if fmt == "none":
        hf = hf_block_candidates(p.hf_type, layers, p.hf_experts)
        loop_weights = {id(layer): _dequantized(layer) for layer in layers}
    Ts = DECODE_T if fmt in DENSE_FP8 else tuple(t for t in OTHER_FORMAT_T if t < 2048)
    prefill = p.prefill if fmt in DENSE_FP8 else tuple(t for t in OTHER_FORMAT_T if t >= 2048)
    if ctx.quick:
        Ts, prefill = (1, 64), prefill[:1]
    rows = []
    for T in Ts + prefill:
        if ctx.seconds_left() < 60:
            rows.append(dict(preset=p.name, format=format_label(fmt), T=T, impl="shufflemoe", side="ours",
                             note="skipped: time budget"))
            continue
        rows += _token_rows(p, fmt, ctx, layers, T, "decode" if T in Ts else "prefill", hf, loop_weights)
    return rows


def _token_rows(p: Preset, fmt: str, ctx: Context, layers: list[MoE], T: int, phase: str,
                hf: dict, loop_weights: dict) -> list[dict]:
    cfg = layers[0].config
    xs = [torch.randn(T, cfg.hidden_size, device=DEVICE, dtype=cfg.dtype) for _ in range(N_SETS)]
    case = _Case(layers, xs)
    reps = 10 if T >= 8192 else 30
    base = dict(preset=p.name, format=format_label(fmt), T=T, phase=phase, routing="random")
    timing, check = case.time(_call, "graph", reps, check=True)
    rows = [dict(base, impl="shufflemoe", side="ours", **timing, **case.fields, check=check)]
    peers = _peers(p, fmt, T, hf, loop_weights) if T in PEER_T or phase == "prefill" else {}
    for impl, (fn, modes) in peers.items():
        if "graph" in modes:
            try:
                timing, _ = case.time(fn, "graph", min(reps, 15))
                rows.append(dict(base, impl=impl, side="peer", **timing))
            except Exception as e:  # noqa: BLE001 - a peer that fails is reported, not fatal
                rows.append(dict(base, impl=impl, side="peer", mode="graph",
                                 note=f"failed: {type(e).__name__}: {str(e)[:120]}"))
    eager = {"shufflemoe": _call, **{impl: fn for impl, (fn, modes) in peers.items() if "eager" in modes}}
    rows += [dict(base, **r) for r in _turn_rows(case, eager, "eager", min(reps, TURN_REPS))]
    if fmt == "none" and (p.name, T) in COMPILE_CASES and not ctx.quick:
        compiled = {impl: torch.compile(fn, **COMPILE_OPTIONS)
                    for impl, fn in (("shufflemoe", _call), ("torch pipeline", torch_pipeline))}
        rows += [dict(base, **r) for r in _turn_rows(case, compiled, "compile", min(reps, TURN_REPS))]
    if fmt == "none" and (p.name, T) in BATCH_INVARIANT_CASES and not ctx.quick:
        rows.append(dict(base, **case.fields, **_batch_invariant_row(case, reps)))
    if phase == "prefill" and fmt in DENSE_FP8:
        dense = [_dense(T, cfg.hidden_size, case.routed_flops, DENSE_FP8[fmt], reps),
                 _dense(T, cfg.hidden_size, case.other_flops, False, reps)]
        for r in rows:
            if r.get("us"):
                r.update(_dense_fields(dense, r))
    if p.name == "llama4-scout-tp8" and fmt == "none" and T == 64:
        spec_xs = [covering_inputs(case.layer(i), T, seed=i) for i in range(N_SETS)]
        spec = _Case(layers, spec_xs)
        timing, check = spec.time(_call, "graph", reps, check=True)
        rows.append(dict(base, routing="all 16 experts (spec basis)", impl="shufflemoe", side="ours",
                         **timing, **spec.fields, spec_us=SPEC_SCOUT_T64_US, check=check))
    return rows


def _shootout(p: Preset, T: int) -> list[dict]:
    torch.manual_seed(0)
    layer = MoE(p.cfg, device=DEVICE)
    xs = [torch.randn(T, p.cfg.hidden_size, device=DEVICE, dtype=p.cfg.dtype) for _ in range(N_SETS)]
    case = _Case([layer], xs)
    rows = []
    for name in EXPERTS.names():
        layer.set_experts(name)
        timing, check = case.time(_call, "graph" if EXPERTS.get(name).graph_safe else "eager", 15, check=True)
        rows.append(dict(preset=p.name, format="bf16", T=T, phase="shoot-out", impl=name, side="variant",
                         **timing, check=check))
        torch.cuda.empty_cache()
    return rows


@suite("layer", "MoE layer presets x formats: % of the read ceiling, vs dense cuBLAS, vs torch / "
       "transformers / per-expert loop (eager, graph, compile), shoot-out", est_s=280, part=1)
def run(ctx: Context) -> SuiteResult:
    presets = [p for p in PRESETS if not ctx.quick or p.name in QUICK_PRESETS]
    jobs = [(p, fmt) for p in presets for fmt in formats()]
    rows = []
    for n, (p, fmt) in enumerate(jobs):
        ctx.progress(n, len(jobs) + len(presets), f"{p.name} {format_label(fmt)}")
        try:
            rows += _preset_rows(p, fmt, ctx)
        except Exception as e:  # noqa: BLE001 - a format the device lacks must not end the suite
            traceback.print_exc()
            rows.append(dict(preset=p.name, format=format_label(fmt), impl="shufflemoe", side="ours",
                             note=f"failed: {type(e).__name__}: {str(e)[:160]}"))
        torch.cuda.empty_cache()
    for n, p in enumerate(presets):
        ctx.progress(len(jobs) + n, len(jobs) + len(presets), f"shoot-out {p.name}")
        for T in (64,) if ctx.quick else SHOOTOUT_T.get(p.name, (64,)):
            if ctx.seconds_left() > 60:
                rows += _shootout(p, T)
    return SuiteResult(rows, analyse, COLUMNS, NOTES, plot_strategies)


NOTES = ("us: median per layer call [p20, p80]; mode: graph = CUDA-graph replays, eager = launched "
         "from Python, compile = torch.compile default mode (eager and compile paths of a case timed in "
         "turns, one call of each per round). read_bytes: the activated experts "
         "(as stored, scales included), the shared expert, the router and x; pct_read = those bytes "
         "per second over the read ceiling; floor: reads at the read ceiling, writes at what a copy "
         "leaves for them, or the FLOPs at the dense rate. pct_dense: a dense cuBLAS GEMM doing the "
         "layer's FLOPs (routed in the format's precision, fp8 with fast accumulation; shared expert "
         "and router in bf16, CUDA-graph replays as ours) over our time, [dense p20 / our p80, dense p80 / "
         "our p20]; dense_us its time [p20, p80]. Peers on the same rotated weights. Shoot-out rows: every "
         "strategy on one layer.")
