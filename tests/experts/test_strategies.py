"""Every expert strategy against the float64 naive_moe, on hypothesis-drawn layers and on the edge
cases. Strategies add into ``out``; it starts as random values (never zeros), so a pair that is
not written, or written twice, shows."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from factories import check_strategy, configs, make_input, make_layer
from shufflemoe import EXPERTS, MoEConfig
from shufflemoe.ops import sort_by_expert

STRATEGIES = EXPERTS.names()


@pytest.mark.parametrize("name", STRATEGIES)
@settings(max_examples=12)
@given(cfg=configs(allow_shared=False), T=st.integers(0, 300), seed=st.integers(0, 2**16))
def test_strategy_matches_reference(name, cfg, T, seed):
    layer = make_layer(cfg, seed)
    x = make_input(cfg, T, seed + 1)
    check_strategy(name, layer, x, layer.route(x))


def _cfg(**kw):
    base = dict(hidden_size=24, intermediate_size=20, num_experts=16, top_k=2, renormalize=True,
                dtype=torch.float32)
    return MoEConfig(**{**base, **kw})


def _routing_from_ids(ids, E, seed=3):
    w = torch.rand(ids.shape, generator=torch.Generator().manual_seed(seed)) + 0.1
    return sort_by_expert(ids, E, w)


EDGE_CASES = {
    "T=0": lambda: torch.zeros(0, 2, dtype=torch.int64),
    "T=1": lambda: torch.tensor([[3, 9]]),
    "all tokens on one expert (k=1)": lambda: torch.full((40, 1), 5),
    "all tokens on two experts": lambda: torch.tensor([[5, 11]] * 40),
    "most experts empty": lambda: torch.tensor([[0, 15], [15, 0], [7, 0]]),
    "k=8 of E=16": lambda: torch.stack([torch.randperm(16, generator=torch.Generator().manual_seed(t))[:8]
                                            for t in range(37)]),
}


@pytest.mark.parametrize("name", STRATEGIES)
@pytest.mark.parametrize("case", EDGE_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_edge_cases(name, case, dtype):
    ids = EDGE_CASES[case]()  # [T, k] expert ids
    cfg = _cfg(top_k=ids.shape[1], dtype=dtype)
    layer = make_layer(cfg)
    x = make_input(cfg, ids.shape[0])
    check_strategy(name, layer, x, _routing_from_ids(ids, cfg.num_experts))


@pytest.mark.parametrize("name", STRATEGIES)
def test_weight_on_input_with_capacity_drops(name):
    cfg = _cfg(router="llama4", scoring="sigmoid", apply_router_weight_on_input=True, top_k=1,
               capacity_factor=0.5, renormalize=False)
    layer = make_layer(cfg)
    x = make_input(cfg, 50)
    r = layer.route(x)
    assert int(r.num_valid) < 50  # some pairs really are dropped
    check_strategy(name, layer, x, r)


@pytest.mark.parametrize("name", STRATEGIES)
def test_large_expert_count(name):
    cfg = _cfg(num_experts=256, top_k=8, dtype=torch.bfloat16, quantization="fp8_rowwise")
    layer = make_layer(cfg)
    x = make_input(cfg, 45)
    check_strategy(name, layer, x, layer.route(x))


def test_graph_safety_flags():
    syncing = {n for n in STRATEGIES if not EXPERTS.get(n).graph_safe}
    assert syncing == {"padded", "sliced", "concat"}


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_rows_scaled_at_the_input_scale_gemm13(impl):
    """Llama 4 style (router weights on the input) with many experts of 17-128 rows: GEMM13
    gathers the rows unscaled and scales its sums (no gather_scale copy), against float64."""
    from shufflemoe.experts import shuffled
    from shufflemoe.ops import use_impl

    cfg = _cfg(router="llama4", scoring="sigmoid", apply_router_weight_on_input=True, top_k=1,
               num_experts=64, renormalize=False, dtype=torch.bfloat16)
    dev = "cuda" if impl == "triton" and torch.cuda.is_available() else "cpu"
    layer = make_layer(cfg, device=dev)
    x = make_input(cfg, 64 * 24, device=dev)
    r = layer.route(x)
    w_in, _ = shuffled.pair_weights(r, cfg)
    assert shuffled._scales_in_gemm(x, layer.expert_weights, w_in, r.num_pairs, r.num_experts)
    assert not shuffled._scales_in_gemm(x, layer.expert_weights, w_in, 64 * 200, 64)
    with use_impl(impl):
        check_strategy("shuffled", layer, x, r)


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_wide_bf16_layers_gather_in_gemm13_on_part_filled_tiles(impl):
    """Past the width rule (2I > GATHER_MAX_N) bf16 rows are gathered by GEMM13 itself where the
    pairs average more than MID_SWAP_ROWS and at most GATHER_MAX_ROWS an expert (the 128-row
    tiles of a Mixtral-like batch), not outside that range or for fp8_w8a16 weights; the
    gathered path against float64."""
    from shufflemoe.experts import shuffled
    from shufflemoe.ops import use_impl
    from shufflemoe.ops.grouped_gemm import configs as gemm_configs

    I = shuffled.GATHER_MAX_N // 2 + 8  # 2I just past the width rule
    cfg = _cfg(hidden_size=32, intermediate_size=I, num_experts=4, top_k=2,
               dtype=torch.bfloat16)
    dev = "cuda" if impl == "triton" and torch.cuda.is_available() else "cpu"
    layer = make_layer(cfg, device=dev)
    x = make_input(cfg, 116, device=dev)  # 58 pairs an expert
    r = layer.route(x)
    w, E = layer.expert_weights, r.num_experts
    assert shuffled._gathers_in_gemm(x, w, None, r.num_pairs, E)
    low, high = gemm_configs.MID_SWAP_ROWS * E, shuffled.GATHER_MAX_ROWS * E
    assert shuffled._gathers_in_gemm(x, w, None, low + 1, E)
    assert shuffled._gathers_in_gemm(x, w, None, high, E)
    assert not shuffled._gathers_in_gemm(x, w, None, low, E)
    assert not shuffled._gathers_in_gemm(x, w, None, high + 1, E)
    w8 = make_layer(cfg.replace(quantization="fp8_w8a16"), device=dev).expert_weights
    assert not shuffled._gathers_in_gemm(x, w8, None, r.num_pairs, E)
    with use_impl(impl):
        check_strategy("shuffled", layer, x, r)
