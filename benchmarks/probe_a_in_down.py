"""fp8 rowwise decode: a's rows quantized in down's loads ("a32": gate_up stores them in fp32,
each down program takes its rows' amax and quantizes each K step) against the m-tile's last
gate_up program quantizing them ("q"), whatever configs.down_quantizes says, and the default (it
decides). One GPU call: Llama 4 Scout / Maverick TP8 and Qwen3-30B-A3B, fp8 rowwise, the layer in
CUDA graphs (weights and inputs rotating), every variant checked against float64 and timed in
interleaved rounds, also with down's 32 x 512 one-pair tile.

    PYTHONPATH=src python benchmarks/probe_a_in_down.py --out $OUT
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
import statistics
import sys

import torch

from shufflemoe import preset
from shufflemoe.bench.report import metadata
from shufflemoe.ops.moe_decode import configs

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from probe_combine import _check, _graph_us, _layers  # noqa: E402

PRESETS = {"scout-tp8": preset("llama4-scout", tp=8),
           "maverick-tp8": preset("llama4-maverick", tp=8),
           "qwen3-30b-a3b": preset("qwen3-30b-a3b")}
CASES = [("scout-tp8", 1), ("scout-tp8", 2), ("scout-tp8", 4), ("scout-tp8", 8),
         ("maverick-tp8", 1), ("maverick-tp8", 4), ("maverick-tp8", 8), ("qwen3-30b-a3b", 1),
         ("qwen3-30b-a3b", 2), ("qwen3-30b-a3b", 4)]
ROUNDS = 5


@contextlib.contextmanager
def in_down(mode: bool | None):
    """configs.down_quantizes forced to ``mode`` (None: as it says) inside the block."""
    real = configs.down_quantizes
    if mode is not None:
        configs.down_quantizes = lambda *args: mode
    try:
        yield
    finally:
        configs.down_quantizes = real


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=pathlib.Path)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    meta, rows = metadata(), []
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for name, T in CASES:
        cfg = PRESETS[name].replace(quantization="fp8_rowwise")
        layers = _layers(cfg, "cuda", False)
        xs = [torch.randn(T, cfg.hidden_size, device="cuda", dtype=cfg.dtype) for _ in range(8)]
        E, k = cfg.num_experts, cfg.top_k
        merged = bool(cfg.shared_intermediate_size) and configs.merges_shared(T, k, "fp8_rowwise",
                                                                            E)
        A = T * k + (T if merged else 0)
        table = configs.select(A, E, cfg.hidden_size, cfg.intermediate_size,
                               layers[0].w13.dtype, sms, "fp8_rowwise",
                               torch.cuda.get_device_name())
        one_pair = table.with_(down=configs.GemmConfig(32, 512, 1, 4, 2, 1))
        variants = {"q": (False, table), "a32": (True, table), "default": (None, table),
                    "q down 32x512": (False, one_pair), "a32 down 32x512": (True, one_pair)}
        row = dict(preset=name, T=T, merged=merged, table=[table.gate_up.__dict__,
                                                          table.down.__dict__, table.pdl])
        times = {v: [] for v in variants}
        for v, (mode, plan) in variants.items():
            with in_down(mode), configs.override(plan), torch.no_grad():
                row[f"check {v}"] = _check(layers[0], xs[0])
        for _ in range(ROUNDS):
            for v, (mode, plan) in variants.items():
                with in_down(mode), configs.override(plan), torch.no_grad():
                    times[v].append(_graph_us(layers, xs, False)["us"])
        row["us"] = {v: round(statistics.median(t), 2) for v, t in times.items()}
        row["rounds"] = times
        row["a32 / q"] = round(row["us"]["a32"] / row["us"]["q"], 3)
        row["default quantizes in down"] = configs.down_quantizes(
            A, E, cfg.hidden_size, cfg.intermediate_size, layers[0].w2.dtype,
            torch.device("cuda"), "fp8_rowwise")
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "rounds"}), flush=True)
        del layers
        torch.cuda.empty_cache()
    (args.out / "probe_a_in_down.json").write_text(json.dumps(dict(meta=meta, rows=rows),
                                                              indent=1))


if __name__ == "__main__":
    main()
