"""The routing alone with and without the PDL chain (ops/_pdl.py), in turns (one GPU call, ~1 min).

    PYTHONPATH=src python benchmarks/probe_route_chain.py --out $OUT [--rounds 2]

The index_shuffle suite at abcfba4 (H100, CUDA graphs, back-to-back calls on rotating scores)
had the multi-block routing slower than at 59f9f6f, before the small kernels were chained
(d883840): top-8 over E = 128 at T = 2048 10.96 -> 22.87 us, T = 8192 25.75 -> 55.58; top-1
E = 128 T = 4096 8.41 -> 9.93, T = 8192 10.51 -> 15.89; while T = 128 and E = 16 got faster
(T = 2048 E = 16 4.82 -> 3.83). Nothing else in the multi-block path changed between them
(4eb8288 and abcfba4 touched one-program routing only), so the chain is the suspect. This
times the suite's shapes as the suite does (ops.index_shuffle, impl="triton", rotating bf16
score sets past twice the L2, CUDA-graph replays) with the chain on (the default: grids of at
most _pdl.MAX_PROGRAMS programs) and off (MAX_PROGRAMS = 0), alternating, and checks both give
the same Routing. Each also with a one-element add (an ordinary launch) after every call
("+sep"): in a model the routing follows the router's GEMM, not the previous call's place
kernel, so the suite's back-to-back calls chain route(i + 1) to place(i) where a layer does
not; if only the back-to-back rows lose, the suite's pattern is the cause (an early launch
fixes where the next route's programs sit while the SMs are unevenly busy), not the layer's
chain. Writes $OUT/probe_route_chain.json (rows: shape, chain, sep, round, us).
"""

from __future__ import annotations

import argparse
import json
import pathlib

import torch

from shufflemoe.bench.report import metadata
from shufflemoe.bench.timing import rotations, time_fn
from shufflemoe.ops import _pdl, index_shuffle

SHAPES = [(k, E, T) for k, E in ((1, 16), (1, 128)) for T in (128, 2048, 4096, 8192)] + [
    (8, 128, T) for T in (128, 2048, 8192)]
FIELDS = ("counts", "token_ids", "expert_ids", "num_valid", "positions", "weights")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=pathlib.Path)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    bound = _pdl.MAX_PROGRAMS
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
        for chain in (True, False):
            _pdl.MAX_PROGRAMS = bound if chain else 0
            outs[chain] = route(0)
        same = all(torch.equal(getattr(outs[True], f), getattr(outs[False], f)) for f in FIELDS)
        for r in range(args.rounds):
            for sep in (False, True):
                for chain in (True, False):
                    _pdl.MAX_PROGRAMS = bound if chain else 0
                    t = time_fn(lambda i: route(i, sep), n_sets, graph=True, reps=40)
                    rows.append(dict(k=k, E=E, T=T, chain=chain, sep=sep, round=r,
                                     us=t.median_us, p20=t.p20_us, p80=t.p80_us, same=same))
                    print(f"top-{k} E={E} T={T} {'chained' if chain else 'unchained'}"
                          f"{'+sep' if sep else ''} round {r}: {t.median_us:.2f} us "
                          f"[{t.p20_us:.2f}, {t.p80_us:.2f}]"
                          f"{'' if same else ' DIFFERENT ROUTING'}", flush=True)
    _pdl.MAX_PROGRAMS = bound
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "probe_route_chain.json").write_text(
        json.dumps(dict(meta=metadata(), max_programs=bound, rows=rows), indent=1, default=str))


if __name__ == "__main__":
    main()
