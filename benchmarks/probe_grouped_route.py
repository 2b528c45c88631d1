"""DeepSeek-V3's grouped selection in index_shuffle's kernel (cf9ea91) against the torch ops that
routed it before (the selection in ~15 torch ops, then sort_by_expert's launch). One GPU call,
about a minute:

    PYTHONPATH=src python benchmarks/probe_grouped_route.py --out $OUT
    PYTHONPATH=src python benchmarks/probe_grouped_route.py --out /tmp/x --dry-run   # CPU logic

1. The routing alone, per router shape and T: both ways' chosen (token, expert) pairs and dense
   weights against each other (the same experts, weights within float32 rounding), then CUDA
   graphs of 64 calls on rotating logits (GPU time) and eager calls in turns (each call's wall
   time, ABAB: the host bounds these); beside them, for scale, the kernel's plain top-k of the
   same logits (no groups, no bias).
2. One layer at DeepSeek-V3 TP8 widths (E = 256, 8 groups, top-8, D = 7168, I = 256, its shared
   expert of 256), eager calls at T = 1, 2, 8: host time to issue a call and wall time per call
   (back-to-back calls from a drained queue, both ways in turns, median of ROUNDS), and one CUDA
   graph's replay (GPU time). The old way is the layer with its group_limited router swapped
   for the torch ops; its region then holds torch ops, so it runs unplanned.
3. The grouped kernel's tiling (--tiles, alone: this part only): per router shape at T = 1 to
   2048, CUDA graphs of the routing with grouped_config's choice, one program (num_warps 1 to
   8; to T = 16), and blocks of 1 to min(T / 2, 16) tokens (4 warps; blocks of 1 and 2 also
   2), with their place launch, on the same rotating logits; a tiling that chooses other
   experts, or weights more than 1e-6 apart (softmax sums in another order), is marked.
Writes $OUT/probe_grouped_route.json (--tiles: probe_grouped_route_tiles.json).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import pathlib
import statistics
import sys

if "--dry-run" in sys.argv and not os.environ.get("TRITON_INTERPRET"):
    os.environ["TRITON_INTERPRET"] = "1"  # before triton decorates any kernel

import torch  # noqa: E402

from shufflemoe import MoE, routing  # noqa: E402
from shufflemoe.bench.report import metadata  # noqa: E402
from shufflemoe.bench.suites import host_cost  # noqa: E402
from shufflemoe.bench.timing import time_fn, time_turns  # noqa: E402
from shufflemoe.ops import backend_for, index_shuffle, use_impl  # noqa: E402
from shufflemoe.ops.index_shuffle import kernel as route_kernel  # noqa: E402
from shufflemoe.presets import preset  # noqa: E402

SHAPES = {  # name: (E, (n_group, topk_group), k, scoring, scaling)
    "deepseek-v3 (E=256, 8 groups of 32, 4 kept, top-8)": (256, (8, 4), 8, "sigmoid", 2.5),
    "kimi-k2-like (E=384, one group, top-8)": (384, (1, 1), 8, "sigmoid", 2.827),
    "glm-4.5-like (E=160, one group, top-8)": (160, (1, 1), 8, "sigmoid", 2.5),
    "deepseek-v2-like (E=160, 8 groups of 20, 3 kept, top-6, softmax)": (160, (8, 3), 6,
                                                                       "softmax", 16.0),
}
TOKENS = (1, 2, 4, 8, 16, 64, 256)
TILE_TOKENS = (1, 2, 4, 8, 16, 64, 256, 2048)
LAYER_TOKENS = (1, 2, 8)
SETS, CALLS, ROUNDS = 64, 20, 15


def torch_ops_routing(logits, k, groups, bias, scoring, scaling):
    """The routing as routing.py made it before cf9ea91: the selection in torch ops, renormalized
    with DeepSeek's epsilon, then sort_by_expert."""
    T, E = logits.shape
    n_group, topk_group = groups
    s = logits.float()
    score = torch.softmax(s, -1) if scoring == "softmax" else s.sigmoid()
    choice = score + bias.float()
    per_group = choice.view(T, n_group, E // n_group)
    group_score = per_group.topk(min(2, E // n_group), dim=-1).values.sum(-1)
    kept = group_score.topk(topk_group, dim=-1, sorted=False).indices
    drop = torch.ones_like(group_score, dtype=torch.bool).scatter_(1, kept, False)
    drop = drop[:, :, None].expand_as(per_group).reshape(T, E)
    ids = choice.masked_fill(drop, float("-inf")).topk(k, dim=-1, sorted=False).indices
    w = score.gather(1, ids)
    w = w / (w.sum(-1, keepdim=True) + 1e-20) * scaling
    return backend_for(logits).sort_by_expert(ids, E, w, None, True)


def kernel_routing(logits, k, groups, bias, scoring, scaling):
    return index_shuffle(logits, k, scoring=scoring, renormalize=True, scaling=scaling,
                         groups=groups, bias=bias)


def plain_kernel_routing(logits, k, groups, bias, scoring, scaling):
    """The plain top-k of the same logits (no groups, no bias): the kernel's cost without the
    grouped selection, for scale."""
    return index_shuffle(logits, k, scoring=scoring, renormalize=True, scaling=scaling)


def _agree(a, b, T: int) -> tuple[bool, float]:
    """(same (token, expert) pairs, largest weight difference) of two Routings of T tokens."""
    da, db = a.dense_weights(T), b.dense_weights(T)
    return torch.equal(da != 0, db != 0), float((da - db).abs().max()) if da.numel() else 0.0


def _cases(dev: str, sets: int, tokens: tuple[int, ...]):
    """(shape name, its SHAPES entry, a correction bias, T, ``sets`` logits [T, E]) per case."""
    for name, shape in SHAPES.items():
        bias = torch.randn(shape[0], device=dev) * 0.05
        for T in tokens:
            yield name, shape, bias, T, [torch.randn(T, shape[0], device=dev,
                                                     dtype=torch.bfloat16) for _ in range(sets)]


def routing_rows(dev: str, sets: int, graph: bool) -> list[dict]:
    rows = []
    for name, (E, groups, k, scoring, scaling), bias, T, logits in _cases(dev, sets, TOKENS):
        ways = {"torch ops": torch_ops_routing, "kernel": kernel_routing,
                "plain top-k kernel": plain_kernel_routing}
        runs = {w: (lambda i, f=f: f(logits[i], k, groups, bias, scoring, scaling))
                for w, f in ways.items()}
        same, diff = _agree(runs["kernel"](0), runs["torch ops"](0), T)
        row = dict(shape=name, T=T, same_pairs=same, max_weight_diff=diff)
        eager = time_turns(runs, sets, reps=3 * sets, warmup=1)
        for way, run in runs.items():
            row[f"{way} eager_us"] = eager[way].median_us
            if graph:
                row[f"{way} graph_us"] = time_fn(run, sets, graph=True, reps=30).median_us
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def tile_rows(dev: str, sets: int, graph: bool) -> list[dict]:
    """Section 3: the grouped kernel's routing under each tiling, GPU time per call."""
    rows = []
    for name, (E, groups, k, scoring, scaling), bias, T, logits in _cases(dev, sets, TILE_TOKENS):
        chosen = route_kernel.grouped_config(T, E, k, groups[0])
        tilings = {"chosen": chosen}
        for warps in (1, 2, 4, 8) if T <= 16 else ():
            tilings[f"one program, {warps} warps"] = dataclasses.replace(
                chosen, block_tokens=max(chosen.block_tokens, 1 << (T - 1).bit_length()),
                single=True, num_warps=warps)
        bt = 1
        while (bt < T or bt == 1) and bt <= 16:
            for warps in (2, 4) if bt <= 2 else (4,):
                tilings[f"blocks of {bt}" + ", 2 warps" * (warps == 2)] = dataclasses.replace(
                    chosen, block_tokens=bt, single=False, num_warps=warps)
            bt *= 2
        row = dict(shape=name, T=T, chosen=dataclasses.asdict(chosen), tilings=list(tilings))
        want = kernel_routing(logits[0], k, groups, bias, scoring, scaling)
        for tiling, cfg in tilings.items():
            def run(i, cfg=cfg):
                return route_kernel.index_shuffle(logits[i], k, scoring, True, scaling, None,
                                                  cfg, groups=groups, bias=bias)
            same, diff = _agree(run(0), want, T)  # (softmax: its sum's order per tiling)
            if not same or diff > 1e-6:
                row[f"{tiling} differs"] = diff
            if graph:
                row[f"{tiling} graph_us"] = time_fn(run, sets, graph=True, reps=30).median_us
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


@contextlib.contextmanager
def torch_ops_router():
    """The layer's group_limited router as before cf9ea91 (paths gathered inside take it)."""
    entry = routing.ROUTERS._entries["group_limited"]

    def old(logits, cfg, bias):
        return torch_ops_routing(logits, cfg.top_k, (cfg.n_group, cfg.topk_group), bias,
                                 cfg.scoring, cfg.routed_scaling_factor)

    routing.ROUTERS._entries["group_limited"] = old
    try:
        yield
    finally:
        routing.ROUTERS._entries["group_limited"] = entry


def layer_rows(dev: str, rounds: int, calls: int, graph: bool, **widths) -> list[dict]:
    cfg = preset("deepseek-v3", tp=8, **widths)
    host_cost.DEVICE = dev  # its _sample syncs only on CUDA
    old, new = MoE(cfg, device=dev).eval(), MoE(cfg, device=dev).eval()
    new.router_bias.data.normal_(0.0, 0.05)
    old.load_state_dict(new.state_dict())
    with torch_ops_router():  # gathered now, its paths keep the old router
        old._hot()
    layers = {"torch ops": old, "kernel": new}
    rows = []
    for T in LAYER_TOKENS:
        g = torch.Generator().manual_seed(T)
        xs = [torch.randn(T, cfg.hidden_size, generator=g).to(dev, cfg.dtype) for _ in range(2)]
        row = dict(T=T)
        with torch.no_grad():
            outs = {w: layer(xs[0]) for w, layer in layers.items()}
            # the routers' weights agree to ~1e-6, so an output may round the other way
            row["max_abs_diff"] = float((outs["kernel"].float() - outs["torch ops"].float())
                                        .abs().max())
            row["max_abs"] = float(outs["kernel"].float().abs().max())
            runs = {w: (lambda layer=layer: [layer(x) for x in xs]) for w, layer in layers.items()}
            for fn in runs.values():
                fn()
            samples = {w: [] for w in runs}
            for _ in range(rounds):
                for w, fn in runs.items():
                    samples[w].append(host_cost._sample(fn, calls // 2))
            for w in runs:
                row[f"{w} host_us"] = statistics.median(s[0] for s in samples[w]) / 2
                row[f"{w} wall_us"] = statistics.median(s[1] for s in samples[w]) / 2
                if graph:
                    row[f"{w} graph_us"] = time_fn(lambda i, layer=layers[w]: layer(xs[i]), 2,
                                                   graph=True, reps=30).median_us
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=pathlib.Path)
    p.add_argument("--dry-run", action="store_true", help="CPU, interpreter, tiny counts")
    p.add_argument("--tiles", action="store_true", help="section 3 only")
    args = p.parse_args()
    global TOKENS, LAYER_TOKENS, TILE_TOKENS
    if args.dry_run:
        TOKENS, LAYER_TOKENS, TILE_TOKENS = (1, 9), (1,), (3,)  # one program and blocks
        impl, dev, sets, rounds, calls, graph = use_impl("triton"), "cpu", 1, 1, 2, False
    else:
        impl, dev, sets, rounds, calls, graph = (contextlib.nullcontext(), "cuda", SETS, ROUNDS,
                                                 CALLS, True)
    if args.tiles:
        with impl:
            result = dict(meta=metadata(), tiles=tile_rows(dev, sets, graph))
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "probe_grouped_route_tiles.json").write_text(json.dumps(result, indent=1))
        return
    with impl:
        widths = dict(hidden_size=64, intermediate_size=32, shared_intermediate_size=32) \
            if args.dry_run else {}
        result = dict(meta=metadata(), routing=routing_rows(dev, sets, graph),
                      layer=layer_rows(dev, rounds, calls, graph, **widths))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "probe_grouped_route.json").write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
