"""IndexShuffling: the torch reference against a plain Python loop (float64 weights), and the
Triton kernel (interpreter on the CPU, the GPU when there is one) against the reference: every
index output equal over all A pairs (tail order included; positions too), weights within
float32; positions is the inverse permutation of the pair order."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from shufflemoe.ops import index_shuffle, ops_for, sort_by_expert
from shufflemoe.testing import assert_close

pytest.importorskip("triton")
from shufflemoe.ops.index_shuffle.kernel import (  # noqa: E402
    RouteConfig, grouped_config, route_config)
from shufflemoe.ops.index_shuffle import kernel as route_kernel  # noqa: E402

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
INDEX_FIELDS = ("counts", "token_ids", "expert_ids", "num_valid", "positions")


def _int32(v: int) -> int:
    return (v + 2**31) % 2**32 - 2**31


def loop_sort(ids: list[list[int]], weights: list[list[float]], E: int, capacity: int | None):
    """Expected Routing fields as lists: kept pairs expert-major, then pairs over capacity
    expert-major, then pairs routed nowhere, pair order inside each; positions: where each pair
    (in t * k + j order) ended up."""
    per_expert: list[list] = [[] for _ in range(E)]
    nowhere = []
    for t, (row, wrow) in enumerate(zip(ids, weights)):
        for j, (e, w) in enumerate(zip(row, wrow)):
            (per_expert[e] if 0 <= e < E else nowhere).append((t, _int32(e), w, t * len(row) + j))
    kept = [p if capacity is None else p[:capacity] for p in per_expert]
    over = [[] if capacity is None else p[capacity:] for p in per_expert]
    order = [q for p in kept for q in p] + [q for p in over for q in p] + nowhere
    positions = [0] * len(order)
    for i, q in enumerate(order):
        positions[q[3]] = i
    counts = [len(p) for p in kept]
    return dict(counts=counts, token_ids=[q[0] for q in order], expert_ids=[q[1] for q in order],
                weights=[q[2] for q in order], num_valid=[sum(counts)], positions=positions)


def loop_topk(scores: torch.Tensor, k: int, scoring: str, renormalize: bool, scaling: float):
    """Per token: the k best experts (ties to the lower id) and their float64 weights."""
    ids, weights = [], []
    for row in scores.double().tolist():
        best = sorted(range(len(row)), key=lambda e: (-row[e], e))[:k]
        if scoring == "softmax":
            m = max(row)
            z = sum(math.exp(v - m) for v in row)
            w = [math.exp(row[e] - m) / z for e in best]
        elif scoring == "sigmoid":
            w = [1.0 / (1.0 + math.exp(-row[e])) for e in best]
        else:
            w = [row[e] for e in best]
        if renormalize:
            s = sum(w)
            w = [v / s for v in w]
        ids.append(best)
        weights.append([v * scaling for v in w])
    return ids, weights


def check_against_loop(r, want: dict) -> None:
    for f in INDEX_FIELDS:
        assert getattr(r, f).tolist() == want[f], f
    assert_close(r.weights, torch.tensor(want["weights"], dtype=torch.float64), "float32",
                 name="weights")


def check_same(got, ref) -> None:
    """Kernel Routing == reference Routing: indices exactly, weights within float32."""
    for f in INDEX_FIELDS:
        a, b = getattr(got, f).cpu(), getattr(ref, f).cpu()
        assert a.dtype == b.dtype and torch.equal(a, b), f"{f}: {a.tolist()[:16]} vs {b.tolist()[:16]}"
    assert_close(got.weights, ref.weights.double(), "float32", name="weights")


def scores_for(T: int, E: int, dtype=torch.bfloat16, seed: int = 0, device: str = DEV):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(T, E, generator=g).to(device=device, dtype=dtype)


# ---- the reference against the loop -------------------------------------------------------------

@given(T=st.integers(0, 40), E=st.integers(1, 20), k=st.integers(1, 8),
       scoring=st.sampled_from(["none", "softmax", "sigmoid"]), renormalize=st.booleans(),
       capacity=st.one_of(st.none(), st.integers(0, 6)), seed=st.integers(0, 2**16))
def test_reference_matches_loop(T, E, k, scoring, renormalize, capacity, seed):
    k = min(k, E)
    scores = scores_for(T, E, torch.bfloat16, seed, "cpu")  # bf16: many exact ties
    r = index_shuffle(scores, k, scoring=scoring, renormalize=renormalize, scaling=1.5,
                      capacity=capacity, impl="torch")
    ids, weights = loop_topk(scores, k, scoring, renormalize, 1.5)
    check_against_loop(r, loop_sort(ids, weights, E, capacity))


@given(T=st.integers(0, 30), E=st.integers(1, 20), k=st.integers(1, 8),
       capacity=st.one_of(st.none(), st.integers(0, 5)), seed=st.integers(0, 2**16))
def test_sort_reference_matches_loop(T, E, k, capacity, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(-2, E + 2, (T, k), generator=g)
    w = torch.rand(T, k, generator=g)
    r = sort_by_expert(ids, E, w, capacity=capacity, impl="torch")
    check_against_loop(r, loop_sort(ids.tolist(), w.double().tolist(), E, capacity))
    # ids known valid (a router's own top-k): the same routing, masking skipped
    valid = ids.clamp(0, E - 1)
    fast = ops_for("torch").sort_by_expert(valid, E, w, capacity, True)
    check_against_loop(fast, loop_sort(valid.tolist(), w.double().tolist(), E, capacity))
    assert fast.all_routed == (capacity is None)


def loop_groups(scores: torch.Tensor, bias: torch.Tensor | None, k: int, n_group: int,
                topk_group: int, renormalize: bool, scaling: float, group_best: int = 2):
    """DeepSeek-V3's selection per token in float64, on the scores themselves (scoring "none"):
    the choice is score + bias, a group scores its ``group_best`` best choices summed (2: V3, 1:
    DeepSeek-V2's group_limited_greedy; its one when it has one), the topk_group
    best groups stay (ties to the lower group), then the k best choices in them (ties to the
    lower id); weights are the scores, renormalized with 1e-20."""
    E = scores.shape[1]
    size = E // n_group
    b = [0.0] * E if bias is None else bias.double().tolist()
    ids, weights = [], []
    for row in scores.double().tolist():
        choice = [v + bv for v, bv in zip(row, b)]
        group_score = [sum(sorted(choice[g * size:(g + 1) * size], reverse=True)[:group_best])
                       for g in range(n_group)]
        kept = sorted(range(n_group), key=lambda g: (-group_score[g], g))[:topk_group]
        allowed = [e for g in sorted(kept) for e in range(g * size, (g + 1) * size)]
        best = sorted(allowed, key=lambda e: (-choice[e], e))[:k]
        w = [row[e] for e in best]
        if renormalize:
            total = sum(w) + 1e-20
            w = [v / total for v in w]
        ids.append(best)
        weights.append([v * scaling for v in w])
    return ids, weights


@given(T=st.integers(0, 30), n_group=st.integers(1, 8), size=st.integers(1, 6),
       data=st.data(), biased=st.booleans(), renormalize=st.booleans(),
       capacity=st.one_of(st.none(), st.integers(0, 5)), seed=st.integers(0, 2**16),
       group_score=st.sampled_from(["top2", "max"]))
def test_grouped_reference_matches_loop(T, n_group, size, data, biased, renormalize, capacity,
                                        seed, group_score):
    """bf16 scores, positive, and a bias in eighths: every sum is exact in float32, and ties
    (between experts and between groups) are many."""
    E = n_group * size
    topk_group = data.draw(st.integers(1, n_group))
    k = data.draw(st.integers(1, min(8, topk_group * size)))
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(T, E, generator=g).abs().add(0.125).to(torch.bfloat16)
    bias = torch.randint(-4, 5, (E,), generator=g).float() / 8 if biased else None
    r = index_shuffle(scores, k, renormalize=renormalize, scaling=1.5, capacity=capacity,
                      groups=(n_group, topk_group), bias=bias, group_score=group_score,
                      impl="torch")
    ids, weights = loop_groups(scores, bias, k, n_group, topk_group, renormalize, 1.5,
                               2 if group_score == "top2" else 1)
    check_against_loop(r, loop_sort(ids, weights, E, capacity))


# ---- the kernel against the reference ------------------------------------------------------------

KERNEL_CASES = [
    # T, E, k, dtype, scoring, renormalize, scaling, capacity
    (37, 16, 1, torch.bfloat16, "softmax", False, 1.0, None),
    (128, 128, 1, torch.bfloat16, "none", False, 1.0, None),  # a blog decode shape
    (50, 256, 8, torch.float32, "softmax", True, 2.5, None),  # k = 8 of 256
    (45, 9, 3, torch.float16, "sigmoid", False, 1.0, 4),  # capacity drops, odd sizes
    (1, 1, 1, torch.float32, "softmax", False, 1.0, None),
    (0, 16, 2, torch.bfloat16, "none", False, 1.0, None),
    (600, 16, 1, torch.bfloat16, "sigmoid", False, 1.0, 30),  # the two-launch path, 19 blocks
]


@pytest.mark.parametrize("T,E,k,dtype,scoring,renormalize,scaling,capacity", KERNEL_CASES,
                         ids=lambda v: str(v).replace("torch.", ""))
def test_kernel_matches_reference(T, E, k, dtype, scoring, renormalize, scaling, capacity):
    scores = scores_for(T, E, dtype, seed=T + E)
    kw = dict(scoring=scoring, renormalize=renormalize, scaling=scaling, capacity=capacity)
    check_same(index_shuffle(scores, k, impl="triton", **kw), index_shuffle(scores, k, impl="torch", **kw))


GROUPED_CASES = [
    # T, E, k, (n_group, topk_group), dtype, scoring, renormalize, capacity, bias, group_score
    (1, 256, 8, (8, 4), torch.bfloat16, "sigmoid", True, None, True, "top2"),  # DeepSeek-V3 decode
    (8, 256, 8, (8, 4), torch.float32, "sigmoid", True, None, True, "top2"),  # last one-program T
    (300, 256, 8, (8, 4), torch.bfloat16, "sigmoid", True, None, True, "top2"),  # blocks (2 launches)
    (33, 160, 6, (8, 3), torch.float32, "softmax", True, None, False, "top2"),  # 20 experts a group
    (5, 384, 8, (1, 1), torch.bfloat16, "sigmoid", True, None, True, "top2"),  # one group (Kimi K2)
    (45, 12, 3, (3, 2), torch.float16, "softmax", False, 4, True, "top2"),  # odd sizes, capacity
    (17, 8, 1, (8, 3), torch.float32, "none", False, None, True, "top2"),  # groups of one expert
    (0, 64, 4, (4, 2), torch.bfloat16, "sigmoid", True, None, True, "top2"),
    # DeepSeek-V2's group_limited_greedy (160 experts, 10 groups, 3 kept, top-6): decode, blocks
    (1, 160, 6, (10, 3), torch.float32, "softmax", False, None, False, "max"),
    (300, 160, 6, (10, 3), torch.bfloat16, "softmax", False, None, False, "max"),
    (45, 12, 3, (3, 2), torch.float16, "sigmoid", True, 4, True, "max"),
]


@pytest.mark.parametrize("T,E,k,groups,dtype,scoring,renormalize,capacity,biased,group_score",
                         GROUPED_CASES, ids=lambda v: str(v).replace("torch.", ""))
def test_grouped_kernel_matches_reference(T, E, k, groups, dtype, scoring, renormalize,
                                          capacity, biased, group_score):
    scores = scores_for(T, E, dtype, seed=T + E)
    bias = scores_for(1, E, torch.float32, seed=E)[0] * 0.2 if biased else None
    kw = dict(scoring=scoring, renormalize=renormalize, scaling=2.5, capacity=capacity,
              groups=groups, bias=bias, group_score=group_score)
    got = index_shuffle(scores, k, impl="triton", **kw)
    check_same(got, index_shuffle(scores, k, impl="torch", **kw))
    if T:  # every token's experts lie in at most topk_group groups
        size = E // groups[0]
        chosen = torch.zeros(T, groups[0], dtype=torch.bool, device=DEV)
        chosen[got.token_ids.long(), got.expert_ids.long() // size] = True
        assert int(chosen.sum(1).max()) <= groups[1]


def test_grouped_kernel_ties():
    """Equal group scores go to the lower group, equal choices to the lower expert, and the bias
    steers the choice but not the weight."""
    s = torch.tensor([[1.0, 2.0, 2.0, 1.0, 1.5, 1.5, 0.0, -4.0],
                      [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
                      [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]], device=DEV)
    bias = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -3.0, 4.0], device=DEV)
    kw = dict(groups=(4, 2), bias=bias)
    got = index_shuffle(s, 3, impl="triton", **kw)
    check_same(got, index_shuffle(s, 3, impl="torch", **kw))
    chosen = sorted(zip(got.token_ids.tolist(), got.expert_ids.tolist(), got.weights.tolist()))
    # row 0: groups {0,1}, {2,3} and {4,5} tie at 3 ({6,7}: -3): the first two stay, so the
    # third expert is 0 (1.0, tied with 3), not 4 (1.5); rows 1 and 2: the bias lifts {6,7}
    # (5 - 2 = 3 against 2, and 4 - 3 = 1 against 0) above the rest, then {0,1}: experts 7, 0
    # and 1, at their unbiased scores
    assert chosen == [(0, 0, 1.0), (0, 1, 2.0), (0, 2, 2.0), (1, 0, 1.0), (1, 1, 1.0),
                      (1, 7, 1.0), (2, 0, 0.0), (2, 1, 0.0), (2, 7, 0.0)]


def test_grouped_kernel_group_score_max():
    """A group scored by its best choice (DeepSeek-V2): {0, 1} (3 and 0) beats {2, 3} (2 and 2,
    which sum higher), and equal bests go to the lower group ({4, 5} against {6, 7})."""
    s = torch.tensor([[3.0, 0.0, 2.0, 2.0, 0.0, 0.0, 0.0, 0.0],
                      [0.0, 0.0, 0.0, 0.0, 1.0, 0.5, 1.0, 0.9]], device=DEV)
    for group_score, experts in (("top2", [2, 6]), ("max", [0, 4])):
        kw = dict(groups=(4, 1), group_score=group_score)
        got = index_shuffle(s, 1, impl="triton", **kw)
        check_same(got, index_shuffle(s, 1, impl="torch", **kw))
        assert got.expert_ids[got.token_ids.argsort()].tolist() == experts, group_score


def test_round_scores_decide_where_the_bias_is_smaller_than_a_rounding():
    """LFM2-MoE chooses on bf16 sigmoids plus an fp32 bias: sigmoid(0) = 0.5 and sigmoid(2^-8)
    = 0.50098 are one bf16 value, so a bias of 5e-4 picks expert 0, which float32 scores rank
    below expert 1; the weight is the rounded score."""
    s = torch.tensor([[0.0, 2.0**-8, -1.0, -2.0]], device=DEV, dtype=torch.bfloat16)
    bias = torch.tensor([5e-4, 0.0, 0.0, 0.0], device=DEV)
    for round_scores, expert, weight in ((False, 1, torch.sigmoid(torch.tensor(2.0**-8)).item()),
                                         (True, 0, 0.5)):
        kw = dict(scoring="sigmoid", groups=(1, 1), bias=bias, round_scores=round_scores)
        got = index_shuffle(s, 1, impl="triton", **kw)
        check_same(got, index_shuffle(s, 1, impl="torch", **kw))
        assert got.expert_ids.tolist() == [expert]
        assert got.weights.tolist() == pytest.approx([weight], rel=1e-6)


@pytest.mark.parametrize("T,dtype,k,groups", [(1, torch.bfloat16, 4, (1, 1)),
                                               (300, torch.bfloat16, 4, (1, 1)),
                                               (37, torch.float16, 6, (4, 2))])
def test_round_scores_kernel_matches_reference(T, dtype, k, groups):
    """Rounded scores (LFM2-MoE: 32 experts, top-4, one group, a bias) against the reference:
    decode, blocks, and fp16 with groups."""
    scores = scores_for(T, 32, dtype, seed=T)
    bias = scores_for(1, 32, torch.float32, seed=3)[0] * 0.01
    kw = dict(scoring="sigmoid", renormalize=True, groups=groups, bias=bias, round_scores=True)
    check_same(index_shuffle(scores, k, impl="triton", **kw),
               index_shuffle(scores, k, impl="torch", **kw))


def test_grouped_batch_invariant_weights():
    """batch_invariant with groups: a row's weights are the same bits alone and among 16 (the
    interpreter sums rows alike at any tiling; on the GPU the tiling decides)."""
    scores = scores_for(16, 256, torch.float32)
    kw = dict(scoring="softmax", renormalize=True, groups=(8, 4), impl="triton",
              batch_invariant=True)
    full = index_shuffle(scores, 8, **kw).dense_weights(16)
    rows = [0, 7, 15]
    alone = torch.cat([index_shuffle(scores[t:t + 1], 8, **kw).dense_weights(1) for t in rows])
    assert torch.equal(alone, full[rows])


def test_grouped_config_holds_rows_whole():
    """One program to DeepSeek-V3's T = 4 (32 pairs); blocks never past GROUPED_TILE scores."""
    from shufflemoe.ops.index_shuffle.kernel import GROUPED_TILE, grouped_config

    assert grouped_config(4, 256, 8, 8).single and not grouped_config(5, 256, 8, 8).single
    assert grouped_config(2, 384, 8, 1).single and not grouped_config(3, 384, 8, 1).single
    for T, E, k, n_group in ((1, 256, 8, 8), (4096, 256, 8, 8), (65536, 384, 8, 1),
                             (5000, 160, 6, 8), (700, 8, 1, 8)):
        for invariant in (False, True):
            cfg = grouped_config(T, E, k, n_group, invariant)
            width = next_pow2(n_group) * next_pow2(E // n_group)
            assert cfg.block_tokens * width <= max(GROUPED_TILE, 16 * width), (T, E, invariant)


def next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # the all -inf row, on purpose
@pytest.mark.parametrize("config", [RouteConfig(16, 16, False, 4), RouteConfig(8, 32, False, 4, 3),
                                    RouteConfig(128, 16, True, 4)],
                         ids=["blocks_of_16", "three_blocks_per_place_program", "one_program"])
def test_kernel_tilings(config):
    """Several blocks with a partial last one, and top-k over experts in chunks (E = 40 > 16)."""
    scores = scores_for(70, 40, torch.float32, seed=3)
    scores[5, :] = float("-inf")  # a row with no finite score still routes to experts 0..k-1
    scores[6, 10:20] = 0.25  # ties across chunks
    kw = dict(scoring="softmax", renormalize=True, scaling=1.0, capacity=5)
    got = route_kernel.index_shuffle(scores, 3, config=config, **kw)
    ref = index_shuffle(scores, 3, impl="torch", **kw)
    for f in INDEX_FIELDS:
        assert torch.equal(getattr(got, f), getattr(ref, f)), f
    finite = torch.isfinite(ref.weights)
    assert_close(got.weights[finite], ref.weights[finite].double(), "float32")


@pytest.mark.parametrize("k", [1, 4])  # k = 1: the reference's argmax, k > 1: its sort
def test_kernel_special_values(k):
    """Ties go to the lower id; -0.0 ties +0.0; NaN sorts first (torch.sort); +inf beats all."""
    s = torch.zeros(6, 20, device=DEV)
    s[1] = -0.0
    s[1, 9] = 0.0
    s[2, 3] = float("nan")
    s[3, 11:14] = float("inf")
    s[4] = torch.arange(20.0, device=DEV).flip(0)
    s[5] = -1.0
    got = index_shuffle(s, k, impl="triton")
    ref = index_shuffle(s, k, impl="torch")
    for f in INDEX_FIELDS:
        assert torch.equal(getattr(got, f), getattr(ref, f)), f
    first = [0, 0, 3, 11, 0, 0]  # each row's best id
    assert ref.expert_ids[ref.positions[::k].long()].tolist() == first
    if k > 1:  # expert 0 is among every row's best k
        assert got.token_ids[got.expert_ids == 0].tolist() == list(range(6))


def test_kernel_one_hot_expert_and_empty_experts():
    """Every token on expert 5 (capacity drops the rest in token order); experts 0-4 empty."""
    s = scores_for(33, 16, torch.float32, seed=1)
    s[:, 5] += 100.0
    for cap in (None, 7):
        got = index_shuffle(s, 1, capacity=cap, impl="triton")
        check_same(got, index_shuffle(s, 1, capacity=cap, impl="torch"))
        assert got.counts.tolist() == [0] * 5 + [33 if cap is None else 7] + [0] * 10
        assert got.token_ids.tolist() == list(range(33))


@pytest.mark.parametrize("id_dtype", [torch.int64, torch.int32])
def test_sort_kernel_matches_reference(id_dtype):
    """Ids outside [0, E) (negative, E, beyond int32 for int64) go last; bf16 weights."""
    g = torch.Generator().manual_seed(7)
    T, k, E = 30, 4, 16
    ids = torch.randint(-1, E + 2, (T, k), generator=g)
    if id_dtype == torch.int64:
        ids[3, 1] = 2**40 + 3  # routed nowhere; expert_ids keeps its low 32 bits, as .int() does
    ids = ids.to(device=DEV, dtype=id_dtype)
    w = torch.rand(T, k, generator=g).to(DEV, torch.bfloat16)
    for cap, w_ in ((2, w), (None, None)):
        got = sort_by_expert(ids, E, w_, capacity=cap, impl="triton")
        check_same(got, sort_by_expert(ids, E, w_, capacity=cap, impl="torch"))
    blocks = route_kernel.sort_by_expert(ids, E, w, 2, config=RouteConfig(8, 16, False, 4))
    check_same(blocks, sort_by_expert(ids, E, w, capacity=2, impl="torch"))


@pytest.mark.parametrize("block_tokens", [16, 32], ids=["counted_64_pairs", "sorted_128_pairs"])
def test_one_program_placements(block_tokens):
    """One program without a capacity places at most RANK_PAIRS pairs by counting
    (_place_by_rank), more by its sort: both against the reference, from scores (padding
    pairs: k = 3 of 4 lanes, rows past T) and from ids (repeats, ids outside [0, E) last)."""
    assert (block_tokens * 4 <= route_kernel.RANK_PAIRS.value) == (block_tokens == 16)
    config = RouteConfig(block_tokens, 64, True, 4)
    scores = scores_for(13, 40, torch.float32, seed=5)
    got = route_kernel.index_shuffle(scores, 3, "softmax", True, 1.0, None, config)
    check_same(got, index_shuffle(scores, 3, scoring="softmax", renormalize=True, impl="torch"))
    g = torch.Generator().manual_seed(9)
    ids = torch.randint(-2, 42, (13, 4), generator=g)
    ids[2, 3] = ids[2, 0]  # one token, the same expert twice: pair order decides
    ids = ids.to(DEV)
    w = torch.rand(13, 4, generator=g).to(DEV)
    got = route_kernel.sort_by_expert(ids, 40, w, None, config=config)
    check_same(got, sort_by_expert(ids, 40, w, capacity=None, impl="torch"))


def test_sort_kernel_256_experts_k8():
    """E + 1 = 257 buckets (512 after rounding up), eight pairs per token, some ids repeated."""
    g = torch.Generator().manual_seed(11)
    ids = torch.randint(-3, 259, (21, 8), generator=g)
    ids[4, 1] = ids[4, 5]  # the same expert twice for one token: pair order decides
    ids = ids.to(DEV)
    got = sort_by_expert(ids, 256, capacity=1, impl="triton")
    check_same(got, sort_by_expert(ids, 256, capacity=1, impl="torch"))


def test_sort_kernel_one_expert():
    ids = torch.tensor([[0], [1], [0], [-1], [0]], device=DEV, dtype=torch.int32)
    got = sort_by_expert(ids, 1, impl="triton")
    check_same(got, sort_by_expert(ids, 1, impl="torch"))
    assert got.token_ids.tolist() == [0, 2, 4, 1, 3] and got.num_valid.item() == 3


def test_route_config_heuristic():
    # one program to 64 pairs, or top-1 over 4096 scores (T x E padded); blocks past that
    assert route_config(8, 128, 8).single and route_config(64, 128, 1).single
    assert route_config(256, 16, 1).single and route_config(32, 8, 2).single
    assert not route_config(16, 128, 8).single and not route_config(128, 128, 1).single
    assert not route_config(512, 16, 1).single and not route_config(64, 8, 2).single
    big = route_config(8192, 128, 1)
    assert not big.single and triton_cdiv(8192, big.block_tokens) <= 128
    huge = route_config(65536, 256, 8)
    assert huge.block_tokens * 8 <= 1024 and huge.block_tokens * huge.expert_chunk <= 4096
    # warps (probe_route_warps): a warp a row at 1-2 tokens, 8 for one program of >= 8 rows
    # and >= 1024 scores, 4 between; DeepSeek-V3's grouped 4-token block stays at 4
    warps = {(T, E, k): route_config(T, E, k).num_warps
             for T, E, k in ((1, 128, 8), (2, 128, 8), (4, 128, 8), (8, 128, 8), (8, 128, 4),
                             (1, 128, 1), (1, 16, 1), (8, 8, 2), (1024, 128, 8))}
    assert warps == {(1, 128, 8): 2, (2, 128, 8): 2, (4, 128, 8): 4, (8, 128, 8): 8,
                     (8, 128, 4): 8, (1, 128, 1): 8, (1, 16, 1): 4, (8, 8, 2): 4,
                     (1024, 128, 8): 4}
    assert grouped_config(4, 256, 8, 8).num_warps == 4


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def check_inverse(r, k: int) -> None:
    """positions is a permutation of 0..A-1 and token_ids[positions] == pair index // k."""
    A = r.num_pairs
    pairs = torch.arange(A, device=r.positions.device)
    assert r.positions.dtype == torch.int32
    assert torch.equal(r.positions.sort().values, pairs.int())
    assert torch.equal(r.token_ids[r.positions.long()].long(), pairs // k)


@pytest.mark.parametrize("invariant", [True, False])
def test_batch_invariant_weights(invariant):
    """batch_invariant: a row's weights are the same bits routed alone or among 16 rows (E = 1024:
    the default tiling sums a row's softmax in 2 chunks of 512 alone, in 8 of 128 among 16)."""
    scores = scores_for(16, 1024, torch.float32)
    kw = dict(scoring="softmax", renormalize=True, impl="triton", batch_invariant=invariant)
    full = index_shuffle(scores, 4, **kw).dense_weights(16)
    rows = [1, 4, 12, 15]
    alone = torch.cat([index_shuffle(scores[t:t + 1], 4, **kw).dense_weights(1) for t in rows])
    same = torch.equal(alone, full[rows])
    if invariant:
        assert same
    elif not CUDA:  # the check has teeth (the GPU's tiling may happen to agree)
        assert not same


def test_kernel_reads_strided_columns():
    """Scores and top-k ids/weights with a column stride other than 1 (a transposed view): the
    kernel read them as contiguous and routed wrong; now the same Routing as their copies."""
    scores = scores_for(24, 6, torch.float32).t().contiguous().t()
    assert scores.stride(1) != 1
    kw = dict(scoring="softmax", renormalize=True)
    check_same(index_shuffle(scores, 2, impl="triton", **kw),
               index_shuffle(scores.contiguous(), 2, impl="torch", **kw))
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 6, (3, 24), generator=g).to(DEV).t()
    w = torch.rand(3, 24, generator=g).to(DEV).t()
    check_same(sort_by_expert(ids, 6, w, impl="triton"),
               sort_by_expert(ids.contiguous(), 6, w.contiguous(), impl="torch"))


@pytest.mark.parametrize("T,E,k,capacity", [(0, 16, 2, None), (1, 4, 3, None), (1, 256, 8, 0),
                                            (37, 16, 8, 3), (90, 256, 8, 4), (600, 16, 1, 30)],
                         ids=["T0", "T1", "T1_all_dropped", "k8_capacity", "E256_k8",
                              "two_launches"])
def test_positions_are_the_inverse_permutation(T, E, k, capacity):
    """From scores and from ids (with ids outside [0, E)): kernel positions == reference, the
    inverse of the pair order, with capacity drops."""
    scores = scores_for(T, E, torch.float32, seed=T + k)
    for make in (lambda impl: index_shuffle(scores, k, capacity=capacity, impl=impl),
                 lambda impl: sort_by_expert(scores.topk(k, 1).indices - 1, E, capacity=capacity,
                                             impl=impl)):
        ref, got = make("torch"), make("triton")
        check_inverse(ref, k)
        check_same(got, ref)


# ---- bad input -----------------------------------------------------------------------------------

@pytest.mark.parametrize("call,match", [
    (lambda s: index_shuffle(s, 0), "top_k"),
    (lambda s: index_shuffle(s, 17), "top_k"),
    (lambda s: index_shuffle(s, 1, scoring="relu"), "scoring"),
    (lambda s: index_shuffle(s, 1, capacity=-1), "capacity"),
    (lambda s: index_shuffle(s[0], 1), "scores"),
    (lambda s: index_shuffle(s.int(), 1), "scores"),
    (lambda s: index_shuffle(s, 1, groups=(3, 1)), "n_group"),
    (lambda s: index_shuffle(s, 1, groups=(4, 5)), "topk_group"),
    (lambda s: index_shuffle(s, 5, groups=(4, 1)), "top_k"),
    (lambda s: index_shuffle(s, 1, groups=[4, 1]), "groups"),
    (lambda s: index_shuffle(s, 1, bias=s[0]), "bias"),
    (lambda s: index_shuffle(s, 1, groups=(4, 1), bias=s[0, :8]), "bias"),
    (lambda s: index_shuffle(s, 1, groups=(4, 1), group_score="sum"), "group_score"),
    (lambda s: index_shuffle(s, 1, round_scores=True), "round_scores"),
    (lambda s: sort_by_expert(s, 4), "topk_ids"),
    (lambda s: sort_by_expert(s.long(), 0), "num_experts"),
    (lambda s: sort_by_expert(s.long(), 4, s[:, :3]), "topk_weights"),
])
def test_bad_input_raises(call, match):
    with pytest.raises((TypeError, ValueError), match=match):
        call(scores_for(5, 16, torch.float32, device="cpu"))


# ---- GPU: large batches and CUDA graphs -----------------------------------------------------------

@needs_cuda
@pytest.mark.parametrize("E,k,scoring,capacity", [(128, 1, "none", None), (16, 1, "sigmoid", None),
                                                 (256, 8, "softmax", 2100)])
def test_gpu_large_batch(E, k, scoring, capacity):
    scores = scores_for(65536, E, torch.bfloat16, seed=E)
    kw = dict(scoring=scoring, renormalize=k > 1, capacity=capacity)
    check_same(index_shuffle(scores, k, impl="triton", **kw), index_shuffle(scores, k, impl="torch", **kw))


@needs_cuda
def test_gpu_cuda_graph_replays_follow_new_scores():
    T, E, k = 1000, 128, 2
    static = scores_for(T, E, seed=0)
    r = index_shuffle(static, k, scoring="softmax", impl="triton")  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        r = index_shuffle(static, k, scoring="softmax", impl="triton")
    for seed in (1, 2, 3):
        static.copy_(scores_for(T, E, seed=seed))
        if seed == 3:
            static[:, 7] += 50.0  # a routing nothing like the captured one
        graph.replay()
        check_same(r, index_shuffle(static, k, scoring="softmax", impl="torch"))
