"""Accuracy of compiled generate, patched, against the float32 model (one GPU call, ~3 minutes).

    PYTHONPATH=src python benchmarks/probe_generate_accuracy.py --out $OUT

The e2e_hf suite checks the logits of one generated position of one sequence (Qwen3-30B-A3B at
batch 1); at 4a20cbf ours was 0.0183 rel L2 from the float32 model against 0.0075 at 5b30814
(limit 0.0142). This probe asks whether the decode tuning table made that: the same model and
prompt, logits of the second generated position at batches 1 and 8, from transformers' eager
code (the suite's reference), our patched model eagerly, and compiled generate patched with the
tuning table and with the heuristic (configs.override), each against the float32 model.
Writes $OUT/probe_generate_accuracy.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pathlib

import torch

from shufflemoe.bench.report import metadata
from shufflemoe.bench.suites import e2e_paths
from shufflemoe.bench.suites.e2e_hf import SHAPES, fp32_references
from shufflemoe.integrations.transformers import patch, unpatch
from shufflemoe.integrations.transformers.models import build_model
from shufflemoe.ops.moe_decode import configs

BATCHES = (1, 8)


def rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def generated(model, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits of the second generated position [B, V], first generated tokens [B])."""
    _, logits, first = e2e_paths.time_generate(model, batch, 2, 3, 1)
    return logits, first


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=pathlib.Path)
    args = p.parse_args()
    shape = next(s for s in SHAPES if s.name == "qwen3-30b-a3b")
    model = build_model(shape.config(False), torch.bfloat16, "cuda")
    rows = []
    with torch.no_grad():
        fp32 = fp32_references(model, BATCHES)

        def add(label: str, batch: int, logits: torch.Tensor, first: torch.Tensor | None):
            ref = fp32[("generate", batch)]
            mask = torch.ones(batch, dtype=torch.bool, device=ref.device)
            if first is not None:
                mask = first == fp32[("first token", batch)]
            per_seq = [rel_l2(logits[i], ref[i]) for i in range(batch) if mask[i]]
            rows.append(dict(path=label, batch=batch, rel_l2_vs_fp32=per_seq,
                             mean=sum(per_seq) / max(len(per_seq), 1)))
            print(f"{label} b{batch}: " + " ".join(f"{e:.4f}" for e in per_seq), flush=True)

        for batch in BATCHES:
            first, logits = e2e_paths.greedy_step(model, batch)
            add("transformers eager", batch, logits, first)
        patch(model, graph_buckets=None)
        for batch in BATCHES:
            first, logits = e2e_paths.greedy_step(model, batch)
            add("shufflemoe eager (table)", batch, logits, first)
        with configs.override(configs.heuristic):
            for batch in BATCHES:
                first, logits = e2e_paths.greedy_step(model, batch)
                add("shufflemoe eager (heuristic)", batch, logits, first)
        unpatch(model)
        patch(model)
        for label, manager in (("table", contextlib.nullcontext()),
                               ("heuristic", configs.override(configs.heuristic))):
            with manager:
                for batch in BATCHES:
                    logits, first = generated(model, batch)
                    add(f"shufflemoe compiled generate ({label})", batch, logits, first)
            model.__dict__.pop("_compiled_call", None)
            torch._dynamo.reset()
        unpatch(model)
        for batch in BATCHES:
            logits, first = generated(model, batch)
            add("transformers compiled generate", batch, logits, first)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "probe_generate_accuracy.json").write_text(json.dumps(
        dict(meta=metadata(), rows=rows), indent=1, default=str))


if __name__ == "__main__":
    main()
