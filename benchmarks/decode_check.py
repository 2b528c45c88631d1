"""Fused decode kernels on one GPU in one call (<= 6 minutes on an H100): check, time, sweep.

    PYTHONPATH=src python benchmarks/decode_check.py --out $OUT [--budget 300]
    PYTHONPATH=src python benchmarks/decode_check.py --dry-run --out /tmp/x   (CPU, interpreter)

1. ceilings measured now: read bandwidth (the faster of a sum and a max over 2 GiB: bytes read only), device copy
   (read + write), dense cuBLAS bf16 / fp8 (bench.ceilings.measure_ceilings);
2. checks: the layer with the fused path forced on (FUSED) against the float64
   naive_moe, for Llama 4 Scout TP8, Maverick TP8, Qwen3-30B-A3B, Mixtral TP2, bf16 and fp8,
   T = 1, 2, 4, 8, 64 (T = 64 checks the kernels above the default switch too);
3. decode: the layer per T, fused path vs the current seven-launch path (configs.NEVER),
   CUDA-graph replays rotating through weight sets and inputs (each call routes differently,
   nothing stays in L2), as % of the read ceiling for the bytes the routing activates (active
   experts + shared expert + router: planner.must_read_bytes);
4. sweep: split-K factors, then tile shapes, of each fused GEMM alone (T = 1, 8), against the
   heuristic's choice; programmatic dependent launch on / off for the fused layer;
5. prefill (T = 16384, Scout and Maverick TP8, bf16 and fp8): the layer with each grouped-GEMM
   candidate (grouped_gemm.configs.PREFILL_CANDIDATES), with the shared expert on its side
   stream, and through the fused kernels with 64- and 128-row tiles (Llama 4 is top-1), as % of
   dense cuBLAS doing the same FLOPs in the same precisions.
Every row is checked before it is timed where it has its own output; sections stop at their
time budget and say what they skipped. Writes $OUT/decode_check.json and ends with a short table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import sys
import time
import traceback
from dataclasses import dataclass, field, replace

if "--dry-run" in sys.argv and not os.environ.get("TRITON_INTERPRET"):
    os.environ["TRITON_INTERPRET"] = "1"  # before triton decorates any kernel

import torch  # noqa: E402

from shufflemoe import MoE, naive_moe, preset  # noqa: E402
from shufflemoe.ops import (decode_down, decode_gate_up, dequantize_fp8_rowwise,  # noqa: E402
                            use_impl)
from shufflemoe.ops._common import device_name  # noqa: E402
from shufflemoe.ops.grouped_gemm import configs as gg_configs  # noqa: E402
from shufflemoe.ops.moe_decode import configs, kernel  # noqa: E402
from shufflemoe.planner import must_read_bytes  # noqa: E402
from shufflemoe.testing import compare, tolerance_key  # noqa: E402

PRESETS = {
    "scout-tp8": preset("llama4-scout", tp=8),
    "maverick-tp8": preset("llama4-maverick", tp=8),
    "qwen3-30b-a3b": preset("qwen3-30b-a3b"),
    "mixtral-tp2": preset("mixtral-8x7b", tp=2),
}
DECODE_T = (1, 2, 4, 8, 64)
SWEEP_T = (1, 8)
PREFILL_T = 16384
# the fused path at every A and format, a shared expert merged where the default Switch merges
# it (ALWAYS, for tests, also merges a quantized layer's at T = 2: a second change at that T)
FUSED = replace(configs.ALWAYS, **{
    f: getattr(configs.Switch(), f) for f in ("shared_quantized_max_tokens",
                                              "shared_quantized_formats")})
UNFUSED = configs.NEVER
N_INPUTS = 8  # input batches rotated through per timing (each routes differently)


@dataclass
class Run:
    dry: bool
    start: float  # time.monotonic() at the start
    budget: float  # seconds for everything
    device: str
    read_gbps: float = float("nan")
    rows: dict = field(default_factory=lambda: {k: [] for k in (
        "checks", "decode", "pdl", "sweep", "prefill", "skipped", "errors")})

    def deadline(self, phase: str) -> float:
        """When a phase must stop: decode (checks, timings, PDL) by 55% of the budget, the
        sweep by 75%, prefill at the end."""
        return self.start + self.budget * {"decode": 0.55, "sweep": 0.75, "prefill": 1.0}[phase]

    def n_inputs(self) -> int:
        return 2 if self.dry else N_INPUTS

    def limit(self, items: list, n: int) -> list:
        """The dry run exercises the first n items of a list, the GPU run all."""
        return items[:n] if self.dry else items


# ---------------------------------------------------------------------------------- helpers

def tiny(cfg):
    """The dry run's stand-in for a preset: same router and k, widths a CPU can interpret."""
    E = min(cfg.num_experts, 16)
    return cfg.replace(hidden_size=64, intermediate_size=32, num_experts=E,
                       top_k=min(cfg.top_k, E), shared_intermediate_size=(
                           32 if cfg.shared_intermediate_size else 0))


def timed(run: Run, fn, n_sets: int, reps: int = 30) -> float:
    """Median us of one fn(i) over CUDA-graph replays of all n_sets; the dry run calls each once
    (no timing on the CPU) and returns NaN."""
    if run.dry:
        for i in range(n_sets):
            fn(i)
        return float("nan")
    from shufflemoe.bench.timing import time_fn

    return time_fn(fn, n_sets, graph=True, reps=reps).median_us


def layers_for(cfg, n: int, device: str) -> list[MoE]:
    """n layers with independent random weights (rotated through, so weights come from HBM)."""
    out = []
    for i in range(n):
        torch.manual_seed(i)
        out.append(MoE(cfg, device=device))
    return out


def weight_sets(cfg, T_min: int) -> int:
    """Weight sets to rotate so one pass reads over 2x the L2 at the smallest T."""
    from shufflemoe.bench.timing import rotations

    active = min(cfg.num_experts, T_min * cfg.top_k)
    return rotations(int(must_read_bytes(cfg, active)), cap=4)


def inputs(cfg, T: int, device: str, n: int) -> list[torch.Tensor]:
    g = torch.Generator(device="cpu").manual_seed(1000 + T)
    return [torch.randn(T, cfg.hidden_size, generator=g).to(device, cfg.dtype) for _ in range(n)]


def section(run: Run, phase: str, items):
    """Yield items until the phase's deadline; record the rest as skipped."""
    items = list(items)
    for i, item in enumerate(items):
        if time.monotonic() > run.deadline(phase):
            run.rows["skipped"].append(dict(phase=phase, items=[str(x) for x in items[i:]]))
            print(f"[{phase}] out of time: skipped {len(items) - i} of {len(items)}", flush=True)
            return
        yield item


def free() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def guarded(run: Run, where: str, fn):
    """fn() or, on an exception, a recorded error (the other rows still run)."""
    try:
        return fn()
    except Exception as e:  # a failing row must not cost the rest of the GPU call
        run.rows["errors"].append(dict(where=where, error=f"{type(e).__name__}: {e}"[:2000],
                                       trace=traceback.format_exc(limit=4)[-2000:]))
        print(f"ERROR {where}: {type(e).__name__}: {str(e)[:300]}", flush=True)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return None


def pct_read(run: Run, nbytes: float, us: float) -> float:
    return 100 * nbytes / us / 1e3 / run.read_gbps


# --------------------------------------------------------------------------------- sections

def measure_read_gbps(run: Run) -> dict:
    from shufflemoe.bench.ceilings import measure_ceilings

    ceil = measure_ceilings()
    run.read_gbps = ceil.read_gbps
    return ceil.as_dict()


def check_layer(run: Run, name: str, layer: MoE, dtype: str, T: int) -> None:
    """The layer with the fused path forced on against naive_moe (float64)."""
    x = inputs(layer.config, T, run.device, 1)[0]
    r = layer.route(x)
    ref, mag = naive_moe(layer, x, r, with_magnitude=True)
    with configs.override(FUSED):
        y = layer(x)
    c = compare(y, ref, tolerance_key(layer.config), magnitude=mag)
    run.rows["checks"].append(dict(preset=name, dtype=dtype, T=T, ok=c.ok, why=c.why,
                                   max_err_over_rms=c.max_err_over_rms))
    print(f"check {name} {dtype} T={T}: {'ok' if c.ok else 'FAILED ' + c.why}", flush=True)


def decode_rows(run: Run, name: str, layers: list[MoE], dtype: str, T: int) -> None:
    """Fused vs unfused layer at T tokens, CUDA-graph replays over rotating weights and inputs."""
    cfg = layers[0].config
    xs = inputs(cfg, T, run.device, run.n_inputs())
    active = sum(int((layers[i % len(layers)].route(x).counts > 0).sum())
                 for i, x in enumerate(xs)) / len(xs)
    nbytes = must_read_bytes(cfg, active)
    fused = configs.use_fused(T * cfg.top_k, cfg.top_k, cfg.quantization, cfg.num_experts,
                              device=device_name(xs[0].device))
    row = dict(preset=name, dtype=dtype, T=T, A=T * cfg.top_k, active_experts=active,
               must_read_mb=nbytes / 1e6, default="fused" if fused else "unfused")
    for label, switch in (("fused", FUSED), ("unfused", UNFUSED)):
        with configs.override(switch):
            us = timed(run, lambda i: layers[i % len(layers)](xs[i]), len(xs))
        row[f"{label}_us"] = us
        row[f"{label}_pct_read"] = pct_read(run, nbytes, us)
    row["speedup"] = row["unfused_us"] / row["fused_us"]
    run.rows["decode"].append(row)
    print(f"decode {name} {dtype} T={T}: fused {row['fused_us']:.1f} us "
          f"({row['fused_pct_read']:.0f}% of read) unfused {row['unfused_us']:.1f} us "
          f"({row['unfused_pct_read']:.0f}%)", flush=True)


def sweep_candidates(base: configs.DecodeConfig, which: str, k_steps: int) -> dict:
    """Named DecodeConfigs that change one GEMM: every split (1..16, up to its K steps), then
    tile shapes at the heuristic's split."""
    gemm: configs.GemmConfig = getattr(base, which)
    out = {"heuristic": base}
    for split in (1, 2, 4, 8, 16):
        if split <= k_steps and split != gemm.split_k:
            out[f"split={split}"] = base.with_(**{which: gemm.with_(split_k=split)})
    for bn, bk_mult, stages in ((32, 1, 3), (64, 1, 4), (64, 2, 2), (128, 1, 3)):
        tile = gemm.with_(block_n=bn, block_k=gemm.block_k * bk_mult, num_stages=stages)
        if tile != gemm:
            out[f"{bn}x{tile.block_k} s{stages}"] = base.with_(**{which: tile})
    return out


def dequant(a) -> torch.Tensor:
    """fp8 (q, scale) rows as float32; other tensors as they are."""
    return dequantize_fp8_rowwise(*a) if isinstance(a, tuple) else a


def sweep_rows(run: Run, name: str, layers: list[MoE], dtype: str, T: int) -> None:
    """Each fused GEMM alone under each candidate (the routing of each input fixed), every
    candidate first checked against the torch reference on input 0."""
    cfg = layers[0].config
    xs = inputs(cfg, T, run.device, run.n_inputs())
    n = len(xs)
    on_input = cfg.apply_router_weight_on_input
    routes = [layers[i % len(layers)].route(x) for i, x in enumerate(xs)]
    ws = [layers[i % len(layers)].expert_weights for i in range(n)]

    def gate_up(i, impl=None):
        r = routes[i]
        return decode_gate_up(xs[i], ws[i].w13, r.counts, r.token_ids,
                              r.weights if on_input else None, w13_scale=ws[i].w13_scale,
                              impl=impl)

    def down(i, a, out, impl=None):
        r = routes[i]
        decode_down(a, ws[i].w2, r.counts, r.token_ids, r.positions, out,
                    None if on_input else r.weights, w2_scale=ws[i].w2_scale, impl=impl)
        return out

    want_a = gate_up(0, "torch")
    want = down(0, want_a, torch.zeros_like(xs[0]), "torch")

    def check(cand: configs.DecodeConfig) -> None:
        with configs.override(cand):
            got_a = gate_up(0)
            got = down(0, want_a, torch.zeros_like(xs[0]))
        for part, a, b, tol in (("gate_up", got_a, want_a, tolerance_key(cfg)),
                                ("down", got, want, str(cfg.dtype).replace("torch.", ""))):
            c = compare(dequant(a), dequant(b).double(), tol)
            if not c.ok:
                raise AssertionError(f"{part} wrong under {cand}: {c.why}")

    acts = [gate_up(i) for i in range(n)]
    outs = [torch.zeros_like(x) for x in xs]
    E, D, I = cfg.num_experts, cfg.hidden_size, cfg.intermediate_size
    w_dtype = ws[0].w13.dtype
    base = configs.select(T * cfg.top_k, E, D, I, w_dtype, kernel.sm_count(xs[0].device))
    active = sum(int((r.counts > 0).sum()) for r in routes) / n
    esize = 1 if w_dtype == torch.float8_e4m3fn else 2
    for which, fn, K, nbytes in (
            ("gate_up", gate_up, D, active * 2 * I * D * esize),
            ("down", lambda i: down(i, acts[i], outs[i]), I, active * D * I * esize)):
        cands = sweep_candidates(base, which, -(-K // getattr(base, which).block_k))
        for label, cand in section(run, "sweep", run.limit(list(cands.items()), 2)):
            def one():
                check(cand)
                with configs.override(cand):
                    return timed(run, fn, n)
            us = guarded(run, f"sweep {name} {dtype} T={T} {which} {label}", one)
            if us is None:
                continue
            g = getattr(cand, which)
            run.rows["sweep"].append(dict(
                preset=name, dtype=dtype, T=T, gemm=which, candidate=label, block_n=g.block_n,
                block_k=g.block_k, split_k=g.split_k, num_stages=g.num_stages, us=us,
                pct_read=pct_read(run, nbytes, us)))
        best = min((r for r in run.rows["sweep"] if (r["preset"], r["dtype"], r["T"], r["gemm"])
                    == (name, dtype, T, which)), key=lambda r: r["us"], default=None)
        if best is not None:
            print(f"sweep {name} {dtype} T={T} {which}: best {best['candidate']} "
                  f"{best['us']:.1f} us ({best['pct_read']:.0f}% of read)", flush=True)


def pdl_rows(run: Run, name: str, layers: list[MoE], dtype: str, T: int) -> None:
    cfg = layers[0].config
    xs = inputs(cfg, T, run.device, run.n_inputs())
    base = configs.select(T * cfg.top_k, cfg.num_experts, cfg.hidden_size,
                          cfg.intermediate_size, layers[0].w13.dtype,
                          kernel.sm_count(xs[0].device))
    row = dict(preset=name, dtype=dtype, T=T)
    for label, pdl in (("off", False), ("on", True)):
        with configs.override(FUSED), configs.override(base.with_(pdl=pdl)):
            row[f"pdl_{label}_us"] = timed(run, lambda i: layers[i % len(layers)](xs[i]), len(xs))
    run.rows["pdl"].append(row)
    print(f"pdl {name} {dtype} T={T}: off {row['pdl_off_us']:.1f} us, on {row['pdl_on_us']:.1f} us",
          flush=True)


def dense_us(run: Run, T: int, D: int, flops: float, fp8: bool) -> float:
    """One dense cuBLAS GEMM [T, D] x [D, N] with N chosen for ``flops``, scaled to exactly it."""
    N = max(128, round(flops / (2 * T * D) / 128) * 128)
    a = torch.randn(T, D, device=run.device, dtype=torch.bfloat16)
    b = torch.randn(N, D, device=run.device, dtype=torch.bfloat16)
    if fp8:
        a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
        sa = torch.ones(T, 1, device=run.device)
        sb = torch.ones(1, N, device=run.device)
        us = timed(run, lambda i: torch._scaled_mm(a8, b8.t(), scale_a=sa, scale_b=sb,
                                                   out_dtype=torch.bfloat16), 1, reps=10)
    else:
        us = timed(run, lambda i: a @ b.t(), 1, reps=10)
    return us * 2 * T * D * N / flops


def prefill_variants(cfg, w_dtype: torch.dtype) -> dict:
    """name -> (context managers to enter, layer config) for one prefill timing."""
    out = {"heuristic": ((), cfg)}
    for name in gg_configs.PREFILL_CANDIDATES:
        out[name] = ((gg_configs.override(gg_configs.prefill_candidate(name, w_dtype)),), cfg)
    out["shared expert on side stream"] = ((), cfg.replace(shared_stream_max_tokens=1 << 30))
    if cfg.top_k == 1:  # the fused kernels' combine is a plain store for top-1
        bk = 128 if w_dtype == torch.float8_e4m3fn else 64
        for bm, bn, warps in ((64, 64, 4), (128, 128, 8)):
            g = configs.GemmConfig(bn, bk, 1, num_warps=warps, num_stages=3, block_m=bm)
            tiles = configs.DecodeConfig(g, g)
            out[f"fused kernels {bm}x{bn}"] = ((configs.override(FUSED),
                                                configs.override(tiles)), cfg)
    return out


_WEIGHTS = ("router_weight", "router_bias", "w13", "w2", "w13_scale", "w2_scale", "shared_w13",
            "shared_w2", "shared_gate")


def prefill_rows(run: Run, name: str, cfg, dtype: str, T: int) -> None:
    """The layer at T tokens under each variant (the same weights: from_weights shares them),
    its first 64 rows checked against naive_moe, against dense cuBLAS doing the same FLOPs."""
    torch.manual_seed(0)
    layer = MoE(cfg, device=run.device)
    weights = {k: getattr(layer, k) for k in _WEIGHTS if getattr(layer, k) is not None}
    D, I, Is = cfg.hidden_size, cfg.intermediate_size, cfg.shared_intermediate_size
    routed, other = 6 * T * D * I * cfg.top_k, 6 * T * D * Is + 2 * T * D * cfg.num_experts
    dense = dense_us(run, T, D, routed, cfg.quantized) + (dense_us(run, T, D, other, False)
                                                          if other else 0.0)
    xs = inputs(cfg, T, run.device, 2)
    head = xs[0][:64]
    ref, mag = naive_moe(layer, head, layer.route(head), with_magnitude=True)
    variants = list(prefill_variants(cfg, layer.w13.dtype).items())
    if run.dry:  # one of each kind
        kinds = {"heuristic", next(iter(gg_configs.PREFILL_CANDIDATES)), "fused kernels 64x64"}
        variants = [v for v in variants if v[0] in kinds]
    for label, (managers, layer_cfg) in section(run, "prefill", variants):
        def one():
            variant = MoE.from_weights(layer_cfg, **{k: v.data for k, v in weights.items()})
            with contextlib.ExitStack() as stack:
                for manager in managers:
                    stack.enter_context(manager)
                c = compare(variant(xs[0])[:64], ref, tolerance_key(layer_cfg), magnitude=mag)
                if not c.ok:
                    raise AssertionError(f"wrong result: {c.why}")
                return timed(run, lambda i: variant(xs[i]), len(xs), reps=10)
        us = guarded(run, f"prefill {name} {dtype} {label}", one)
        if us is None:
            continue
        tflops = (routed + other) / us / 1e6
        run.rows["prefill"].append(dict(preset=name, dtype=dtype, T=T, candidate=label, us=us,
                                        tflops=tflops, dense_us=dense,
                                        pct_dense=100 * dense / us))
        print(f"prefill {name} {dtype} {label}: {us:.0f} us, {tflops:.0f} TFLOP/s, "
              f"{100 * dense / us:.1f}% of dense cuBLAS ({dense:.0f} us)", flush=True)


# ------------------------------------------------------------------------------------- main

def summary(run: Run) -> list[str]:
    """The lines the lead reads last: decode table (target: >= 80% of the read ceiling at
    T <= 8, >= 92% at T >= 64), best sweep choices, PDL, prefill, checks, errors."""
    lines = ["", f"read ceiling {run.read_gbps:.0f} GB/s",
             "| preset | dtype | T | fused us | % read | unfused us | % read | x | target |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in run.rows["decode"]:
        goal = 80 if r["T"] <= 8 else 92
        met = "met" if r["fused_pct_read"] >= goal else f"<{goal}"
        lines.append(f"| {r['preset']} | {r['dtype']} | {r['T']} | {r['fused_us']:.1f} | "
                     f"{r['fused_pct_read']:.0f} | {r['unfused_us']:.1f} | "
                     f"{r['unfused_pct_read']:.0f} | {r['speedup']:.2f} | {met} |")
    groups: dict = {}
    for r in run.rows["sweep"]:
        groups.setdefault((r["preset"], r["dtype"], r["T"], r["gemm"]), []).append(r)
    for key, rows in groups.items():
        best = min(rows, key=lambda r: r["us"])
        heur = next((r for r in rows if r["candidate"] == "heuristic"), None)
        lines.append(f"sweep {' '.join(map(str, key))}: best {best['candidate']} "
                     f"{best['us']:.1f} us" + (f", heuristic {heur['us']:.1f} us" if heur else ""))
    for r in run.rows["pdl"]:
        lines.append(f"pdl {r['preset']} {r['dtype']} T={r['T']}: off {r['pdl_off_us']:.1f} us, "
                     f"on {r['pdl_on_us']:.1f} us")
    best_prefill: dict = {}
    for r in run.rows["prefill"]:
        key = (r["preset"], r["dtype"])
        if key not in best_prefill or r["us"] < best_prefill[key]["us"]:
            best_prefill[key] = r
    for key, r in best_prefill.items():
        heur = next((h for h in run.rows["prefill"] if (h["preset"], h["dtype"]) == key
                     and h["candidate"] == "heuristic"), None)
        lines.append(f"prefill {key[0]} {key[1]} T={r['T']}: best {r['candidate']} "
                     f"{r['pct_dense']:.1f}% of dense cuBLAS" + (
                         f" (heuristic {heur['pct_dense']:.1f}%)" if heur else ""))
    failed = [c for c in run.rows["checks"] if not c["ok"]]
    lines.append(f"checks: {len(run.rows['checks']) - len(failed)}/{len(run.rows['checks'])} ok"
                 + "".join(f"; FAILED {c['preset']} {c['dtype']} T={c['T']}" for c in failed))
    lines.append(f"errors: {len(run.rows['errors'])}"
                 + "".join(f"; {e['where']}" for e in run.rows["errors"][:6])
                 + f"; skipped: {[s['phase'] for s in run.rows['skipped']]}")
    return lines


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, type=pathlib.Path)
    p.add_argument("--budget", type=float, default=300.0,
                   help="seconds for all sections (startup and the last item come on top)")
    p.add_argument("--dry-run", action="store_true",
                   help="CPU, Triton interpreter, tiny shapes, no timing (CI)")
    args = p.parse_args(argv)
    dry = args.dry_run
    if not dry and not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU (or --dry-run)")
    run = Run(dry=dry, start=time.monotonic(), budget=args.budget,
              device="cpu" if dry else "cuda")
    from shufflemoe.bench.report import metadata

    # versions, GPU, commit (SHUFFLEMOE_COMMIT on the device, whose copy has no git history)
    meta = dict(metadata(), device="cpu (dry run)" if dry else torch.cuda.get_device_name())
    presets = {n: tiny(c) if dry else c for n, c in PRESETS.items()}
    quant = {"bf16": "none", "fp8": "fp8_rowwise"}
    with use_impl("triton"):
        ceilings = {} if dry else guarded(run, "ceilings", lambda: measure_read_gbps(run)) or {}
        run.read_gbps = ceilings.get("read_gbps", float("nan"))
        cases = [(n, d) for n in run.limit(list(presets), 1) for d in quant]
        for name, dtype in section(run, "decode", cases):
            cfg = presets[name].replace(quantization=quant[dtype])
            layers = guarded(run, f"layers {name} {dtype}", lambda: layers_for(
                cfg, 1 if dry else weight_sets(cfg, 1), run.device))
            for T in run.limit(list(DECODE_T), 1) if layers else ():
                guarded(run, f"check {name} {dtype} T={T}",
                        lambda: check_layer(run, name, layers[0], dtype, T))
            for T in section(run, "decode", run.limit(list(DECODE_T), 1) if layers else ()):
                guarded(run, f"decode {name} {dtype} T={T}",
                        lambda: decode_rows(run, name, layers, dtype, T))
            if layers and not dry:
                guarded(run, f"pdl {name} {dtype}", lambda: pdl_rows(run, name, layers, dtype, 1))
            del layers
            free()
        cases = [(n, d) for n in ("scout-tp8", "qwen3-30b-a3b") for d in quant]
        for name, dtype in section(run, "sweep", cases[-1:] if dry else cases):
            cfg = presets[name].replace(quantization=quant[dtype])
            layers = guarded(run, f"layers {name} {dtype}", lambda: layers_for(
                cfg, 1 if dry else weight_sets(cfg, 1), run.device))
            for T in section(run, "sweep", run.limit(list(SWEEP_T), 1) if layers else ()):
                guarded(run, f"sweep {name} {dtype} T={T}",
                        lambda: sweep_rows(run, name, layers, dtype, T))
            del layers
            free()
        cases = [(n, d) for n in ("scout-tp8", "maverick-tp8") for d in quant]
        for name, dtype in section(run, "prefill", run.limit(cases, 1)):
            cfg = presets[name].replace(quantization=quant[dtype])
            guarded(run, f"prefill {name} {dtype}",
                    lambda: prefill_rows(run, name, cfg, dtype, 32 if dry else PREFILL_T))
            free()
    result = dict(meta=meta, ceilings=ceilings, **run.rows)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "decode_check.json").write_text(json.dumps(result, indent=1, default=str))
    print("\n".join(summary(run)), flush=True)
    return result


if __name__ == "__main__":
    main()
