"""Slicing: counts read on the host, then one matmul pair per expert on its exact slice of the
sorted pairs. No padding, but E launches of small shapes and a host sync per layer."""

from __future__ import annotations

from ..ops import backend_for
from .base import Experts, expert_gemm, gather_input, glu, pair_weights, register


@register
class Sliced(Experts):
    name = "sliced"
    graph_safe = False
    summary = "one GEMM per expert on its slice (host sync, E launches)"

    def forward(self, x, routing, weights, out, cfg, before_combine=lambda: None):
        r, w = routing, weights
        counts = r.counts.tolist()  # host sync
        w_in, w_out = pair_weights(r, cfg)
        ops = backend_for(x)
        xs = gather_input(ops, x, r.token_ids, w_in, w, num_valid=r.num_valid)
        y = out.new_empty(r.num_pairs, out.shape[1])  # [A, D] pair rows, combined below
        start = 0
        for e, c in enumerate(counts):
            if c == 0:
                continue
            rows = slice(start, start + c)
            start += c
            size = r.counts[e : e + 1]  # a view of the device counts: no copy
            inp = tuple(t[rows] for t in xs) if isinstance(xs, tuple) else xs[rows]
            we = w.experts(e, e + 1)
            h = expert_gemm(ops, inp, we, "w13", size, cfg.dtype)
            a = glu(ops, h, we, cfg)
            expert_gemm(ops, a, we, "w2", size, cfg.dtype,
                        row_weights=None if w_out is None else w_out[rows], out=y[rows])
        before_combine()
        ops.token_sum(out, y, r.positions, None, r.num_valid, None)
