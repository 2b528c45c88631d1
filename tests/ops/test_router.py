"""The router's logits at decode sizes (ops/router): the one-launch Triton GEMV (interpreter on
the CPU, the GPU when there is one) against float64, rounded once: every logit within one step
of its dtype of the exactly rounded value and nearly all equal to it; the bias added before the
rounding; F.linear above GEMV_MAX_TOKENS; the output starts poisoned. router_route (the routing
in the router's launch): its logits as above, its Routing the float64 loop's top-k and sort of
those logits and bit for bit the two launches' (router_logits, then index_shuffle)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from test_index_shuffle import INDEX_FIELDS, check_against_loop, loop_sort, loop_topk

from shufflemoe.ops import _arrival, ops_for
from shufflemoe.ops.router import GEMV_MAX_TOKENS, ROUTE_MAX_TOKENS
from shufflemoe.ops.router import kernel
from shufflemoe.testing import poisoned

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"


def check(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> None:
    """Within one step of the dtype of the exactly rounded logit, plus what an fp32 sum of D
    products may lose (nothing a bf16 step sees); from bf16 inputs (exact fp32 products) nearly
    every logit is the exactly rounded one."""
    ref = x.double() @ w.double().t() + (0.0 if bias is None else bias.double())
    want = ref.to(got.dtype)  # rounded once, to nearest even
    assert got.dtype == x.dtype and got.shape == ref.shape
    assert not torch.isnan(got).any(), "a logit was not written"
    step = (want.double().abs() * torch.finfo(got.dtype).eps).clamp_min(2.0 ** -126)
    mag = x.double().abs() @ w.double().abs().t()
    sum_err = 2 * x.shape[1] ** 0.5 * torch.finfo(torch.float32).eps * mag
    off = (got.double() - want.double()).abs()
    assert bool((off <= step * 1.001 + sum_err).all()), float((off / step).max())
    if got.dtype != torch.float32:
        assert float((got == want).double().mean()) >= 0.98


@pytest.mark.parametrize("T,E,D", [(1, 16, 5120), (2, 7, 130), (3, 128, 64), (5, 1, 40),
                                   (8, 256, 72), (1, 8, 4096)])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_kernel_matches_float64(T, E, D, bias, dtype):
    g = torch.Generator().manual_seed(T * 1000 + E + D)
    x = torch.randn(T, D, generator=g).to(DEV, dtype)
    w = (torch.randn(E, D, generator=g) / D**0.5).to(DEV, dtype)
    b = torch.randn(E, generator=g).to(DEV, dtype) if bias else None
    out = poisoned(T, E, dtype=dtype, device=DEV)
    kernel._router_op(x, w, b, out)
    check(out, x, w, b)


def test_strided_rows_and_no_tokens():
    """Rows of x and of the router weight with a stride (slices of wider rows) read right; a
    weight or bias whose columns are strided goes to F.linear; T = 0 writes nothing."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 96, generator=g).to(DEV, torch.bfloat16)[:, :80]
    w = (torch.randn(16, 112, generator=g) / 9).to(DEV, torch.bfloat16)[:, 8:88]
    out = poisoned(4, 16, dtype=torch.bfloat16, device=DEV)
    kernel._router_op(x, w, None, out)
    check(out, x, w, None)
    check(kernel.router_logits(x, w, None), x, w, None)
    wt = w.t().contiguous().t()  # [E, D] with column stride E
    b = torch.randn(32, generator=g).to(DEV, torch.bfloat16)[::2]
    for ww, bb in ((wt, None), (w, b)):
        assert torch.equal(kernel.router_logits(x, ww, bb), torch.nn.functional.linear(x, ww, bb))
    empty = kernel.router_logits(x[:0], w, None)
    assert empty.shape == (0, 16)


def test_ops_entry_switches_to_f_linear_past_the_gemv():
    """Ops.router_logits: the kernel up to GEMV_MAX_TOKENS tokens, F.linear (bit for bit) past."""
    g = torch.Generator().manual_seed(5)
    w = (torch.randn(32, 64, generator=g) / 8).to(DEV, torch.bfloat16)
    for T in (GEMV_MAX_TOKENS, GEMV_MAX_TOKENS + 1):
        x = torch.randn(T, 64, generator=g).to(DEV, torch.bfloat16)
        got = ops_for("triton").router_logits(x, w, None)
        check(got, x, w, None)
        if T > GEMV_MAX_TOKENS:
            assert torch.equal(got, torch.nn.functional.linear(x, w))
    assert torch.equal(ops_for("torch").router_logits(x, w, None),
                       torch.nn.functional.linear(x, w))


def _route_inputs(T: int, E: int, D: int, bias: bool, seed: int, one_expert: int | None = None):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, D, generator=g).to(DEV, torch.bfloat16)
    w = (torch.randn(E, D, generator=g) / D**0.5).to(DEV, torch.bfloat16)
    b = torch.randn(E, generator=g).to(DEV, torch.bfloat16) if bias else None
    if one_expert is not None:  # every token's best expert: a bias far above any logit
        b = torch.zeros(E, dtype=torch.bfloat16, device=DEV) if b is None else b
        b[one_expert] = 64.0
    return x, w, b


def _poisoned_routing(T: int, E: int, k: int) -> list[torch.Tensor]:
    A = T * k
    ints = [torch.full((n,), -7, dtype=torch.int32, device=DEV) for n in (E, A, A)]
    return ints + [poisoned(A, dtype=torch.float32, device=DEV)] + [
        torch.full((n,), -7, dtype=torch.int32, device=DEV) for n in (1, A)]


# (T, E, D, k, scoring, renormalize, capacity, bias, all tokens on one expert)
ROUTE_CASES = [
    (1, 16, 5120, 1, "sigmoid", False, None, False, None),  # Llama 4 Scout
    (1, 128, 2048, 8, "softmax", True, None, False, None),  # Qwen3-30B-A3B
    (2, 32, 288, 4, "softmax", False, None, True, None),  # gpt-oss-like, logits' bias
    (3, 7, 130, 2, "none", False, 2, False, None),  # odd sizes, capacity drops pairs
    (5, 256, 72, 8, "softmax", True, 3, False, None),  # E = 256, experts with no tokens
    (8, 8, 4096, 2, "softmax", True, None, False, None),  # Mixtral, the most tokens
    (6, 12, 96, 1, "sigmoid", False, None, False, 5),  # all tokens on one expert
    (4, 5, 64, 5, "none", False, 1, True, 0),  # k = E, capacity 1
]


@pytest.mark.parametrize("case", ROUTE_CASES, ids=lambda c: f"T{c[0]}-E{c[1]}-k{c[3]}-{c[4]}")
def test_router_route_matches_float64_and_the_two_launches(case):
    T, E, D, k, scoring, renorm, capacity, bias, one = case
    x, w, b = _route_inputs(T, E, D, bias, T * 97 + E, one)
    out = poisoned(T, E, dtype=torch.bfloat16, device=DEV)
    fields = _poisoned_routing(T, E, k)
    kernel._router_route_op(x, w, b, out, *fields, kernel.held_words(x, kernel.ROUTE_WORKSPACE),
                            k, kernel.SCORING_IDS[scoring], renorm, 1.25, capacity)
    check(out, x, w, b)
    got = dict(zip(("counts", "token_ids", "expert_ids", "weights", "num_valid", "positions"),
                   fields))
    ids, weights = loop_topk(out.cpu(), k, scoring, renorm, 1.25)
    check_against_loop(SimpleNamespace(**got), loop_sort(ids, weights, E, capacity))
    if one is not None:
        assert int(got["counts"][one]) == (T if capacity is None else min(T, capacity))
    tr = ops_for("triton")
    two = tr.index_shuffle(tr.router_logits(x, w, b), k, scoring, renorm, 1.25, capacity)
    for f in INDEX_FIELDS + ("weights",):
        assert torch.equal(got[f], getattr(two, f)), f
    words = _arrival._WORDS[x.device, kernel.ROUTE_WORKSPACE]
    assert all(int(words_.abs().sum()) == 0 for words_ in words)  # left at zero


def test_router_route_entry():
    """Ops.router_route: one launch up to ROUTE_MAX_TOKENS tokens, the two launches past it, T = 0
    an empty Routing; the torch entry routes F.linear's logits."""
    tr, ref = ops_for("triton"), ops_for("torch")
    for T in (0, ROUTE_MAX_TOKENS, ROUTE_MAX_TOKENS + 1):
        x, w, b = _route_inputs(T, 24, 80, True, T)
        got = tr.router_route(x, w, b, 3, "softmax", True, 1.0, None)
        two = tr.index_shuffle(tr.router_logits(x, w, b), 3, "softmax", True, 1.0, None)
        want = ref.router_route(x, w, b, 3, "softmax", True, 1.0, None)
        assert want.counts.tolist() == ref.index_shuffle(
            torch.nn.functional.linear(x, w, b), 3, "softmax", True, 1.0, None).counts.tolist()
        for f in INDEX_FIELDS + ("weights",):
            assert torch.equal(getattr(got, f), getattr(two, f)), (T, f)
        assert int(got.num_valid) == 3 * T and int(got.counts.sum()) == 3 * T
