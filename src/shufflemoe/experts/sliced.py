"""Slicing: counts read on the host, then one matmul pair per expert on its exact slice of the
sorted pairs. No padding, but E launches of small shapes and a host sync per layer."""

from __future__ import annotations

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
        xs = gather_input(x, r.token_ids, w_in, w, num_valid=r.num_valid)
        joined, start = False, 0
        for e, c in enumerate(counts):
            if c == 0:
                continue
            rows = slice(start, start + c)
            start += c
            size = r.counts[e : e + 1]  # a view of the device counts: no copy
            inp = tuple(t[rows] for t in xs) if isinstance(xs, tuple) else xs[rows]
            we = w.experts(e, e + 1)
            h = expert_gemm(inp, we, "w13", size, cfg.dtype)
            a = glu(h, we, cfg)
            if not joined:
                before_combine()
                joined = True
            # one expert's rows reach distinct tokens, and launches run in order: no atomics
            expert_gemm(a, we, "w2", size, cfg.dtype,
                        row_weights=None if w_out is None else w_out[rows],
                        scatter_ids=r.token_ids[rows], out=out, scatter_unique=True)
