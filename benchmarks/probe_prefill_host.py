"""Eager MoE block calls past the decode sizes, with and without launch plans (layer.py:
PLAN_MAX_LARGE), against transformers' own block, one GPU call.

    PYTHONPATH=src python benchmarks/probe_prefill_host.py --out $OUT

Per host_cost shape (one layer at real width, patched with graph_buckets=None: eager) and T:
three copies of one model, ours with plans past 256 tokens (recorded at a T's second call),
ours without (PLAN_MAX_LARGE = 0 around its calls: every call binds and launches through
Triton's JIT, as before), and transformers' block (its default experts implementation). In
ROUNDS turns each runs CALLS back-to-back calls from a drained queue: host us a call (until the
last returns) and wall us a call (to a sync); medians and the spread (min, max) over the rounds.
Checks that the two of ours give the same bits. Also the launch plans' workspace bytes held at
the end. Writes $OUT/probe_prefill_host.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import pathlib
import statistics

import torch

from shufflemoe import layer as moe_layer
from shufflemoe.bench.report import metadata
from shufflemoe.bench.suites import host_cost
from shufflemoe.integrations.transformers import patch
from shufflemoe.integrations.transformers.models import build_model
from shufflemoe.ops import _launch

TOKENS = (512, 2048, 8192)
ROUNDS = 7
CALLS = 5


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=pathlib.Path)
    p.add_argument("--shapes", default="")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for shape in host_cost.SHAPES:
        if args.shapes and shape.name not in args.shapes.split(","):
            continue
        hf = build_model(host_cost.config(shape), torch.bfloat16, "cuda")
        planned = host_cost.first_block(patch(copy.deepcopy(hf), graph_buckets=None))
        unplanned = host_cost.first_block(patch(copy.deepcopy(hf), graph_buckets=None))
        theirs = host_cost.first_block(hf)

        def without_plans(x, block=unplanned):
            saved = moe_layer.PLAN_MAX_LARGE
            moe_layer.PLAN_MAX_LARGE = 0
            try:
                return block(x)
            finally:
                moe_layer.PLAN_MAX_LARGE = saved

        impls = {"shufflemoe, plans past 256": planned, "shufflemoe, no plans past 256": without_plans,
                 "transformers": theirs}
        for T in TOKENS:
            x = torch.randn(1, T, shape.fields["hidden_size"], device="cuda", dtype=torch.bfloat16)
            with torch.no_grad():
                outs = {name: [fn(x) for _ in range(3)][-1] for name, fn in impls.items()}
                outs = {name: o[0] if isinstance(o, tuple) else o for name, o in outs.items()}  # Llama 4: (out, logits)
                same = torch.equal(outs["shufflemoe, plans past 256"], outs["shufflemoe, no plans past 256"])
                del outs
                samples = {name: [] for name in impls}
                for _ in range(ROUNDS):
                    for name, fn in impls.items():
                        samples[name].append(host_cost._sample(lambda: fn(x), CALLS))
            for name, s in samples.items():
                host, wall = [h for h, _ in s], [w for _, w in s]
                rows.append(dict(shape=shape.name, T=T, impl=name, host_us=statistics.median(host),
                                 host_lo=min(host), host_hi=max(host), wall_us=statistics.median(wall),
                                 wall_lo=min(wall), wall_hi=max(wall), same_bits_as_unplanned=same))
                print(f"{shape.name:15s} T={T:5d} {name:30s} host {rows[-1]['host_us']:8.1f} us "
                      f"wall {rows[-1]['wall_us']:8.1f} us  same bits {same}", flush=True)
        del hf, planned, unplanned, theirs, impls
        torch.cuda.empty_cache()
    held = sum(ws.numel() for ws in _launch._WORKSPACES.values())
    print(f"launch plan workspaces held: {held / 2**20:.0f} MiB")
    (args.out / "probe_prefill_host.json").write_text(json.dumps(
        dict(meta=metadata(), rounds=ROUNDS, calls=CALLS, workspace_bytes=held, rows=rows), indent=1))


if __name__ == "__main__":
    main()
