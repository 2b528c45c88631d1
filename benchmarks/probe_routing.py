"""Where a bf16 model's expert choices are fragile: for each MoE block of the e2e_hf models
(real widths, random weights, transformers' init), the decode step at batch 64 after the prompt
(e2e_paths.Decoder's checked step), on the block inputs of transformers' own bf16 run:

- ties: tokens whose k-th and (k+1)-th bf16 router logits are equal (the choice is arbitrary);
- hf_vs_fp32: tokens whose chosen expert set from the bf16 logits (torch.topk, as transformers
  chooses) differs from the set the float32 logits of the same input choose;
- ours_vs_hf, ours_vs_fp32: the same for shufflemoe's routing of that input (layer.route:
  index_shuffle, ties to the lower expert id).

One changed choice changes that token's output by a whole expert's contribution, so a handful of
them moves a batch's logits by more than every rounding difference together. Results go to
$OUT/probe_routing.json and .md.

    PYTHONPATH=src python benchmarks/probe_routing.py --out $OUT
    PYTHONPATH=src python benchmarks/probe_routing.py --dry-run --out /tmp/x   (CPU, tiny models)
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

if "--dry-run" in sys.argv and not os.environ.get("TRITON_INTERPRET"):
    os.environ["TRITON_INTERPRET"] = "1"  # before triton decorates any kernel

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from shufflemoe.bench.report import metadata  # noqa: E402
from shufflemoe.bench.suites import e2e_hf, e2e_paths  # noqa: E402
from shufflemoe.integrations.transformers import patch, unpatch  # noqa: E402
from shufflemoe.integrations.transformers.models import _COMMON, TINY, build_model  # noqa: E402
from shufflemoe.integrations.transformers.patch import block_layer  # noqa: E402

BATCH = 64


def _sets(ids: torch.Tensor) -> torch.Tensor:
    return ids.sort(dim=1).values


def _ours_ids(layer, x: torch.Tensor) -> torch.Tensor:
    """[T, k] expert ids shufflemoe's routing picks for x."""
    r = layer.route(x)
    k = layer.config.top_k
    return r.expert_ids[r.positions.long()].view(-1, k).long()


def probe(shape: e2e_hf.Shape, quick: bool, batch: int) -> list[dict]:
    model = build_model(shape.config(quick), torch.bfloat16, e2e_paths.DEVICE)
    blocks = {name: m for name, m in model.named_modules()
              if name.endswith(".feed_forward") or name.endswith(".mlp")}
    inputs: dict[str, torch.Tensor] = {}
    hooks = [m.register_forward_pre_hook(lambda m, args, name=name: inputs.__setitem__(name, args[0].detach()))
             for name, m in blocks.items()]
    with torch.no_grad():
        e2e_paths.Decoder(model, batch, 2, graph=False).checked_logits()  # the last call: the step
    for h in hooks:
        h.remove()
    patch(model, graph_buckets=None)
    rows = []
    with torch.no_grad():
        for n, (name, block) in enumerate(blocks.items()):
            layer = block_layer(block)
            k, x = layer.config.top_k, inputs[name].reshape(-1, layer.config.hidden_size)
            w = layer.router_weight
            lb, lf = F.linear(x, w), F.linear(x.float(), w.float())
            top = lb.float().topk(k + 1, dim=1).values
            hf, fp32, ours = (_sets(lb.topk(k, dim=1).indices), _sets(lf.topk(k, dim=1).indices),
                              _sets(_ours_ids(layer, x)))
            differ = lambda a, b: int((a != b).any(1).sum())  # noqa: E731
            rows.append(dict(model=shape.name, layer=n, tokens=x.shape[0], k=k,
                             ties=int((top[:, k - 1] == top[:, k]).sum()),
                             hf_vs_fp32=differ(hf, fp32), ours_vs_hf=differ(ours, hf),
                             ours_vs_fp32=differ(ours, fp32)))
    unpatch(model)
    del model
    if e2e_paths.DEVICE == "cuda":
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shapes, batch = e2e_hf.SHAPES, BATCH
    if args.dry_run:
        e2e_paths.DEVICE, e2e_paths.PROMPT_TOKENS, batch = "cpu", 8, 5
        torch.set_num_threads(1)
        attn = {k: _COMMON[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim")}
        shapes = [e2e_hf.Shape(f"tiny-{s.model_type}", s.model_type, dict(attn, **TINY[s.model_type]),
                               layers=2, quick_layers=2, full_layers=48, full_vocab=4096) for s in shapes]
    rows = [r for s in shapes for r in probe(s, args.dry_run, batch)]
    meta = metadata() if not args.dry_run else dict(dry_run=True)
    (out / "probe_routing.json").write_text(json.dumps(dict(meta=meta, batch=batch, rows=rows), indent=1))
    cols = ["model", "layer", "tokens", "k", "ties", "hf_vs_fp32", "ours_vs_hf", "ours_vs_fp32"]
    lines = [f"# probe_routing (decode batch {batch})", "", json.dumps(meta), "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    (out / "probe_routing.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
