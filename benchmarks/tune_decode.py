"""Tune the fused decode kernels' tiles on one GPU and write the table configs.py reads (one call).

    PYTHONPATH=src python benchmarks/tune_decode.py --out $OUT [--budget 540] [--workers 12]
    PYTHONPATH=src python benchmarks/tune_decode.py --dry-run --out /tmp/x   (CPU, interpreter)

Cases: the routed experts of Llama 4 Scout and Maverick TP8, Qwen3-30B-A3B and Mixtral TP2 in
bf16, fp8 rowwise and fp8_w8a16 (--dtypes picks), and the Llama 4 TP8 shared expert (one
expert: the layer runs it through the same kernels at decode sizes), at every A = T * k that is
a power of two up to the fused path's 64 pairs (the table's A buckets; fp8_w8a16 only where the
default switch fuses); in each, the two GEMMs apart. Candidates: tile shapes (block_n, block_k
as bytes of a weight row, warps, stages) x split-K factors that give about 0.5..4 programs per
SM, and the untuned choice (configs.untuned: the heuristic, or fp8_w8a16's rule).

1. compile: worker processes run every candidate once (Triton's disk cache), so the timing
   process only loads kernels;
2. time: each candidate checked against the torch reference on the first input, then timed in
   CUDA-graph replays over rotated weight sets and routings (every call routes differently; one
   pass reads over 2x the L2); the 3 fastest timed again with more replays, the best kept.
   fp8 rowwise's down candidates with one-pair tiles take a's rows in fp32 and quantize them
   (configs.down_quantizes), as the layer runs them; the others take gate_up's (q, scale).
   Where down's best is an MMA tile, its fastest one-pair tile is kept too (the alt row): with
   it gate_up stores a unquantized and skips its m-tile's arrival, which down's own timing
   cannot see;
3. layer: the whole layer (graph replays) at each T, fused with the new table (PDL off and on),
   with the alt row where there is one (PDL off and on), with the committed row where the
   table had one, fused with the untuned tiles, and unfused, as % of the read ceiling for the
   bytes the routing activates (planner.must_read_bytes), the bytes floor the layer suite uses;
   each row the layer ran with keeps PDL where that was faster, gives way to its alt row where
   the layer was faster with that, and is dropped unless the layer was faster with it than
   with the untuned tiles by KEEP_MARGIN; a committed row gives way (to new tiles, another PDL
   bit or no row) only where the layer was faster by KEEP_MARGIN than with it (judge), and
   stays where no layer row reads its key (keep_unjudged); the
   shared expert's rows in Llama 4 Scout's layer at the T it runs that expert in launches of
   its own (shared_judge);
4. writes $OUT/tune_decode.json, $OUT/tune_decode.md and $OUT/tuned.py (the tables: copy it to
   src/shufflemoe/ops/moe_decode/tuned.py). With --dtypes naming some of DTYPES, the other
   dtypes' rows stay as committed and the results are tune_decode_<dtypes>.json / .md. Rows of
   the run's formats that no case names any more are dropped (drop_stale).
On tuned.BASE_DEVICE (and in a dry run) the run writes the base table, TABLE, against the
heuristic; on any other GPU it writes that GPU's rows, BY_DEVICE[its name], and "untuned" is
what that GPU runs without them (the base table's rows, else the heuristic): a row is kept only
where the layer is faster with it than with the base table's. The other GPUs' rows stay.
--results names the folder the results are committed to (tuned.py's provenance says it).
--layer-only keeps the committed tiles and runs phase 3 alone (PDL and the verdict per row, a
few minutes; writes tune_decode_pdl[_<dtypes>].json/.md).
Phases stop at their share of --budget and say what they skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing
import os
import pathlib
import sys
import textwrap
import time
import traceback

if "--dry-run" in sys.argv and not os.environ.get("TRITON_INTERPRET"):
    os.environ["TRITON_INTERPRET"] = "1"  # before triton decorates any kernel

import torch  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from decode_check import FUSED, dequant, inputs, layers_for, tiny, weight_sets  # noqa: E402

from shufflemoe import preset  # noqa: E402
from shufflemoe.ops import decode_down, decode_gate_up, use_impl  # noqa: E402
from shufflemoe.ops.moe_decode import configs, kernel  # noqa: E402
from shufflemoe.planner import must_read_bytes  # noqa: E402
from shufflemoe.testing import compare, tolerance_for, tolerance_key  # noqa: E402

PRESETS = {  # the shared expert first: the Llama 4 layers' rows use its entries
    "llama4-shared-tp8": preset("llama4-scout", tp=8, num_experts=1, shared_intermediate_size=0),
    "scout-tp8": preset("llama4-scout", tp=8),
    "maverick-tp8": preset("llama4-maverick", tp=8),
    "qwen3-30b-a3b": preset("qwen3-30b-a3b"),
    "mixtral-tp2": preset("mixtral-8x7b", tp=2),
}
DTYPES = {"bf16": "none", "fp8": "fp8_rowwise", "w8a16": "fp8_w8a16"}  # name -> weight format
# (block_n, bytes of K per weight row and step, warps, stages); gate_up streams 2 x block_n rows
TILES = ((32, 256, 4, 4), (32, 512, 4, 3), (64, 128, 4, 4), (64, 256, 4, 3), (64, 256, 4, 4),
         (64, 512, 4, 2), (64, 512, 4, 3), (128, 128, 4, 3), (128, 128, 8, 4), (128, 256, 4, 2),
         (128, 256, 8, 3))
# one pair a tile (block_m = 1, the CUDA cores) while A <= GEMV_MAX_PAIRS: (block_n, bytes of K,
# warps); its loads are not software-pipelined, so wide steps keep the bytes in flight. The
# narrow ones (4 and 8 rows, 2-4 KB of each row a step) give one expert's rows to every SM
# without split-K and its fixup (benchmarks/probe_gemv_tiles.py, H100: Llama 4 TP8 at T = 1,
# gate_up 13.8 -> 11.7 us bf16, 15.1 -> 12.0 fp8; the shared expert's down 7.8 -> 6.7)
GEMV_TILES = ((16, 1024, 4), (32, 512, 4), (32, 1024, 8), (64, 256, 4), (64, 512, 8),
              (4, 2048, 4), (4, 4096, 4), (4, 4096, 8), (8, 2048, 8), (8, 4096, 8))
GEMV_MAX_PAIRS = 32
PROGRAMS_PER_SM = (0.5, 1, 2, 3, 4)  # split-K factors aim at these many programs per SM
N_INPUTS = 8  # routings (and weight sets) rotated through per timing
SHARES = {"compile": 0.3, "time": 0.85, "layer": 1.0}  # phases end at these parts of the budget
KEEP_MARGIN = 0.01  # a row stays only where the layer is this much faster with it (judge)


def cases(dry: bool, dtypes=tuple(DTYPES), presets=tuple(PRESETS)) -> list[tuple[str, str, int]]:
    """(preset, dtype, A) in the order they are timed: bf16 first (the default path)."""
    out = []
    for dtype in dtypes:
        for name, cfg in PRESETS.items():
            if name not in presets:
                continue
            if name.startswith("llama4-shared") and dtype != "bf16":
                continue  # a quantized layer runs its shared expert in x's dtype (bf16)
            k, A = cfg.top_k, 1
            while A <= configs.Switch().max_pairs:
                if A % k == 0 and (dtype != "w8a16" or configs.use_fused(
                        A, k, DTYPES[dtype], cfg.num_experts)):
                    out.append((name, dtype, A))
                A *= 2
    if dry:  # shared-expert cases (top-1, E = 1; merged at A = 1, judged at 4) and Qwen3 (top-8)
        out = [("llama4-shared-tp8", "bf16", 1), ("llama4-shared-tp8", "bf16", 4),
               ("qwen3-30b-a3b", "bf16", 8),
               ("qwen3-30b-a3b", "fp8", 8), ("qwen3-30b-a3b", "w8a16", 8)]
        return [c for c in out if c[1] in dtypes and c[0] in presets]
    return out


def layer_config(name: str, dtype: str, dry: bool):
    cfg = PRESETS[name].replace(quantization=DTYPES[dtype])
    return tiny(cfg) if dry else cfg  # dry: widths the interpreter gets through


def candidates(gemm: str, A: int, cfg, w_dtype: torch.dtype, sms: int, dry: bool,
               gpu: str = "") -> dict[str, configs.DecodeConfig]:
    """label -> DecodeConfig changing one GEMM (the untuned choice on the GPU ``gpu`` first)."""
    E, D, I = cfg.num_experts, cfg.hidden_size, cfg.intermediate_size
    base = configs.untuned((A, E, D, I, w_dtype, sms), cfg.quantization, gpu)
    N, K = (I, D) if gemm == "gate_up" else (D, I)
    size = w_dtype.itemsize
    out = {"untuned": base}
    seen = {getattr(base, gemm)}
    tilings = [(t, 16) for t in (TILES[:2] if dry else TILES)]
    if A <= GEMV_MAX_PAIRS:
        tilings += [((bn, kb, warps, 2), 1) for bn, kb, warps in GEMV_TILES[:1 if dry else None]]
    for (bn, k_bytes, warps, stages), bm in tilings:
        bk = k_bytes // size
        if bk > 1 << (K - 1).bit_length():  # wider than K: the same steps, more masked lanes
            if not (dry and bm == 1):
                continue
            bk = 1 << (K - 1).bit_length()  # dry: a one-pair tile a GEMM at the tiny widths
        tiles, steps = min(E, A) * -(-N // bn), -(-K // bk)
        for f in (0,) + PROGRAMS_PER_SM:
            want = 1 if f == 0 else max(1, min(steps, round(f * sms / tiles)))
            split = -(-steps // -(-steps // want))  # the splits _k_split keeps
            g = configs.GemmConfig(bn, bk, split, warps, stages, block_m=bm)
            if g not in seen:
                seen.add(g)
                out[label(g)] = base.with_(**{gemm: g})
    return out


def label(g: configs.GemmConfig) -> str:
    return (f"{g.block_n}x{g.block_k} w{g.num_warps} s{g.num_stages} split{g.split_k}"
            + (" gemv" if g.block_m == 1 else ""))


class Case:
    """One (preset, dtype, A): inputs, routings, weights and both GEMMs as fn(i)."""

    def __init__(self, name: str, dtype: str, A: int, layers: list, device: str, n: int):
        cfg = self.cfg = layers[0].config
        self.name, self.dtype, self.A, self.n = name, dtype, A, n
        self.xs = inputs(cfg, A // cfg.top_k, device, n)
        self.routes = [layers[i % len(layers)].route(x) for i, x in enumerate(self.xs)]
        self.ws = [layers[i % len(layers)].expert_weights for i in range(n)]
        self.on_input = cfg.apply_router_weight_on_input
        self.w_dtype = self.ws[0].w13.dtype
        self.sms = kernel.sm_count(self.xs[0].device)
        self.acts = [self.gate_up(i) for i in range(n)]
        # fp8 rowwise: also a's rows in fp32, what down takes where it quantizes them itself
        # (configs.down_quantizes: one-pair tiles), so each candidate is timed as the layer
        # would run it
        A, I = self.routes[0].num_pairs, cfg.intermediate_size
        self.rows32 = ([self.gate_up(i, out=(torch.empty(A, I, device=device), None))
                        for i in range(n)] if cfg.quantization == "fp8_rowwise" else None)
        self.outs = [torch.zeros_like(x) for x in self.xs]
        self.active = sum(int((r.counts > 0).sum()) for r in self.routes) / n
        self.want: dict = {}  # gemm -> the torch reference's output on input 0 (float64)

    def gate_up(self, i: int, impl: str | None = None, out=None):
        r, w = self.routes[i], self.ws[i]
        return decode_gate_up(self.xs[i], w.w13, r.counts, r.token_ids,
                              r.weights if self.on_input else None, w13_scale=w.w13_scale,
                              quantization=self.cfg.quantization, out=out, impl=impl)

    def quantizes_in_down(self) -> bool:
        """Whether the plan in force has down quantize a's rows (configs.down_quantizes)."""
        w2 = self.ws[0].w2
        return self.rows32 is not None and configs.down_quantizes(
            self.A, *w2.shape, w2.dtype, w2.device, self.cfg.quantization)

    def down(self, i: int, a=None, out=None, impl: str | None = None):
        r, w = self.routes[i], self.ws[i]
        if a is None:
            a = self.rows32[i] if self.quantizes_in_down() else self.acts[i]
        decode_down(a, w.w2, r.counts, r.token_ids, r.positions,
                    self.outs[i] if out is None else out, None if self.on_input else r.weights,
                    w2_scale=w.w2_scale, quantization=self.cfg.quantization, impl=impl)

    def fn(self, gemm: str):
        return self.gate_up if gemm == "gate_up" else self.down

    def nbytes(self, gemm: str) -> float:
        """Weight bytes the GEMM reads per call (scales left out: under 1%)."""
        D, I = self.cfg.hidden_size, self.cfg.intermediate_size
        per_expert = (2 * I * D if gemm == "gate_up" else D * I) * self.w_dtype.itemsize
        return self.active * per_expert

    def check(self, gemm: str, cand: configs.DecodeConfig) -> None:
        """The GEMM under ``cand`` against the torch reference on input 0."""
        if gemm not in self.want:
            if gemm == "gate_up":
                self.want[gemm] = dequant(self.gate_up(0, "torch")).double()
            else:
                want = torch.zeros_like(self.xs[0])
                self.down(0, out=want, impl="torch")
                self.want[gemm] = want.double()
        with configs.override(cand):
            if gemm == "gate_up":
                got = self.gate_up(0)
            else:
                got = torch.zeros_like(self.xs[0])
                self.down(0, out=got)
        tol = tolerance_key(self.cfg) if gemm == "gate_up" else str(self.cfg.dtype)[6:]
        c = compare(dequant(got), self.want[gemm], tol)
        if not c.ok and not (isinstance(got, tuple) and fp8_close(got, self.want[gemm], tol)):
            raise AssertionError(f"{gemm} wrong under {cand}: {c.why}"
                                 + (e4m3_steps(got, self.want[gemm]) if isinstance(got, tuple)
                                    else ""))


def fp8_close(got: tuple, want: torch.Tensor, tol_key: str) -> bool:
    """fp8 rows (q, scale) against the reference: every value within the fp8 tolerance or within
    one e4m3 step of it (a value next to a rounding boundary that the kernel's sums, wgmma's fp8
    accumulation, put on the other side: up to 12.5% apart), and the relative L2 error within the
    tolerance. A wrong row, column or scale is off by more, almost everywhere."""
    tol = tolerance_for(tol_key)
    off, step = _off_and_step(got, want)
    bound = torch.maximum(tol.atol * want.square().mean().sqrt() + tol.rtol * want.abs(),
                          step * 1.001)
    return bool((off <= bound).all()) and float(off.norm() / want.norm()) <= tol.rel_l2


def _off_and_step(got: tuple, want: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    g = dequant(got).double()
    step = torch.maximum(g.abs(), want.abs()) * 2**-3 + got[1].double()[:, None] * 2**-9
    return (g - want).abs(), step


def e4m3_steps(got: tuple, want: torch.Tensor) -> str:
    off, step = _off_and_step(got, want)
    return (f"; e4m3 steps: max {float((off / step).max()):.2f}, "
            f"{float((off > step / 4).double().mean()):.2%} of values a step off")


def time_us(fn, n: int, reps: int) -> float:
    from shufflemoe.bench.timing import time_fn

    return time_fn(fn, n, graph=True, reps=reps, warmup=1).median_us


# ------------------------------------------------------------------------------- compile phase

def compile_job(job: tuple[str, str, int, bool, str]) -> dict:
    """Run every candidate of one case once (fills Triton's cache); labels that fail."""
    name, dtype, A, dry, gpu = job
    failed, n = {}, 0
    try:
        torch.manual_seed(0)
        layers = layers_for(layer_config(name, dtype, dry), 1, "cpu" if dry else "cuda")
        case = Case(name, dtype, A, layers, "cpu" if dry else "cuda", 1)
        for gemm in ("gate_up", "down"):
            for lab, cand in candidates(gemm, A, case.cfg, case.w_dtype, case.sms, dry,
                                        gpu).items():
                try:
                    with configs.override(cand):
                        case.fn(gemm)(0)
                    n += 1
                except Exception as e:  # e.g. out of shared memory: skipped when timing
                    failed[f"{gemm} {lab}"] = f"{type(e).__name__}: {str(e)[:200]}"
        if not dry:
            torch.cuda.synchronize()
        del layers, case
    except Exception as e:
        failed["case"] = f"{type(e).__name__}: {e}"[:500]
    if not dry:
        torch.cuda.empty_cache()  # the next job of this worker may be another preset
    return dict(case=[name, dtype, A], ran=n, failed=failed)


def compile_all(jobs: list, workers: int, deadline: float, dry: bool, gpu: str) -> list[dict]:
    if dry or workers <= 1:
        return [compile_job(j + (dry, gpu)) for j in jobs]
    ctx = multiprocessing.get_context("spawn")
    out = []
    with ctx.Pool(workers) as pool:
        pending = [pool.apply_async(compile_job, (j + (dry, gpu),)) for j in jobs]
        for j, p in zip(jobs, pending):
            left = deadline - time.monotonic()
            try:
                out.append(p.get(timeout=max(left, 1)))
            except multiprocessing.TimeoutError:
                out.append(dict(case=list(j), ran=0, failed={"case": "compile deadline"}))
        pool.terminate()
    return out


# ------------------------------------------------------------------------------------ layer

def quant_at(k: tuple, cfg) -> str:
    """The weight format a layer of ``cfg`` asks configs.select for at key k: its routed
    experts' (E is theirs, a merged shared expert's rows included), or "none" for a shared
    expert in its own launches (E = 1, x's dtype whatever the routed experts' format). An
    override is a function of the key alone, so it must tell them apart: with the routed
    format for both, Llama 4's bf16 shared expert took fp8_w8a16's tiles (Scout TP8 fp8_w8a16
    T = 8: 86.3 us against the default's 63.1, results/probe_harness_fd7545e.json)."""
    return cfg.quantization if k[1] == cfg.num_experts else "none"


def judged(key: tuple, cfg, variant: str, gpu: str = "", alt: tuple | None = None,
           committed: tuple | None = None):
    """configs.select in a layer of ``cfg`` on the GPU ``gpu`` where the row for ``key`` (a
    table_key) alone is ``variant``: "tuned" (PDL off), "tuned_pdl", "untuned"
    (configs.untuned), "alt" / "alt_pdl" (the row ``alt``, in the table's form) or "committed"
    (the row ``committed``, its PDL bit as committed); every other launch takes what the layer
    plans, so a verdict compares that row and nothing else."""
    def choose(k):
        quant = quant_at(k, cfg)
        if configs.table_key(*k, quant=quant) != key:
            return configs.planned(k, quant, gpu)
        if variant == "untuned":
            return configs.untuned(k, quant, gpu)
        if variant == "committed" or variant.startswith("alt"):
            gate_up, down, pdl = committed if variant == "committed" else alt
            return configs.DecodeConfig(configs.GemmConfig(*gate_up), configs.GemmConfig(*down),
                                        pdl=pdl if variant == "committed" else variant == "alt_pdl")
        return configs.planned(k, quant, gpu).with_(pdl=variant == "tuned_pdl")
    return choose


def layer_rows(case_layers: list, name: str, dtype: str, T: int, device: str, dry: bool,
               read_gbps: float, key_of, gpu: str = "", alts: dict | None = None,
               committed: dict | None = None) -> dict:
    """The layer at T tokens: fused with its table row (key_of(A), A the pairs its launches
    plan for) without and with PDL, with the key's row in ``alts`` if it has one (without and
    with PDL), with its row in ``committed`` (the table before this run) if it has one, fused
    with the untuned tiles, unfused. bf16 and fp8 rowwise take the fused path
    forced on (decode_check.FUSED: a shared expert merged where the default merges it),
    fp8_w8a16 the default switch (it has rows only where that fuses)."""
    cfg = case_layers[0].config
    quant = cfg.quantization
    fused = configs.Switch() if quant == "fp8_w8a16" else FUSED
    with configs.override(fused):  # a merged shared expert's T rows join the routed pairs
        merged = (cfg.shared_intermediate_size == cfg.intermediate_size
                  and configs.merges_shared(T, cfg.top_k, quant, cfg.num_experts))
    key = key_of(T * cfg.top_k + T * merged)
    xs = inputs(cfg, T, device, 2 if dry else N_INPUTS)
    active = sum(int((case_layers[i % len(case_layers)].route(x).counts > 0).sum())
                 for i, x in enumerate(xs)) / len(xs)
    nbytes = must_read_bytes(cfg, active)
    row = dict(preset=name, dtype=dtype, T=T, key=key, active_experts=active,
               must_read_mb=nbytes / 1e6)
    alt, before = (alts or {}).get(key), (committed or {}).get(key)
    variants = (("tuned", "tuned_pdl", "untuned") + ("alt", "alt_pdl") * (alt is not None)
                + ("committed",) * (before is not None))
    for lab, plans in [(v, (fused, judged(key, cfg, v, gpu, alt, before))) for v in variants
                       ] + [("unfused", (configs.NEVER,))]:
        run = lambda i: case_layers[i % len(case_layers)](xs[i])  # noqa: E731
        with contextlib.ExitStack() as stack:
            for plan in plans:
                stack.enter_context(configs.override(plan))
            if dry:
                for i in range(len(xs)):
                    run(i)
                us = float("nan")
            else:
                us = time_us(run, len(xs), 30)
        row[f"{lab}_us"] = us
        row[f"{lab}_pct_read"] = 100 * nbytes / us / 1e3 / read_gbps
    return row


SHARED_JUDGE = "scout-tp8"  # the layer whose shared expert (E = 1 launches) judges its rows


def shared_judge(dtype: str, dry: bool, device: str, As: list[int]) -> tuple[list, list[int]]:
    """Layers of SHARED_JUDGE, and the T at which its shared expert runs in launches of its own
    (A = T: one pair a token), not merged into the routed experts' under the layer phase's
    switch: there the shared expert's rows (E = 1) decide part of the layer's time, and
    layer_rows (its key_of giving the shared expert's keys) varies that row alone. Rows of
    the T it merges at serve only layers that do not merge (quantized ones from T = 2) and
    stay unjudged."""
    cfg = layer_config(SHARED_JUDGE, dtype, dry)
    with configs.override(FUSED):
        Ts = [A for A in As if not (cfg.shared_intermediate_size == cfg.intermediate_size and
                                    configs.merges_shared(A, cfg.top_k, cfg.quantization,
                                                          cfg.num_experts))]
    return layers_for(cfg, 1 if dry else weight_sets(cfg, 1), device), Ts


def judge(table: dict, layer: list[dict], dropped: list, alts: dict | None = None,
          committed: dict | None = None) -> None:
    """Each row of ``table`` that layer rows ran with: PDL where the layer was faster with it by
    more than the timing's noise (0.5%); the key's row in ``alts`` (layer rows "alt_us",
    "alt_pdl_us") in its place where the layer was faster with it, PDL as chosen, by over that
    noise; and the row dropped (its bucket takes the untuned tiles) unless the layer was faster
    with the row kept, PDL as chosen, by over KEEP_MARGIN. Where ``committed`` (the table before
    the run) has a row for the key that this verdict would change (tiles, PDL bit or a drop;
    layer rows "committed_us"), the change stands only if the layer was faster with it than
    with the committed row by over KEEP_MARGIN; else the committed row stays. One timing's
    verdicts are noisy at 1%: against the untuned tiles alone, H100 retunes dropped rows and
    took tiles whose loss in the layer probe_device_rows.py then measured in every round
    (Scout TP8 bf16: A = 16..64 dropped 1.004-1.014x, T = 1's merged A = 2 row 1.018x;
    results/probe_device_rows_12ab863.json, _29e5976.json). A row several T share (a merged
    shared expert's T + 1 pairs) is judged on their sums. A GEMM alone can be faster under a
    tile that makes the layer slower (the kernels overlap under PDL, and the router runs
    before them), or slower under one that makes it faster (fp8 rowwise's one-pair down on
    fp32 rows spares gate_up its m-tile's arrival)."""
    labels = ("tuned", "tuned_pdl", "untuned", "alt", "alt_pdl", "committed")
    optional = ("alt", "alt_pdl", "committed")  # NaN where a layer row lacks them: never taken
    sums: dict = {}
    for r in layer:
        acc = sums.setdefault(r["key"], dict.fromkeys(labels, 0.0) | dict(Ts=[]))
        for lab in labels:
            acc[lab] += r.get(f"{lab}_us", math.nan if lab in optional else 0.0)
        acc["Ts"].append(r["T"])
    verdict = {}
    for key, acc in sums.items():
        if key not in table:
            verdict[key] = ("no row", False)
            continue
        row, kind = table[key], "kept"
        use_pdl = bool(acc["tuned_pdl"] < 0.995 * acc["tuned"])
        best = min(acc["tuned"], acc["tuned_pdl"])
        alt_best = min(acc["alt"], acc["alt_pdl"])  # NaN without an alt row: never taken
        if key in (alts or {}) and alt_best < 0.995 * best:
            row, kind, best = alts[key], "kept: alt", alt_best
            use_pdl = bool(acc["alt_pdl"] < 0.995 * acc["alt"])
        drop = bool(best > (1 - KEEP_MARGIN) * acc["untuned"])  # NaN (dry run): kept
        before = (committed or {}).get(key)
        change = None if drop else (*row[:2], use_pdl)
        if (before is not None and change != before
                and acc["committed"] * (1 - KEEP_MARGIN) <= (acc["untuned"] if drop else best)):
            table[key], verdict[key] = before, ("kept: committed", before[2])  # NaN: changed
        elif drop:
            table.pop(key)
            dropped.append(dict(key=str(key), T=acc["Ts"], tuned_us=best,
                                untuned_us=acc["untuned"], row=row))
            verdict[key] = ("dropped", False)
        else:
            table[key] = change
            verdict[key] = (kind, use_pdl)
    for r in layer:
        r["row"], r["pdl"] = verdict[r["key"]]


def keep_unjudged(table: dict, committed: dict, swept, layer: list[dict]) -> list[dict]:
    """Swept keys no layer row read (a merged shared expert's T reads A + T pairs, so Maverick's
    A = 1 serves only layers that do not merge; or the layer phase ran out of time) keep their
    committed row: one GEMM timed alone is no evidence that the layer is faster with new tiles
    (judge). Keys without a committed row keep the sweep's. Returns what was kept."""
    read = {r["key"] for r in layer}
    kept = []
    for key in dict.fromkeys(swept):
        if key not in read and key in committed and table.get(key) != committed[key]:
            kept.append(dict(key=str(key), swept=table.get(key), committed=committed[key]))
            table[key] = committed[key]
    return kept


def drop_stale(table: dict, named: set, dropped: list, every_preset: bool = True) -> None:
    """Rows of the formats this run covers (and of its GPU's SM count; with some presets only,
    of their shapes) that no case names: a case the script no longer runs (the shared expert of
    a quantized layer, which runs in x's dtype) leaves rows nothing judges."""
    part = (lambda k: (k[0], k[4])) if every_preset else (lambda k: k[:5])  # noqa: E731
    covered = {part(k) for k in named}
    for key in [k for k in table if part(k) in covered and k not in named]:
        dropped.append(dict(key=str(key), T=[], tuned_us=math.nan, untuned_us=math.nan,
                            row=table.pop(key), why="no case"))


# ------------------------------------------------------------------------------------- main

PROVENANCE_AFTER = "GPU, read first there"  # tuned.py's docstring: what the tables are, then runs


def skipped_text(skipped: list[dict]) -> str:
    """What a run's deadlines left out, for its provenance line ("" when nothing)."""
    parts = {"time": [], "layer": []}
    for s in skipped:
        name, dtype, which = s["case"]
        unit = "T" if s["phase"] == "layer" else "A"
        parts[s["phase"]].append(f"{name} {dtype}" + (
            "" if isinstance(which, list) else f" {unit} = {which}"))
    text = "; ".join(f"{what}: {', '.join(cases)}" for what, cases in (
        ("not swept (out of time)", parts["time"]),
        ("not judged in the layer (out of time)", parts["layer"])) if cases)
    return f" {text[0].upper()}{text[1:]}." if text else ""


def table_source(base: dict, by_device: dict, meta: dict, stem: str, dtypes: tuple[str, ...],
                 layer_only: bool, own: str = "", results: str = "benchmarks/results",
                 presets: tuple[str, ...] = tuple(PRESETS), skipped: list[dict] = ()) -> str:
    """tuned.py for the tables ``base`` (TABLE) and ``by_device`` (BY_DEVICE), the run having
    written ``own``'s rows ("": the base table's). Its provenance replaces the lines of the
    runs it supersedes: a full run of the base table every base line, of a GPU's rows that
    GPU's lines; a --layer-only, --dtypes or --presets run the lines of the same kind of run
    on the same table. Every other line stays."""
    run = (f"{meta.get('device')} (torch {meta.get('torch')}, triton {meta.get('triton')}), "
           f"commit {meta.get('commit')}, run {meta.get('run_id')}: {results}/{stem}.md."
           + skipped_text(skipped))
    prefix = f"BY_DEVICE[{own!r}]: " if own else ""
    if stem == "tune_decode":
        what, text = prefix, f"{prefix}{'s' if own else 'S'}wept on {run}"
    else:
        rows = (", ".join("bf16" if d == "bf16" else DTYPES[d] for d in dtypes)
                if dtypes != tuple(DTYPES) else "every format")
        if presets != tuple(PRESETS):
            rows += f" for {', '.join(presets)}"
        flags = "--dtypes, --presets" if presets != tuple(PRESETS) else "--dtypes"
        what = prefix + (f"Rows of {rows} judged in the layer (--layer-only)" if layer_only
                         else f"Rows of {rows} swept ({flags})")
        text = f"{what} on {run}"
    from shufflemoe.ops.moe_decode import tuned

    doc = tuned.__doc__.strip().splitlines()
    cut = next(i for i, ln in enumerate(doc) if ln.startswith(PROVENANCE_AFTER)) + 1
    head, kept, dropping = doc[:cut], [], False
    for ln in doc[cut:]:
        if not ln.startswith("  "):  # a run's first line; its continuations are indented
            dropping = (not ln.startswith("BY_DEVICE[") if what == "" else ln.startswith(what))
        if not dropping:
            kept.append(ln)
    measured = kept + textwrap.wrap(text, 96, subsequent_indent="  ")
    row_type = "dict[tuple, tuple[tuple[int, ...], tuple[int, ...], bool]]"
    lines = ['"""' + head[0], *head[1:], *measured, '"""', "",
             f"BASE_DEVICE = {tuned.BASE_DEVICE!r}", "", f"TABLE: {row_type} = {{"]
    lines += [f"    {key!r}: {base[key]!r}," for key in sorted(base, key=str)]
    lines += ["}", "", f"BY_DEVICE: dict[str, {row_type}] = {{"]
    for name in sorted(by_device):
        lines.append(f"    {name!r}: {{")
        lines += [f"        {key!r}: {by_device[name][key]!r},"
                  for key in sorted(by_device[name], key=str)]
        lines.append("    },")
    lines.append("}")
    return "\n".join(lines) + "\n"


def fields(g: configs.GemmConfig) -> tuple[int, ...]:
    return (g.block_n, g.block_k, g.split_k, g.num_warps, g.num_stages, g.block_m)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, type=pathlib.Path)
    p.add_argument("--budget", type=float, default=540.0, help="seconds for all phases")
    p.add_argument("--workers", type=int, default=10, help="compile processes")
    p.add_argument("--layer-only", action="store_true",
                   help="keep the table's tiles, judge them in the layer only (PDL, kept or not)")
    p.add_argument("--dry-run", action="store_true",
                   help="CPU, Triton interpreter, tiny shapes, no timing (CI)")
    p.add_argument("--dtypes", default=",".join(DTYPES),
                   help=f"which of {list(DTYPES)} to sweep; the others' rows stay as committed")
    p.add_argument("--presets", default=",".join(PRESETS),
                   help=f"which of {list(PRESETS)} to sweep (the Llama 4 layers' rows use the "
                        "shared expert's); the others' rows stay as committed")
    p.add_argument("--results", default="benchmarks/results",
                   help="the folder the results are committed to (tuned.py names it)")
    p.add_argument("--as-device", default=None,
                   help="write the rows as this GPU's (BY_DEVICE; default: the GPU's own name, "
                        "the base table on tuned.BASE_DEVICE and in a dry run)")
    args = p.parse_args(argv)
    dtypes = tuple(d for d in DTYPES if d in args.dtypes.split(","))
    if not dtypes or len(dtypes) != len(args.dtypes.split(",")):
        raise SystemExit(f"--dtypes must name some of {list(DTYPES)}, got {args.dtypes!r}")
    presets = tuple(n for n in PRESETS if n in args.presets.split(","))
    if not presets or len(presets) != len(args.presets.split(",")):
        raise SystemExit(f"--presets must name some of {list(PRESETS)}, got {args.presets!r}")
    partial = dtypes != tuple(DTYPES) or presets != tuple(PRESETS)
    dry, start = args.dry_run, time.monotonic()
    if not dry and not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU (or --dry-run)")
    device = "cpu" if dry else "cuda"
    deadline = {k: start + v * args.budget for k, v in SHARES.items()}
    from shufflemoe.bench.report import metadata

    meta = dict(metadata(), device="cpu (dry run)" if dry else torch.cuda.get_device_name())
    gpu = args.as_device if args.as_device is not None else "" if dry else meta["device"]
    own = "" if gpu == configs.BASE_DEVICE else gpu  # whose rows the run writes ("": TABLE's)
    committed_base, committed_own = dict(configs.TABLE), dict(configs.BY_DEVICE.get(own, {}))
    rows: dict = {k: [] for k in ("compile", "sweep", "layer", "dropped", "unjudged", "skipped",
                                  "errors")}
    read_gbps = float("nan")
    if not dry:
        from shufflemoe.bench.ceilings import measure_ceilings

        ceilings = measure_ceilings().as_dict()
        read_gbps = ceilings["read_gbps"]
    else:
        ceilings = {}
    jobs = cases(dry, dtypes, presets)
    t0 = time.monotonic()
    if args.layer_only:  # the committed tiles, judged in the layer only
        deadline = {k: start + (0 if k != "layer" else args.budget) for k in SHARES}
    rows["compile"] = ([] if args.layer_only else
                       compile_all(jobs, args.workers, deadline["compile"], dry, own))
    failed = {tuple(r["case"]): r["failed"] for r in rows["compile"]}
    print(f"compiled {sum(r['ran'] for r in rows['compile'])} candidate runs in "
          f"{time.monotonic() - t0:.0f} s; failures: "
          f"{sum(len(f) for f in failed.values())}", flush=True)
    committed = committed_own if own else committed_base
    table: dict = dict(committed) if args.layer_only or partial else {}
    named: set = set()  # the keys of every case
    alts: dict = {}  # key -> a second row the layer judges: down one-pair on fp32 rows (sweep)
    with use_impl("triton"):
        by_layer: dict = {}
        for name, dtype, A in jobs:
            by_layer.setdefault((name, dtype), []).append(A)
        for (name, dtype), As in by_layer.items():
            if time.monotonic() > deadline["layer" if args.layer_only else "time"]:
                rows["skipped"].append(dict(phase="time", case=[name, dtype, As]))
                continue
            try:
                cfg = layer_config(name, dtype, dry)
                layers = layers_for(cfg, 1 if dry else weight_sets(cfg, 1), device)
                w = layers[0].expert_weights.w13
                key_of = lambda A: configs.table_key(  # noqa: E731
                    A, cfg.num_experts, cfg.hidden_size, cfg.intermediate_size, w.dtype,
                    kernel.sm_count(w.device), quant=cfg.quantization)
                named.update(key_of(A) for A in As)
                for A in As:
                    if time.monotonic() > deadline["time"]:
                        if not args.layer_only:
                            rows["skipped"].append(dict(phase="time", case=[name, dtype, A]))
                        continue
                    case = Case(name, dtype, A, layers, device, 2 if dry else N_INPUTS)
                    best, alt = {}, {}
                    for gemm in ("gate_up", "down"):
                        best[gemm], alt[gemm] = sweep(case, gemm, failed.get((name, dtype, A), {}),
                                                      dry, rows, own)
                    table[key_of(A)] = (fields(best["gate_up"].gate_up),
                                        fields(best["down"].down), False)
                    if alt["down"] is not None:
                        alts[key_of(A)] = (table[key_of(A)][0], fields(alt["down"].down), False)
                    del case
                # the layer rows below run with the new entries
                (configs.BY_DEVICE.setdefault(own, {}) if own else configs.TABLE).update(table)
                configs.table_changed()
                judge_layers, Ts, label = layers, sorted({A // cfg.top_k for A in As}), name
                if name.startswith("llama4-shared"):  # judged where a Llama 4 layer runs it
                    judge_layers, Ts = shared_judge(dtype, dry, device, As)
                    label = f"{name} in {SHARED_JUDGE}"
                done = []
                for T in Ts:
                    if time.monotonic() > deadline["layer"]:
                        rows["skipped"].append(dict(phase="layer", case=[name, dtype, T]))
                        continue
                    r = layer_rows(judge_layers, label, dtype, T, device, dry, read_gbps, key_of,
                                   own, alts, committed)
                    done.append(r)
                    print(f"layer {label} {dtype} T={T}: tuned {r['tuned_us']:.1f} us "
                          f"({r['tuned_pct_read']:.0f}%), with PDL {r['tuned_pdl_us']:.1f}, "
                          f"untuned {r['untuned_us']:.1f} "
                          f"({r['untuned_pct_read']:.0f}%), unfused {r['unfused_us']:.1f} "
                          f"({r['unfused_pct_read']:.0f}%)", flush=True)
                rows["layer"] += done
                judge(table, done, rows["dropped"], alts, committed)
                rows["unjudged"] += keep_unjudged(table, committed, map(key_of, As), done)
                del layers, judge_layers
            except Exception as e:  # a failing preset must not cost the rest of the call
                rows["errors"].append(dict(where=f"{name} {dtype}", error=f"{type(e).__name__}: "
                                           f"{e}"[:1000], trace=traceback.format_exc()[-1500:]))
                print(f"ERROR {name} {dtype}: {type(e).__name__}: {str(e)[:300]}", flush=True)
            if not dry:
                torch.cuda.empty_cache()
    if not rows["errors"] and not rows["skipped"]:
        drop_stale(table, named, rows["dropped"], presets == tuple(PRESETS))
    for r in rows["layer"]:
        r["key"] = str(r["key"])
    result = dict(meta=meta, ceilings=ceilings, table={str(k): v for k, v in table.items()},
                  table_of=own or "base", **rows)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = ("tune_decode_pdl" if args.layer_only else "tune_decode") + "".join(
        f"_{d}" for d in dtypes) * partial + "".join(
        f"_{n}" for n in presets) * (presets != tuple(PRESETS))
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1, default=str))
    by_device = {**{k: v for k, v in configs.BY_DEVICE.items() if k != own},
                 **({own: table} if own else {})}
    (args.out / "tuned.py").write_text(table_source(
        committed_base if own else table, by_device, meta, stem, dtypes, args.layer_only, own,
        args.results, presets, rows["skipped"]))
    (args.out / f"{stem}.md").write_text(markdown(result))
    print(markdown(result), flush=True)
    return result


def sweep(case: Case, gemm: str, failed: dict, dry: bool, rows: dict,
          gpu: str = "") -> configs.DecodeConfig:
    """Every candidate of one GEMM checked then timed; the 3 fastest timed again; the best."""
    fn, n = case.fn(gemm), case.n
    cands = candidates(gemm, case.A, case.cfg, case.w_dtype, case.sms, dry, gpu)
    timed: list[tuple[float, str]] = []
    fp32_rows = []  # down's candidates that quantize a's fp32 rows themselves
    for lab, cand in cands.items():
        if f"{gemm} {lab}" in failed:
            continue
        try:
            case.check(gemm, cand)
            with configs.override(cand):
                if gemm == "down" and case.quantizes_in_down():
                    fp32_rows.append(lab)
                # dry run: the one-pair tiles on fp32 rows rank last, so an alt row is judged
                us = float(lab in fp32_rows) if dry else time_us(fn, n, 10)
                if dry:
                    fn(0)
            timed.append((us, lab))
        except Exception as e:
            rows["errors"].append(dict(where=f"{case.name} {case.dtype} A={case.A} {gemm} {lab}",
                                       error=f"{type(e).__name__}: {e}"[:500]))
    first = dict((lab, us) for us, lab in timed)
    final = {lab: (first[lab] if dry else None) for _, lab in sorted(timed)[:3]}
    for lab in final:
        if not dry:
            with configs.override(cands[lab]):
                final[lab] = time_us(fn, n, 40)
    best = min(final, key=final.get) if final else "untuned"
    base = final.get("untuned", first.get("untuned"))
    # the fastest one-pair candidate on fp32 rows, where the best is an MMA tile: its gate_up
    # stores a unquantized and skips the m-tile's arrival, which this GEMM's timing cannot see,
    # so the layer judges it beside the best (layer_rows' "alt")
    alt = (min((lab for lab in fp32_rows if lab in first), key=first.get)
           if best not in fp32_rows and any(lab in first for lab in fp32_rows) else None)
    nbytes = case.nbytes(gemm)
    rows["sweep"].append(dict(
        preset=case.name, dtype=case.dtype, A=case.A, gemm=gemm, best=best,
        best_us=final.get(best), untuned_us=base, retimed=final,
        first_pass={lab: round(us, 2) for lab, us in first.items()}, a_fp32=fp32_rows,
        alt=alt, weight_mb=nbytes / 1e6, active_experts=case.active))
    if not dry:
        print(f"{case.name} {case.dtype} A={case.A} {gemm}: best {best} {final.get(best)} us, "
              f"untuned {base} us ({len(timed)} candidates)"
              + (f"; one-pair on fp32 rows {alt} {first[alt]} us" if alt else ""), flush=True)
    return cands[best], (cands[alt] if alt else None)


def markdown(result: dict) -> str:
    m = result["meta"]
    read = result["ceilings"].get("read_gbps")
    out = ["# tune_decode", "",
           f"{m.get('device')}, torch {m.get('torch')}, triton {m.get('triton')}, commit "
           f"{m.get('commit')}, run {m.get('run_id')}, {m.get('date')}; read ceiling "
           f"{read} GB/s", "",
           ("Rows written: TABLE (the base table); untuned = the heuristic." if
            result.get("table_of", "base") == "base" else
            f"Rows written: BY_DEVICE[{result['table_of']!r}]; untuned = what that GPU runs "
            "without them (the base table's rows, else the heuristic)."), "",
           "## Each GEMM alone (CUDA-graph replays, median us; % of the read ceiling for its "
           "weight bytes)", "",
           "| preset | dtype | A | GEMM | best | us | % read | untuned us | % read | x |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["sweep"]:
        b, h = r["best_us"], r["untuned_us"]
        # MB per us is 1000 GB/s
        pct = (lambda us: 1e5 * r["weight_mb"] / us / read if us and read else float("nan"))
        out.append(f"| {r['preset']} | {r['dtype']} | {r['A']} | {r['gemm']} | {r['best']} | "
                   f"{b or float('nan'):.1f} | {pct(b):.0f} | {h or float('nan'):.1f} | "
                   f"{pct(h):.0f} | {(h / b) if b and h else float('nan'):.2f} |")
    out += ["", "## The layer (CUDA-graph replays, median us; % of the read ceiling for the "
            "bytes the routing activates)", "",
            "| preset | dtype | T | fused, table | % | with PDL | % | alt (with PDL) | "
            "committed | row | PDL | fused, untuned | % | unfused | % |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["layer"]:
        alt = (f"{r['alt_us']:.1f} ({r['alt_pdl_us']:.1f})" if "alt_us" in r else "")
        before = f"{r['committed_us']:.1f}" if "committed_us" in r else ""
        out.append(f"| {r['preset']} | {r['dtype']} | {r['T']} | {r['tuned_us']:.1f} | "
                   f"{r['tuned_pct_read']:.1f} | {r['tuned_pdl_us']:.1f} | "
                   f"{r['tuned_pdl_pct_read']:.1f} | {alt} | {before} | {r['row']} | {r['pdl']} | "
                   f"{r['untuned_us']:.1f} | "
                   f"{r['untuned_pct_read']:.1f} | {r['unfused_us']:.1f} | "
                   f"{r['unfused_pct_read']:.1f} |")
    out += ["", "alt: the key's best down among the one-pair tiles on a's fp32 rows, with the "
            "best gate_up (fp8 rowwise, where the best down alone is an MMA tile); row "
            "'kept: alt' took it. committed: the row the table held before this run; 'kept: "
            f"committed' where no change made the layer {KEEP_MARGIN:.0%} faster than it."]
    out += ["", f"Rows dropped (the layer was not {KEEP_MARGIN:.0%} faster with them than with "
            "the untuned tiles, or no case names them): "
            + ("; ".join(d.get("why") and f"{d['key']}: {d['why']}" or
                         f"{d['key']} at T = {d['T']}: {d['tuned_us']:.1f} vs {d['untuned_us']:.1f} us"
                         for d in result["dropped"]) or "none")]
    out += ["", "Rows no layer case read, kept as committed (the sweep's tiles in brackets): "
            + ("; ".join(f"{d['key']} [{d['swept']}]" for d in result.get("unjudged", []))
               or "none")]
    out += ["", f"errors: {len(result['errors'])}; skipped: {result['skipped']}"]
    out += [f"- {e['where']}: {e['error'][:200]}" for e in result["errors"][:10]]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
