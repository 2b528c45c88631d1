"""The routing alone under four ways of chaining it with PDL (ops/_pdl.py), in turns (one GPU call, ~2 min).

    PYTHONPATH=src python benchmarks/probe_route_chain.py --out $OUT [--rounds 2]

The index_shuffle suite at abcfba4 (H100, CUDA graphs, back-to-back calls on rotating scores)
had the multi-block routing slower than at 59f9f6f, before the small kernels were chained
(d883840): top-8 over E = 128 at T = 2048 10.96 -> 22.87 us, T = 8192 25.75 -> 55.58. This
probe's first run (9a57ef3, results/probe_route_chain_9a57ef3.json) found why: back to back,
place(i) launched route(i + 1) early and its heavy programs took the SMs unevenly (top-8 T =
8192 chained 55.7 us, unchained 25.8), while after an ordinary launch ("+sep", a one-element
add after every call: in a model the router's GEMM comes before the routing, not a place
kernel) the chain won 8-19% everywhere but at 512 pairs a block (top-8 T = 8192 30.4 / 27.2).
Now the modes, each back to back and +sep, on the suite's shapes and the layer's multi-block
ones (Qwen3-30B-A3B T = 16, Mixtral T = 64..256) as the suite times them (ops.index_shuffle,
impl="triton", rotating bf16 score sets past twice the L2, CUDA-graph replays), checked to give
the same Routing:
- "shipped": the code as it is (multi-block routing launched in stream order, place chained to
  it while a block holds at most index_shuffle.kernel.CHAIN_PAIRS pairs);
- "all": CHAIN_PAIRS unbounded;
- "early": as before (9a57ef3): CHAIN_PAIRS unbounded and the multi-block route kernel launched
  with PDL too;
- "unchained": _pdl.MAX_PROGRAMS = 0.
Writes $OUT/probe_route_chain.json (rows: shape, mode, sep, round, us).
"""

from __future__ import annotations

import argparse
import json
import pathlib

import torch

from shufflemoe.bench.report import metadata
from shufflemoe.bench.timing import rotations, time_fn
from shufflemoe.ops import _pdl, index_shuffle
from shufflemoe.ops.index_shuffle import kernel as shuffle_kernel

SHAPES = ([(k, E, T) for k, E in ((1, 16), (1, 128)) for T in (128, 2048, 4096, 8192)]
          + [(8, 128, T) for T in (16, 128, 2048, 4096, 8192)] + [(2, 8, T) for T in (64, 256)])
MODES = ("shipped", "all", "early", "unchained")
FIELDS = ("counts", "token_ids", "expert_ids", "num_valid", "positions", "weights")


_launch = shuffle_kernel.launch


def _early_launch(fn, grid, *args, **kwargs):
    """shuffle_kernel.launch, with a chained route kernel launched with PDL as before."""
    if fn is shuffle_kernel._route_kernel and kwargs.get("PDL"):
        kwargs["launch_pdl"] = True
    return _launch(fn, grid, *args, **kwargs)


def _mode(mode: str, bound: int, pairs: int) -> None:
    _pdl.MAX_PROGRAMS = 0 if mode == "unchained" else bound
    shuffle_kernel.CHAIN_PAIRS = pairs if mode == "shipped" else 1 << 30
    shuffle_kernel.launch = _early_launch if mode == "early" else _launch


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=pathlib.Path)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    bound, pairs = _pdl.MAX_PROGRAMS, shuffle_kernel.CHAIN_PAIRS
    rows = []
    for k, E, T in SHAPES:
        n_sets = rotations(T * E * 2)
        g = torch.Generator(device="cuda").manual_seed(T + E)
        sets = [torch.randn(T, E, device="cuda", generator=g).to(torch.bfloat16)
                for _ in range(n_sets)]

        bump = torch.zeros(1, device="cuda")

        def route(i: int, sep: bool = False):
            r = index_shuffle(sets[i], k, impl="triton")
            if sep:
                bump.add_(1.0)
            return r

        outs = {}
        for mode in MODES:
            _mode(mode, bound, pairs)
            outs[mode] = route(0)
        same = all(torch.equal(getattr(outs[m], f), getattr(outs["unchained"], f))
                   for m in MODES for f in FIELDS)
        for r in range(args.rounds):
            for sep in (False, True):
                for mode in MODES:
                    _mode(mode, bound, pairs)
                    t = time_fn(lambda i: route(i, sep), n_sets, graph=True, reps=40)
                    rows.append(dict(k=k, E=E, T=T, mode=mode, sep=sep, round=r,
                                     us=t.median_us, p20=t.p20_us, p80=t.p80_us, same=same))
                    print(f"top-{k} E={E} T={T} {mode}{'+sep' if sep else ''} round {r}: "
                          f"{t.median_us:.2f} us [{t.p20_us:.2f}, {t.p80_us:.2f}]"
                          f"{'' if same else ' DIFFERENT ROUTING'}", flush=True)
    _mode("shipped", bound, pairs)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "probe_route_chain.json").write_text(
        json.dumps(dict(meta=metadata(), max_programs=bound, chain_pairs=pairs, rows=rows),
                   indent=1, default=str))


if __name__ == "__main__":
    main()
