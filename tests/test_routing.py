"""Routers against the float64 routing of naive_route, and the Routing invariants."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from factories import check_routing, configs, make_input, make_layer
from shufflemoe.reference import routing_triples
from shufflemoe.routing import route, router_logits

DEV = "cuda" if torch.cuda.is_available() else "cpu"  # the kernels: the GPU's or the interpreter


def check_invariants(r, T, k, E):
    A = T * k
    assert r.token_ids.shape == r.expert_ids.shape == r.weights.shape == (A,)
    assert r.counts.shape == (E,) and r.counts.dtype == torch.int32
    n = int(r.num_valid)
    assert int(r.counts.sum()) == n <= A
    assert ((r.token_ids >= 0) & (r.token_ids < max(T, 1))).all() or A == 0
    experts = r.expert_ids[:n]
    expected = torch.repeat_interleave(torch.arange(E), r.counts.long())
    assert torch.equal(experts.long(), expected)  # expert-major
    for e in range(E):  # ascending token order within an expert
        lo, hi = int(r.offsets()[e]), int(r.offsets()[e + 1])
        toks = r.token_ids[lo:hi]
        assert (toks[1:] > toks[:-1]).all()


@settings(max_examples=40)
@given(cfg=configs(dtypes=(torch.float32,), allow_fp8=False, allow_shared=False),
       T=st.integers(0, 70), seed=st.integers(0, 2**16))
def test_router_matches_float64_routing(cfg, T, seed):
    layer = make_layer(cfg, seed)
    x = make_input(cfg, T, seed + 1)
    r = layer.route(x)
    check_invariants(r, T, cfg.top_k, cfg.num_experts)
    check_routing(layer, x, r)


def test_ties_go_to_the_lower_expert():
    cfg_scores = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0]])
    from shufflemoe.ops import index_shuffle

    r = index_shuffle(cfg_scores, 2, scoring="none")
    assert r.expert_ids.tolist() == [1, 2]


def test_capacity_drops_later_tokens_and_counts_them():
    from shufflemoe import MoEConfig

    cfg = MoEConfig(hidden_size=4, intermediate_size=4, num_experts=4, top_k=1, capacity_factor=1.0,
                    dtype=torch.float32)
    logits = torch.full((8, 4), -5.0)
    logits[:, 2] = 5.0  # every token wants expert 2; capacity = ceil(8 * 1 / 4) = 2
    logits[7, 1] = 9.0  # token 7 wants expert 1
    r = route(logits, cfg)
    assert r.counts.tolist() == [0, 1, 2, 0]
    assert int(r.num_valid) == 3
    assert r.token_ids[:3].tolist() == [7, 0, 1]
    assert r.token_ids[3:].tolist() == [2, 3, 4, 5, 6]  # dropped, in token order
    assert r.expert_ids[3:].tolist() == [2] * 5


def test_llama4_weight_is_sigmoid_of_the_logit():
    from shufflemoe import MoEConfig

    cfg = MoEConfig(hidden_size=4, intermediate_size=4, num_experts=3, router="llama4",
                    scoring="sigmoid", apply_router_weight_on_input=True, dtype=torch.float32)
    logits = torch.tensor([[0.5, -1.0, 2.0], [1.5, 0.0, -3.0]])
    r = route(logits, cfg)
    assert r.expert_ids.tolist() == [0, 2] and r.token_ids.tolist() == [1, 0]
    assert r.weights.tolist() == pytest.approx([torch.sigmoid(torch.tensor(1.5)).item(),
                                                torch.sigmoid(torch.tensor(2.0)).item()])


def test_group_limited_only_picks_from_the_best_groups():
    from shufflemoe import MoEConfig

    cfg = MoEConfig(hidden_size=4, intermediate_size=4, num_experts=8, top_k=2, router="group_limited",
                    scoring="sigmoid", n_group=4, topk_group=1, correction_bias=True,
                    routed_scaling_factor=2.0, dtype=torch.float32)
    logits = torch.tensor([[3.0, -3.0, 2.0, 2.0, 0.0, 0.0, -1.0, 2.9]])
    bias = torch.zeros(8)
    # group scores (sum of sigmoids): {0,1} 1.0, {2,3} 1.76, {4,5} 1.0, {6,7} 1.22
    r = route(logits, cfg, bias)
    assert sorted(r.expert_ids.tolist()) == [2, 3]
    s = torch.sigmoid(torch.tensor(2.0)).item()
    assert r.weights.tolist() == pytest.approx([2 * s, 2 * s])
    bias[7] = 10.0  # the bias steers selection only: group {6, 7} now wins, weights stay unbiased
    r = route(logits, cfg, bias)
    assert sorted(r.expert_ids.tolist()) == [6, 7]
    assert sorted(r.weights.tolist()) == pytest.approx(
        sorted([2 * torch.sigmoid(torch.tensor(-1.0)).item(), 2 * torch.sigmoid(torch.tensor(2.9)).item()]))


def test_group_limited_max_scores_a_group_by_its_best():
    """DeepSeek-V2's group_limited_greedy: group {2, 3} (softmax 0.24 + 0.24) beats {0, 1}
    (0.44 + 0.02) on the two best summed, but {0, 1} has the best expert."""
    from shufflemoe import MoEConfig

    logits = torch.tensor([[3.0, 0.0, 2.4, 2.4, 0.0, 0.0, -1.0, -1.0]])
    probs = logits.softmax(1)[0]
    kw = dict(hidden_size=4, intermediate_size=4, num_experts=8, top_k=1, router="group_limited",
              scoring="softmax", n_group=4, topk_group=1, dtype=torch.float32)
    assert (probs[2] + probs[3] > probs[0] + probs[1]) and probs[0] > probs[2]
    assert route(logits, MoEConfig(**kw)).expert_ids.tolist() == [2]
    r = route(logits, MoEConfig(**kw, group_score="max"))
    assert r.expert_ids.tolist() == [0]
    assert r.weights.tolist() == pytest.approx([probs[0].item()])


def test_router_logits_are_in_the_model_dtype():
    x = torch.randn(3, 8, dtype=torch.bfloat16)
    w = torch.randn(4, 8, dtype=torch.bfloat16)
    assert router_logits(x, w).dtype == torch.bfloat16


def _dropping_cfg(router: str, over: str):
    from shufflemoe import MoEConfig

    extra = dict(n_group=2, topk_group=2) if router == "group_limited" else {}
    return MoEConfig(hidden_size=4, intermediate_size=4, num_experts=4, top_k=2, router=router,
                     renormalize=True, capacity_factor=0.5, renormalize_over=over,
                     routed_scaling_factor=2.0, dtype=torch.float32, **extra)


# Every token's first choice is expert 0, second choices 1, 2, 3, 1. capacity = ceil(0.5 * 4 * 2
# / 4) = 1: expert 0 keeps token 0 only, and expert 1 too (token 0 is on it), so token 3 loses
# both its experts, tokens 1 and 2 one each.
_LOGITS = torch.tensor([[3.0, 1.0, -2.0, -2.0],
                        [3.0, -2.0, 0.5, -2.0],
                        [3.0, -2.0, -2.0, 2.0],
                        [3.0, 1.5, -2.0, -2.0]])


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("router", ["topk", "group_limited"])
def test_renormalize_over_kept_experts_after_capacity_drops(router, impl):
    """NxD's order (the Neuron guide's reference): drop past capacity, then normalize over what
    is left, so a token that lost an expert still has weights summing to 1 (times the scaling);
    a token that lost all its experts has no pair and no NaN."""
    from shufflemoe.ops import use_impl

    with use_impl(impl):
        r = route(_LOGITS.to(DEV if impl == "triton" else "cpu"), _dropping_cfg(router, "kept"))
    got = {(t, e): w for t, e, w in routing_triples(r)}
    assert sorted(got) == [(0, 0), (0, 1), (1, 2), (2, 3)]
    p = torch.softmax(_LOGITS.double(), 1)
    assert got[(0, 0)] == pytest.approx((2 * p[0, 0] / (p[0, 0] + p[0, 1])).item(), rel=1e-6)
    assert got[(1, 2)] == pytest.approx(2.0, rel=1e-6)  # lost expert 0: renormalized over one
    assert got[(2, 3)] == pytest.approx(2.0, rel=1e-6)
    assert torch.isfinite(r.weights).all()
    assert (r.weights[int(r.num_valid):] == 0).all()  # dropped pairs weigh nothing


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("router", ["topk", "group_limited"])
def test_renormalize_over_chosen_experts_keeps_the_lost_share_out(router, impl):
    """GShard / Switch order: normalize over the k chosen, then drop; a token that lost an expert
    keeps only its share of the other."""
    from shufflemoe.ops import use_impl

    with use_impl(impl):
        r = route(_LOGITS.to(DEV if impl == "triton" else "cpu"), _dropping_cfg(router, "chosen"))
    got = {(t, e): w for t, e, w in routing_triples(r)}
    p = torch.softmax(_LOGITS.double(), 1)
    want = {(0, 0): 2 * p[0, 0] / (p[0, 0] + p[0, 1]), (0, 1): 2 * p[0, 1] / (p[0, 0] + p[0, 1]),
            (1, 2): 2 * p[1, 2] / (p[1, 0] + p[1, 2]), (2, 3): 2 * p[2, 3] / (p[2, 0] + p[2, 3])}
    assert sorted(got) == sorted(want)
    for key, w in want.items():
        assert got[key] == pytest.approx(w.item(), rel=1e-6)
    assert got[(1, 2)] < 1.0  # the lost expert 0's share is gone
