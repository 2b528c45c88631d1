"""GPU timing of the routed-expert weight formats (issue 14), by MoEConfig.quantization name, for
one GPU call; it writes nothing into benchmarks/results (numbers for the issue's closing note):

1. gemm: the grouped GEMM per format on real checkpoints' expert GEMMs (gpt-oss-120b, DeepSeek-V3,
   Qwen3-30B-A3B), decode and prefill row counts with random top-k routing: median us (CUDA
   graph, rotating inputs), weight bytes / time against the copy ceiling, TFLOP/s, and the
   format's time over bf16's on the same shape. Cases up to T = 256 are first checked against
   the torch reference (float32 of the same quantized operands; tests/ops cover the rest).
2. layer: the whole MoE layer (shuffled strategy, CUDA graph) per format on the gpt-oss-120b and
   DeepSeek-V3 presets at T = 1, 64, 4096, checked against the torch-reference layer up to
   T = 64 (the quantized references multiply group by group over all rows).

    PYTHONPATH=src python benchmarks/probe_formats.py [gemm] [layer] [--formats none mxfp4 ...]
"""

from __future__ import annotations

import argparse

import torch

from shufflemoe import MoE, preset
from shufflemoe.bench.timing import measure_ceilings, rotations, time_fn
from shufflemoe.ops import grouped_gemm, use_impl
from shufflemoe.ops.quantize import reference as qref
from shufflemoe.ops.quantize.formats import FORMATS
from shufflemoe.testing import compare

# (E, k, [(name, N, K, split)]): the two expert GEMMs of each model. DeepSeek-V3 with 64 of its
# 256 experts: its bf16 w13 alone would be 15 GB, and quantizing it from float32 needs 4x that.
GEMMS = {
    "gpt-oss-120b": (128, 4, [("w13", 5760, 2880, None), ("w2", 2880, 2880, None)]),
    "deepseek-v3/64": (64, 8, [("w13", 4096, 7168, 2048), ("w2", 7168, 2048, None)]),
    "qwen3-30b-a3b": (128, 8, [("w13", 1536, 2048, 768), ("w2", 2048, 768, None)]),
}
TOKENS = (1, 16, 256, 4096)


def _routing_sizes(T: int, E: int, k: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]).flatten()
    return torch.bincount(ids, minlength=E).int().cuda()


def _operands(fmt_name: str, M: int, N: int, K: int, E: int, split: int | None, seed: int):
    fmt = FORMATS[fmt_name]
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = torch.randn(E, N, K, device="cuda", generator=g, dtype=torch.bfloat16) / K**0.5
    x = torch.randn(M, K, device="cuda", generator=g, dtype=torch.bfloat16)
    kw = dict(quantization=fmt_name)
    if fmt.quantized:
        w, kw["w_scale"] = fmt.quantize(w, split)
        kw["scale_split"] = split if fmt_name == "fp8_block" else None
    if fmt.activation == "rowwise":
        x, kw["x_scale"] = qref.quantize_fp8_rowwise(x)
    elif fmt.activation == "groups":
        x, kw["x_scale"] = qref.quantize_fp8_groups(x)
    return x, w, kw


def probe_gemm(formats: list[str], copy_gbps: float) -> None:
    print(f"{'model':14} {'gemm':4} {'T':>5} {'format':12} {'us':>9} {'weight GB/s':>12} "
          f"{'% copy':>7} {'TFLOP/s':>8} {'x bf16':>7}  check")
    for model, (E, k, gemms) in GEMMS.items():
        for name, N, K, split in gemms:
            for T in TOKENS:
                sizes = _routing_sizes(T, E, k, seed=T)
                M, active = T * k, int((sizes > 0).sum())
                base = None
                for fmt_name in ["none"] + [f for f in formats if f != "none"]:
                    fmt = FORMATS[fmt_name]
                    x, w, kw = _operands(fmt_name, M, N, K, E, split, seed=1)
                    out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
                    check = "-"  # the reference runs one full-M matmul per group on the GPU
                    if T <= 256:
                        got = grouped_gemm(x, w, sizes, out=out, **kw).clone()
                        ref = grouped_gemm(x, w, sizes, impl="torch", **kw)
                        check = "ok" if compare(got, ref.double(), "bfloat16").ok else "MISMATCH"
                    wbytes = active * fmt.bytes(N, K, 2, split)
                    sets = rotations(E * fmt.bytes(N, K, 2, split))
                    ws = [w] + [w.clone() for _ in range(sets - 1)]
                    t = time_fn(lambda i: grouped_gemm(x, ws[i], sizes, out=out, **kw), sets)
                    us = t.median_us
                    base = us if fmt_name == "none" else base
                    if fmt_name in formats:
                        print(f"{model:14} {name:4} {T:5} {fmt_name:12} {us:9.1f} "
                              f"{wbytes / us / 1e3:12.0f} {100 * wbytes / us / 1e3 / copy_gbps:6.0f}% "
                              f"{2 * M * N * K / us / 1e6:8.1f} {us / base:7.2f}  {check}")
                    del ws


def probe_layer(formats: list[str]) -> None:
    print(f"\n{'preset (E)':18} {'T':>5} {'format':12} {'us':>9} {'x bf16':>7}  check")
    for name, experts in (("gpt-oss-120b", 128), ("deepseek-v3", 64)):  # memory: as above
        for T in (1, 64, 4096):
            base = None
            for fmt_name in ["none"] + [f for f in formats if f != "none"]:
                cfg = preset(name, quantization=fmt_name, num_experts=experts)
                torch.manual_seed(0)
                layer = MoE(cfg, device="cuda")
                x = torch.randn(T, cfg.hidden_size, device="cuda", dtype=cfg.dtype)
                check = "-"
                if T <= 64:
                    got = layer(x).clone()
                    with use_impl("torch"):
                        ref = layer(x)
                    tol = "bfloat16" if FORMATS[fmt_name].activation == "none" else "fp8_block"
                    check = "ok" if compare(got, ref.double(), tol).ok else "MISMATCH"
                us = time_fn(lambda i: layer(x), 1).median_us
                base = us if fmt_name == "none" else base
                if fmt_name in formats:
                    print(f"{name + f' ({experts})':18} {T:5} {fmt_name:12} {us:9.1f} "
                          f"{us / base:7.2f}  {check}")
                del layer
                torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("parts", nargs="*", default=["gemm", "layer"])
    parser.add_argument("--formats", nargs="+", default=list(FORMATS), choices=list(FORMATS))
    args = parser.parse_args()
    c = measure_ceilings()
    print(f"{torch.cuda.get_device_name()}: copy {c.copy_gbps:.0f} GB/s, bf16 {c.bf16_tflops:.0f} "
          f"TFLOP/s, fp8 {c.fp8_tflops:.0f} TFLOP/s\n")
    if "gemm" in args.parts:
        probe_gemm(args.formats, c.copy_gbps)
    if "layer" in args.parts:
        probe_layer(args.formats)


if __name__ == "__main__":
    main()
