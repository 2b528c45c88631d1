"""Diagnostics for one GPU call (numbers feed benchmarks/notes/layer.md):

1. every silu_mul + fp8 quantization launch (ops/silu_mul/kernel.py: fp8_variants) at I = 5120
   (A = 2048, 16384), 768 (Qwen3) and 1024 (A = 16384), each checked against the quantization of
   the kernel's float32 product first, against the copy bandwidth;
2. the layer's CPU cost: eager time, CUDA-graph time and host time to issue one call, plus the
   profiler's top host ops, for a prefill (Qwen3, T=2048) and a decode (Scout TP8, T=64) call;
3. the prefill target rows: Scout TP8 T=16384 bf16 / fp8 against a dense cuBLAS GEMM;
4. where a whole-model prefill spends its GPU time: the e2e_hf suite's Qwen3 model (4 layers),
   transformers' grouped_mm experts against shufflemoe, top kernels by CUDA time.

    PYTHONPATH=src python benchmarks/probe_layer.py [silu] [cpu] [prefill] [e2e]  (default: all)
    PYTHONPATH=src python benchmarks/probe_layer.py silu_small   (SILU_SMALL_CASES only)
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time

import torch
import triton

from shufflemoe import MoE, preset
from shufflemoe.bench.ceilings import measure_ceilings
from shufflemoe.bench.suites.layer import _dense
from shufflemoe.bench.timing import time_fn
from shufflemoe.ops import dequantize_fp8_rowwise, quantize_fp8_rowwise, silu_mul
from shufflemoe.ops.quantize.reference import FP8_DTYPE
from shufflemoe.ops.silu_mul.kernel import Fp8Launch, fp8_launch, fp8_variants, launch_silu_mul_fp8
from shufflemoe.testing import compare


SILU_CASES = ((5120, 2048), (5120, 16384), (768, 16384), (1024, 16384))  # (I, A)
# silu_small: the decode sizes of the unfused fp8 path, one row a program on 132 SMs (Mixtral TP2
# at T = 64 / 128, Qwen3-30B-A3B at T = 64, Llama 4 Scout TP8 at T = 64), where
# probe_timeline saw 7.3 us against bf16 silu_mul's 3.4 (Mixtral T = 64)
SILU_SMALL_CASES = ((7168, 128), (7168, 256), (768, 512), (1024, 64))


def _describe(c: Fp8Launch) -> str:
    tile = f"one pass {c.block}+{c.block_b}" if c.one_pass else f"two passes {c.block} x{c.chunks}"
    return f"{tile} warps={c.num_warps}"


def _check_fp8(h, q, s, ref_q, ref_s) -> str | None:
    """'bit-exact' when (q, s) is quantize_fp8_rowwise of the kernel's float32 product, else
    'within fp8 tolerance' against the float64 silu_mul, else None."""
    if torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8)) and torch.equal(s, ref_s):
        return "bit-exact"
    g, u = h.double().chunk(2, dim=1)
    c = compare(dequantize_fp8_rowwise(q, s), g / (1 + torch.exp(-g)) * u, "fp8_rowwise")
    return "within fp8 tolerance" if c.ok else None


def silu_fp8_variants(copy_gbps: float, cases=SILU_CASES) -> None:
    """Every silu_mul + fp8 launch of fp8_variants(I), each
    checked against the quantization of the kernel's float32 product before it is timed; and
    the bf16 silu_mul of the same rows."""
    for I, A in cases:
        hs = [torch.randn(A, 2 * I, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
        plain = time_fn(lambda i, hs=hs: silu_mul(hs[i]), len(hs), reps=30)
        print(f"silu_mul bf16 I={I} A={A} {plain.median_us:8.1f} us", flush=True)
        q = torch.empty(A, I, device="cuda", dtype=FP8_DTYPE)
        s = torch.empty(A, device="cuda")
        ref_q, ref_s = quantize_fp8_rowwise(silu_mul(hs[0].float(), impl="triton"))
        nbytes = A * (2 * I * 2 + I + 4)
        default = fp8_launch(I)
        seen: dict[Fp8Launch, str] = {}
        for name, launch in fp8_variants(I).items():
            label = f"silu_mul_fp8 I={I} A={A} {name:<25}"
            if launch in seen:
                print(f"{label} same launch as {seen[launch]}", flush=True)
                continue
            seen[launch] = name
            try:
                q.view(torch.uint8).fill_(0xFF)
                s.fill_(float("nan"))
                launch_silu_mul_fp8(hs[0], None, q, s, launch)
                torch.cuda.synchronize()
                check = _check_fp8(hs[0], q, s, ref_q, ref_s)
                if check is None:
                    print(f"{label} WRONG RESULT, not timed ({_describe(launch)})", flush=True)
                    continue
                t = time_fn(lambda i, c=launch: launch_silu_mul_fp8(hs[i], None, q, s, c), len(hs),
                            reps=30)
            except Exception as e:  # a variant that fails to compile or launch: report, go on
                print(f"{label} FAILED ({_describe(launch)}): {type(e).__name__}: {str(e)[:1500]}",
                      flush=True)
                continue
            gbps = nbytes / t.median_us / 1e3
            mark = " (default)" if launch == default else ""
            print(f"{label} {t.median_us:8.1f} us {gbps:5.0f} GB/s ({100 * gbps / copy_gbps:3.0f}% "
                  f"of copy) {check}; {_describe(launch)}{mark}", flush=True)
        del hs, q, s, ref_q, ref_s
        torch.cuda.empty_cache()


def cpu_cost(name: str, cfg, T: int) -> None:
    torch.manual_seed(0)
    layer = MoE(cfg, device="cuda")
    x = torch.randn(T, cfg.hidden_size, device="cuda", dtype=cfg.dtype)
    for _ in range(3):
        layer(x)
    torch.cuda.synchronize()
    n = 20
    t0 = time.perf_counter()
    for _ in range(n):
        layer(x)
    issue = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    eager = (time.perf_counter() - t0) / n * 1e6
    graph = time_fn(lambda i: layer(x), 1, reps=20).median_us
    print(f"{name} T={T}: host issue {issue:.0f} us/call, eager {eager:.0f} us/call, "
          f"graph {graph:.0f} us/call", flush=True)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        layer(x)
    prof.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(prof).sort_stats("tottime")
    stats.print_stats(22)


def prefill_targets(ceil) -> None:
    for quant in ("none", "fp8_rowwise"):
        cfg = preset("llama4-scout", tp=8, quantization=quant)
        torch.manual_seed(0)
        layer = MoE(cfg, device="cuda")
        T = 16384
        xs = [torch.randn(T, cfg.hidden_size, device="cuda", dtype=cfg.dtype) for _ in range(3)]
        t = time_fn(lambda i: layer(xs[i]), len(xs), reps=10).median_us
        routed = 6 * T * cfg.hidden_size * cfg.intermediate_size
        other = (6 * T * cfg.hidden_size * cfg.shared_intermediate_size
                 + 2 * T * cfg.hidden_size * cfg.num_experts)
        ours = (routed + other) / t / 1e6
        dense_us = (_dense(T, cfg.hidden_size, routed, quant != "none", reps=10).median_us
                    + _dense(T, cfg.hidden_size, other, False, reps=10).median_us)
        dense = (routed + other) / dense_us / 1e6
        print(f"scout TP8 T={T} {quant}: {t:.0f} us, {ours:.0f} TFLOP/s, dense cuBLAS {dense:.0f} "
              f"({100 * ours / dense:.0f}%)", flush=True)


def e2e_prefill_profile() -> None:
    from shufflemoe.bench.suites import e2e_hf, e2e_paths
    from shufflemoe.integrations.transformers import patch, register_experts_implementation, unpatch
    from shufflemoe.integrations.transformers.models import build_model

    register_experts_implementation()
    shape = next(s for s in e2e_hf.SHAPES if s.model_type == "qwen3_moe")
    for quick in (True, False):
        model = build_model(shape.config(quick), torch.bfloat16, "cuda")
        ids = e2e_paths.tokens(model.config.vocab_size, 1, e2e_paths.PREFILL_TOKENS, seed=0)
        for name in ("grouped_mm", "shufflemoe", "grouped_mm", "shufflemoe"):
            if name == "shufflemoe":
                patch(model)
            else:
                unpatch(model)
                model.set_experts_implementation(name)
            with torch.no_grad():
                ms = e2e_paths.time_prefill(model, 5, graph=False)[0]["ms"]
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                model(ids, use_cache=False, logits_to_keep=1)
                issue = (time.perf_counter() - t0) * 1e3
                torch.cuda.synchronize()
                acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
                with torch.profiler.profile(activities=acts) as prof:
                    model(ids, use_cache=False, logits_to_keep=1)
            gpu = sum(e.self_device_time_total for e in prof.key_averages()) / 1e3
            print(f"qwen3 {model.config.num_hidden_layers} layers prefill, {name}: {ms:.2f} ms, "
                  f"host issue {issue:.2f} ms, GPU busy {gpu:.2f} ms", flush=True)
            if not quick:
                print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=12,
                                                max_name_column_width=50), flush=True)
        unpatch(model)
        del model
        torch.cuda.empty_cache()


def main(parts: list[str]) -> None:
    parts = parts or ["silu", "cpu", "prefill", "e2e"]
    ceil = measure_ceilings()
    print(ceil.as_dict(), triton.__version__, flush=True)
    if "silu" in parts:
        silu_fp8_variants(ceil.copy_gbps)
    if "silu_small" in parts:
        silu_fp8_variants(ceil.copy_gbps, SILU_SMALL_CASES)
    if "cpu" in parts:
        cpu_cost("qwen3-30b-a3b", preset("qwen3-30b-a3b"), 2048)
        cpu_cost("llama4-scout-tp8", preset("llama4-scout", tp=8), 64)
    if "prefill" in parts:
        prefill_targets(ceil)
    if "e2e" in parts:
        e2e_prefill_profile()


if __name__ == "__main__":
    main(sys.argv[1:])
