"""naive_moe: the whole layer in float64, one expert at a time, written to be checked by eye.

It shares no code with the strategies beyond the quantization formulas (ops/quantize/reference.py,
which define the quantized model: weights are dequantized exactly, activations rounded the way
the format's kernels round them) and the GLU's definition (ops/silu_mul/reference.glu). Routing is recomputed in float64 unless a Routing is given; tests pass the
layer's own routing, because float32 and float64 logits may rank two near-equal experts
differently.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .layer import MoE
from .ops.quantize import reference as q
from .ops.quantize.formats import FORMATS
from .ops.silu_mul.reference import glu
from .types import Routing

# What each format's activation quantization does to a GEMM input, in float64.
_FAKE_QUANT = {
    "none": lambda x: x,
    "rowwise": lambda x: q.dequantize_fp8_rowwise(*q.quantize_fp8_rowwise(x)).double(),
    "groups": lambda x: q.dequantize_fp8_groups(*q.quantize_fp8_groups(x)).double(),
}


def _weights64(layer: MoE) -> tuple[Tensor, Tensor]:
    fmt = FORMATS[layer.config.quantization]
    if not fmt.quantized:
        return layer.w13.double(), layer.w2.double()
    return (fmt.dequantize(layer.w13, layer.w13_scale, layer.config.intermediate_size).double(),
            fmt.dequantize(layer.w2, layer.w2_scale, None).double())


def naive_route(layer: MoE, x: Tensor) -> list[tuple[int, int, float]]:
    """Float64 routing -> (token, expert, weight) triples, token by token."""
    cfg = layer.config
    logits = x.double() @ layer.router_weight.double().t()  # [T, E]
    if layer.router_logits_bias is not None:
        logits = logits + layer.router_logits_bias.double()
    E, k = cfg.num_experts, cfg.top_k
    capacity = cfg.capacity(x.shape[0])
    triples = []
    for t in range(x.shape[0]):
        row = logits[t]
        if cfg.router == "group_limited":
            scores = row.softmax(0) if cfg.scoring == "softmax" else row.sigmoid()
            if cfg.round_scores:  # computed in the logits' dtype (LFM2-MoE)
                scores = scores.to(cfg.router_logits_dtype or cfg.dtype).double()
            choice = scores + (0 if layer.router_bias is None else layer.router_bias.double())
            groups = choice.view(cfg.n_group, -1)
            best = groups.topk(min(2 if cfg.group_score == "top2" else 1, groups.shape[1]),
                               dim=1).values.sum(1)
            allowed = torch.zeros(cfg.n_group, dtype=torch.bool)
            allowed[best.topk(cfg.topk_group).indices] = True
            choice = choice.masked_fill(~allowed.repeat_interleave(E // cfg.n_group), -torch.inf)
            experts = choice.topk(k).indices.tolist()
            weights = [scores[e].item() for e in experts]
        else:
            experts = sorted(range(E), key=lambda e: (-row[e].item(), e))[:k]
            if cfg.scoring == "softmax":
                probs = row.softmax(0)
                weights = [probs[e].item() for e in experts]
            else:
                weights = [torch.sigmoid(row[e]).item() for e in experts]
        if cfg.renormalize and not (capacity is not None and cfg.renormalize_over == "kept"):
            weights = [w / sum(weights) for w in weights]
        triples += [(t, e, w) for e, w in zip(experts, weights)]
    if capacity is not None:  # keep the first `capacity` tokens of each expert, in token order
        seen = [0] * E
        kept = []
        for t, e, w in triples:
            if seen[e] < capacity:
                kept.append((t, e, w))
            seen[e] += 1
        triples = kept
        if cfg.renormalize and cfg.renormalize_over == "kept":  # over the experts left (NxD)
            total = [0.0] * x.shape[0]
            for t, _, w in triples:
                total[t] += w
            triples = [(t, e, w / total[t]) for t, e, w in triples]
    triples = [(t, e, w * cfg.routed_scaling_factor) for t, e, w in triples]
    return triples


def routing_triples(routing: Routing) -> list[tuple[int, int, float]]:
    """The routed (token, expert, weight) triples of a Routing."""
    n = int(routing.num_valid)
    return list(zip(routing.token_ids[:n].tolist(), routing.expert_ids[:n].tolist(),
                    routing.weights[:n].tolist()))


def naive_moe(layer: MoE, x: Tensor, routing: Routing | None = None, *,
              with_magnitude: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """x [T, D] -> float64 [T, D]: shared expert + sum of each token's routed experts.

    with_magnitude=True also returns the scale of the rounding error each output may carry, for
    tests (shufflemoe.testing): a GEMM output y = sum_i a_i w_i whose inputs carry independent
    relative errors of order u has an error of order u * sqrt(sum_i (a_i w_i)^2) (errors add like a
    random walk); a_i = silu(g) * up errs relative to |g| * |up| (|silu'(g)| <= 1.1), and g, up
    relative to |g| + sqrt(sum_j (x_j w_j)^2) (a rounding of g, plus its accumulation; gpt-oss's
    (up + 1) errs relative to |up| + 1, and g * sigmoid(alpha g) has the same slope bound as
    silu). The combine adds k + 1 terms, each add rounding relative to the running sum: there
    |terms| add linearly."""
    cfg = layer.config
    x64 = x.double().reshape(-1, cfg.hidden_size)
    triples = naive_route(layer, x) if routing is None else routing_triples(routing)
    w13, w2 = _weights64(layer)
    quant = _FAKE_QUANT[FORMATS[cfg.quantization].activation]
    b13, b2 = (None if b is None else b.double() for b in (layer.w13_bias, layer.w2_bias))

    def rss(a: Tensor, w: Tensor) -> Tensor:  # sqrt(sum_i (a_i w_i)^2): [n, K] x [N, K] -> [n, N]
        return (a.square() @ w.square().t()).sqrt()

    def swiglu(inp: Tensor, w13: Tensor, w2: Tensor, quant=quant, b13=None, b2=None,
               act=("silu", 1.0, None)) -> tuple[Tensor, Tensor | None]:
        xq = quant(inp)  # [n, D]
        h = xq @ w13.t() + (0.0 if b13 is None else b13)  # [n, 2I]
        gate, up = h.chunk(2, dim=1)  # [n, I] each
        a = quant(glu(gate, up, *act))
        y = a @ w2.t() + (0.0 if b2 is None else b2)  # [n, D]
        if not with_magnitude:
            return y, None
        half = w13.shape[0] // 2
        g_mag, up_mag = gate.abs() + rss(xq, w13[:half]), up.abs() + rss(xq, w13[half:])
        if act[0] == "swiglu_oai":
            up_mag = up_mag + 1.0
        return y, rss(1.1 * g_mag * up_mag, w2) + y.abs()

    act = cfg.act

    def of(bias: Tensor | None, e: int) -> Tensor | None:
        return None if bias is None else bias[e]

    by_expert: dict[int, list[tuple[int, float]]] = {}
    for t, e, w in triples:
        by_expert.setdefault(e, []).append((t, w))
    out, mag = torch.zeros_like(x64), torch.zeros_like(x64)
    for e, mine in sorted(by_expert.items()):
        tokens = torch.tensor([t for t, _ in mine], device=x.device)
        w = torch.tensor([w for _, w in mine], dtype=torch.float64, device=x.device)[:, None]
        on_input = cfg.apply_router_weight_on_input
        y, y_mag = swiglu(x64[tokens] * w if on_input else x64[tokens], w13[e], w2[e],
                          b13=of(b13, e), b2=of(b2, e), act=act)
        out.index_add_(0, tokens, y if on_input else y * w)
        if with_magnitude:
            mag.index_add_(0, tokens, y_mag if on_input else y_mag * w.abs())
    if layer.shared_w13 is not None:
        shared, shared_mag = swiglu(x64, layer.shared_w13.double(), layer.shared_w2.double(),
                                    quant=_FAKE_QUANT["none"])
        if layer.shared_gate is not None:
            gate = torch.sigmoid(x64 @ layer.shared_gate.double().t())
            shared = shared * gate
            shared_mag = None if shared_mag is None else shared_mag * gate
        out += shared
        if with_magnitude:
            mag += shared_mag
    return (out.view(x.shape), mag.view(x.shape)) if with_magnitude else out.view(x.shape)
