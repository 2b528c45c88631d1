"""Two A/B measurements on one GPU in one call (an H100: ~4 minutes), written to
$OUT/probe_combine.json:

1. What the deterministic combine costs. `shuffled` k > 1 layers write pair rows and sum each
   token's rows in a fixed order (ops.token_sum); before, GEMM2's epilogue added each row into the
   output with bf16 atomics, which ``MoEConfig(deterministic=False)`` keeps as an option. Both on
   the unfused path (configs.NEVER, so the combine is all that differs), CUDA-graph replays, weights and inputs rotating (bench.suites.layer's copies), every output
   checked against the float64 reference. Qwen3-30B-A3B (k = 8), Mixtral-8x7B TP2 (k = 2),
   DeepSeek-V3 TP8 (k = 8, shared expert), bf16, decode T = 1, 8, 64 and prefill 2048, 16384.
   Also the layer as shipped ("default": the fused decode kernels where the Switch takes them,
   whose combine was always token-major) against the atomic path it replaces.
2. The decode switch: the fused two-kernel path (configs.ALWAYS) against the unfused one
   (configs.NEVER) at T = 1, 2, 4, 8 for Scout TP8, Qwen3, Mixtral TP2 in bf16 and fp8 rowwise:
   the GPU time of a graph replay, and the host time of an eager call (back-to-back calls
   without a sync, as a model's Python launches them), plus its wall time per call.

    PYTHONPATH=src python benchmarks/probe_combine.py --out $OUT [--budget 240]
    PYTHONPATH=src python benchmarks/probe_combine.py --dry-run --out /tmp/x   (CPU, no timing)
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

if "--dry-run" in sys.argv and not os.environ.get("TRITON_INTERPRET"):
    os.environ["TRITON_INTERPRET"] = "1"  # before triton decorates any kernel

import torch  # noqa: E402

from shufflemoe import MoE, naive_moe, preset  # noqa: E402
from shufflemoe.bench.report import metadata  # noqa: E402
from shufflemoe.bench.suites.layer import _copies, expert_bytes, fixed_bytes  # noqa: E402
from shufflemoe.bench.timing import time_fn  # noqa: E402
from shufflemoe.ops.moe_decode import configs  # noqa: E402
from shufflemoe.testing import compare, tolerance_key  # noqa: E402

COMBINE = {"qwen3-30b-a3b": preset("qwen3-30b-a3b"), "mixtral-tp2": preset("mixtral-8x7b", tp=2),
           "deepseek-v3-tp8": preset("deepseek-v3", tp=8)}
COMBINE_T = (1, 8, 64, 2048, 16384)
SWITCH = {"scout-tp8": preset("llama4-scout", tp=8), "qwen3-30b-a3b": preset("qwen3-30b-a3b"),
          "mixtral-tp2": preset("mixtral-8x7b", tp=2)}
SWITCH_T = (1, 2, 4, 8)
N_SETS = 8


def _atomic(layers):
    """The same weights with MoEConfig(deterministic=False): GEMM2's epilogue adds k > 1 rows
    into the output with atomics (the combine before the token-major sum)."""
    return [MoE.from_weights(layer.config.replace(deterministic=False),
                             **{n: t for n, t in layer.named_parameters()}) for layer in layers]


def _layers(cfg, device, dry):
    torch.manual_seed(0)
    first = MoE(cfg, device=device)
    n = 1 if dry else _copies(first, expert_bytes(first) * cfg.top_k + fixed_bytes(first))
    return [first] + [MoE(cfg, device=device) for _ in range(n - 1)]


def _check(layer, x) -> str:
    ref, mag = naive_moe(layer, x, layer.route(x), with_magnitude=True)
    c = compare(layer(x), ref, tolerance_key(layer.config), magnitude=mag)
    return "ok" if c.ok else f"FAILED: {c.why}"


def _graph_us(layers, xs, dry) -> dict:
    run = lambda i: layers[i % len(layers)](xs[i])  # noqa: E731
    if dry:
        run(0)
        return {}
    t = time_fn(run, len(xs), graph=True, reps=20 if xs[0].shape[0] >= 8192 else 40)
    return dict(us=t.median_us, p20=t.p20_us, p80=t.p80_us)


def _eager_host_us(layers, xs, dry, calls=200) -> dict:
    """Host time per call of back-to-back eager calls (no sync between them), and wall per call."""
    if dry:
        layers[0](xs[0])
        return {}
    host, wall = [], []
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(calls):
            layers[i % len(layers)](xs[i % len(xs)])
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        host.append((t1 - t0) / calls * 1e6)
        wall.append((t2 - t0) / calls * 1e6)
    host.sort(), wall.sort()
    return dict(host_us=host[2], host_min_us=host[0], host_max_us=host[-1], wall_us=wall[2])


def combine_rows(device, dry, deadline) -> list[dict]:
    rows = []
    for name, cfg in COMBINE.items():
        if dry:
            grouped = cfg.router == "group_limited"
            cfg = cfg.replace(hidden_size=64, intermediate_size=32, num_experts=16,
                              shared_intermediate_size=32 if cfg.shared_intermediate_size else 0,
                              **(dict(n_group=4, topk_group=2) if grouped else {}))
        layers = _layers(cfg, device, dry)
        for T in (COMBINE_T if not dry else (1, 8)):
            if time.time() > deadline:
                rows.append(dict(part="combine", preset=name, T=T, note="skipped: time budget"))
                continue
            xs = [torch.randn(T, cfg.hidden_size, device=device, dtype=cfg.dtype)
                  for _ in range(2 if T >= 8192 else N_SETS)]
            row = dict(part="combine", preset=name, T=T, k=cfg.top_k)
            with configs.override(configs.NEVER):
                row["check_token_sum"] = _check(layers[0], xs[0])
                row["token_sum"] = _graph_us(layers, xs, dry)
                atomic = _atomic(layers)
                row["check_atomic"] = _check(atomic[0], xs[0])
                row["atomic"] = _graph_us(atomic, xs, dry)
                row["token_sum_again"] = _graph_us(layers, xs, dry)  # interleaved: drift shows
            row["default"] = _graph_us(layers, xs, dry)  # the layer as shipped (fused at decode)
            if not dry:
                ours = min(row["token_sum"]["us"], row["token_sum_again"]["us"])
                row["cost_pct"] = 100 * (ours / row["atomic"]["us"] - 1)
                row["default_vs_atomic_pct"] = 100 * (row["default"]["us"] / row["atomic"]["us"] - 1)
            rows.append(row)
            print(json.dumps(row), flush=True)
        del layers
        torch.cuda.empty_cache() if device == "cuda" else None
    return rows


def switch_rows(device, dry, deadline) -> list[dict]:
    rows = []
    for name, base in SWITCH.items():
        for fmt in ("none", "fp8_rowwise"):
            cfg = base.replace(quantization=fmt)
            if dry:
                cfg = cfg.replace(hidden_size=64, intermediate_size=32,
                                  shared_intermediate_size=32 if cfg.shared_intermediate_size else 0)
            layers = _layers(cfg, device, dry)
            for T in (SWITCH_T if not dry else (1,)):
                if time.time() > deadline:
                    rows.append(dict(part="switch", preset=name, format=fmt, T=T,
                                     note="skipped: time budget"))
                    continue
                xs = [torch.randn(T, cfg.hidden_size, device=device, dtype=cfg.dtype)
                      for _ in range(N_SETS)]
                row = dict(part="switch", preset=name, format=fmt, T=T, k=cfg.top_k)
                for label, switch in (("fused", configs.ALWAYS), ("unfused", configs.NEVER)):
                    with configs.override(switch):
                        row[f"check_{label}"] = _check(layers[0], xs[0])
                        row[label] = dict(**_graph_us(layers, xs, dry),
                                          **_eager_host_us(layers, xs, dry))
                rows.append(row)
                print(json.dumps(row), flush=True)
            del layers
            torch.cuda.empty_cache() if device == "cuda" else None
    return rows


def _us(d: dict) -> str:
    return f"{d['us']:.1f} ({d['p20']:.1f}-{d['p80']:.1f})" if d.get("us") else "-"


def markdown(result: dict) -> str:
    m = result["meta"]
    lines = [f"# probe_combine: {m.get('gpu')}, torch {m['torch']}, triton {m['triton']}, "
             f"commit {m['commit']}, {m['date']}", "",
             "CUDA-graph replays, median (p20-p80) us. Deterministic token-major combine vs the "
             "atomic epilogue it replaced, on the unfused path; default = the layer as shipped.", "",
             "| preset | T | k | token-major | atomic | cost | default | default vs atomic | checks |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in result["rows"]:
        if r["part"] == "combine" and "atomic" in r:
            lines.append(f"| {r['preset']} | {r['T']} | {r['k']} | {_us(r['token_sum'])} | "
                         f"{_us(r['atomic'])} | {r.get('cost_pct', 0):+.1f}% | {_us(r['default'])} | "
                         f"{r.get('default_vs_atomic_pct', 0):+.1f}% | "
                         f"{r['check_token_sum']}/{r['check_atomic']} |")
    lines += ["", "Decode switch: fused vs unfused; graph = GPU us per replay, host = host us per "
              "eager call (median of 5 runs of 200 back-to-back calls).", "",
              "| preset | format | T | graph fused | graph unfused | unfused/fused | host fused | "
              "host unfused | checks |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in result["rows"]:
        if r["part"] == "switch" and "fused" in r and r["fused"].get("us"):
            f, u = r["fused"], r["unfused"]
            lines.append(f"| {r['preset']} | {r['format']} | {r['T']} | {_us(f)} | {_us(u)} | "
                         f"{u['us'] / f['us']:.3f}x | {f['host_us']:.0f} | {u['host_us']:.0f} | "
                         f"{r['check_fused']}/{r['check_unfused']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, type=pathlib.Path)
    p.add_argument("--budget", type=float, default=240.0, help="seconds for both parts")
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes, no timing")
    args = p.parse_args()
    dry = args.dry_run
    device = "cpu" if dry else "cuda"
    start = time.time()
    rows = combine_rows(device, dry, start + args.budget * 0.55)
    rows += switch_rows(device, dry, start + args.budget)
    args.out.mkdir(parents=True, exist_ok=True)
    result = dict(meta=metadata(), rows=rows)
    (args.out / "probe_combine.json").write_text(json.dumps(result, indent=1))
    (args.out / "probe_combine.md").write_text(markdown(result))
    failed = [r for r in rows if any(str(v).startswith("FAILED") for v in r.values())]
    print(f"{len(rows)} rows, {len(failed)} with a failed check")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
