"""Two source trees' mxfp4 MMA-tile decodes (tl.dot_scaled at 2c7606d, the table PTX at 11200dc,
each against its parent; two warp groups a swapped tile at 992e0ee and mxfp4_run_order after it
against 586f581): the whole layer in CUDA graphs (weights and inputs rotating, as the
layer suite does) at the sizes where the weights are the MMA's left operand (the fused decode's
16-pair tiles and the grouped GEMM's swapped tiles), each row checked against float64 first. One
process per source tree (the same script, PYTHONPATH pointing at each tree), then --compare
joins the two files:

    git archive <commit> src | tar -x -C trees/<commit>   # a tree per commit, here
    export SHUFFLEMOE_COMMIT=<commit> PYTHONPATH=trees/<commit>/src
    python benchmarks/probe_mxfp4_dot.py --label <commit> --out $OUT
    python benchmarks/probe_mxfp4_dot.py --compare $OUT/probe_mxfp4_dot_<a>.json $OUT/..._<b>.json

--quantization fp8_w8a16 (or any format) times that format's layers the same way, into
probe_<format>_dot_<label>.json; --presets keeps only those presets' rows. mxfp4 is bound by instructions a byte, not by HBM (benchmarks/two_devices.py: the H200 runs
these rows at 0.99-1.02x the H100's time), so an H200 measures the change as an H100 would.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import torch

from shufflemoe import preset
from shufflemoe.bench.report import metadata

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from probe_combine import _check, _graph_us, _layers  # noqa: E402

CASES = (("llama4-scout", 8, (8, 16, 64, 128, 256)), ("llama4-maverick", 8, (8, 64, 128)),
         ("qwen3-30b-a3b", 1, (8, 64)), ("mixtral-8x7b", 2, (8, 64, 128)),
         ("gpt-oss-120b", 1, (8, 64, 4096)))  # Mixtral T = 128: 32 rows an expert; 4096: 128
N_SETS = 8


def measure(label: str, out: pathlib.Path, budget: float, quantization: str = "mxfp4",
            presets: list[str] | None = None) -> None:
    deadline = time.time() + budget
    rows = []
    for name, tp, Ts in CASES:
        if presets and name not in presets:
            continue
        cfg = preset(name, tp=tp).replace(quantization=quantization)
        layers = _layers(cfg, "cuda", False)
        for T in Ts:
            if time.time() > deadline:
                rows.append(dict(preset=name, tp=tp, T=T, skipped="time budget"))
                continue
            xs = [torch.randn(T, cfg.hidden_size, device="cuda", dtype=cfg.dtype)
                  for _ in range(N_SETS)]
            with torch.no_grad():
                row = dict(preset=name, tp=tp, T=T, check=_check(layers[0], xs[0]),
                           **_graph_us(layers, xs, False))
            rows.append(row)
            print(json.dumps(row), flush=True)
        del layers
        torch.cuda.empty_cache()
    path = out / f"probe_{quantization}_dot_{label}.json"
    path.write_text(json.dumps(dict(meta=metadata(), label=label, quantization=quantization,
                                    rows=rows), indent=1))


def compare(a: pathlib.Path, b: pathlib.Path) -> str:
    """A markdown table: each case's median us [p20, p80] in a and b, and a / b."""
    A, B = (json.loads(p.read_text()) for p in (a, b))
    key = lambda r: (r["preset"], r["tp"], r["T"])  # noqa: E731
    theirs = {key(r): r for r in B["rows"] if "us" in r}
    lines = [f"| preset | T | {A['label']} us | {B['label']} us | ratio | checks |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in A["rows"]:
        s = theirs.get(key(r))
        if "us" not in r or s is None:
            continue
        lines.append(f"| {r['preset']} TP{r['tp']} | {r['T']} | {r['us']:.1f} [{r['p20']:.1f}, "
                     f"{r['p80']:.1f}] | {s['us']:.1f} [{s['p20']:.1f}, {s['p80']:.1f}] | "
                     f"{r['us'] / s['us']:.3f} | {r['check']} / {s['check']} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=pathlib.Path)
    p.add_argument("--label")
    p.add_argument("--budget", type=float, default=150.0)
    p.add_argument("--compare", nargs=2, type=pathlib.Path)
    p.add_argument("--quantization", default="mxfp4", help="the layers' weight format")
    p.add_argument("--presets", nargs="+", help="only these of CASES' presets")
    args = p.parse_args()
    if args.compare:
        print(compare(*args.compare))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    measure(args.label, args.out, args.budget, args.quantization, args.presets)


if __name__ == "__main__":
    main()
