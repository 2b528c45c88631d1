"""What MoEConfig(batch_invariant=True) costs on the GPU: the layer timed in the default mode and
in the batch-invariant mode (same weights, same rotating inputs, CUDA graphs), and a check that
the mode's rows are the same bits alone and in the batch. The goal is <= 1.5x the default
(vLLM's batch-invariant mode costs about 9x).

    PYTHONPATH=src python benchmarks/batch_invariant_cost.py

Prints a markdown table stamped with the GPU, versions and commit (bench.report.metadata).
"""

from __future__ import annotations

import torch

from shufflemoe import MoE, preset
from shufflemoe.bench.report import markdown_table, metadata
from shufflemoe.bench.timing import time_fn

N_SETS = 8  # input batches rotated through per timing
LAYERS = {"llama4-scout-tp8": preset("llama4-scout", tp=8),
          "qwen3-30b-a3b": preset("qwen3-30b-a3b")}
TOKENS = (1, 8, 64, 512, 2048, 16384)


def _rows_identical(layer: MoE, x: torch.Tensor) -> bool:
    """Rows 0 and T-1 computed alone are the same bits as in the batch x."""
    full = layer(x)
    return all(torch.equal(layer(x[i:i + 1]), full[i:i + 1]) for i in (0, x.shape[0] - 1))


def main() -> None:
    rows = []
    for name, cfg in LAYERS.items():
        for quant in ("none", "fp8_rowwise"):
            torch.manual_seed(0)
            default = MoE(cfg.replace(quantization=quant), device="cuda")
            invariant = MoE.from_weights(
                default.config.replace(batch_invariant=True), router_weight=default.router_weight,
                w13=default.w13, w2=default.w2, w13_scale=default.w13_scale,
                w2_scale=default.w2_scale, shared_w13=default.shared_w13,
                shared_w2=default.shared_w2, shared_gate=default.shared_gate)
            for T in TOKENS:
                xs = [torch.randn(T, cfg.hidden_size, device="cuda", dtype=cfg.dtype)
                      for _ in range(N_SETS)]
                t_def = time_fn(lambda i: default(xs[i]), N_SETS).median_us
                t_inv = time_fn(lambda i: invariant(xs[i]), N_SETS).median_us
                rows.append(dict(layer=name, quantization=quant, T=T, default_us=round(t_def, 1),
                                 batch_invariant_us=round(t_inv, 1),
                                 ratio=round(t_inv / t_def, 2),
                                 rows_identical=_rows_identical(invariant, xs[0])))
                print(rows[-1], flush=True)
    meta = metadata()
    print(f"\n{meta}\n")
    print(markdown_table(rows))


if __name__ == "__main__":
    main()
