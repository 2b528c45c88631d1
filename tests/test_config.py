import pytest
import torch

from shufflemoe import MoEConfig, preset

BASE = dict(hidden_size=8, intermediate_size=4, num_experts=8)


@pytest.mark.parametrize("changes, field", [
    (dict(hidden_size=0), "hidden_size"),
    (dict(intermediate_size=-1), "intermediate_size"),
    (dict(num_experts=0), "num_experts"),
    (dict(top_k=9), "top_k"),
    (dict(top_k=0), "top_k"),
    (dict(router="switch"), "router"),
    (dict(scoring="relu"), "scoring"),
    (dict(router="llama4", scoring="softmax", apply_router_weight_on_input=True), "scoring"),
    (dict(router="llama4", scoring="sigmoid"), "apply_router_weight_on_input"),
    (dict(router="group_limited", n_group=3), "n_group"),
    (dict(router="group_limited", n_group=4, topk_group=5), "topk_group"),
    (dict(router="group_limited", n_group=4, topk_group=1, top_k=3), "top_k"),
    (dict(correction_bias=True), "correction_bias"),
    (dict(n_group=2), "n_group"),  # used by group_limited only: refused, not ignored
    (dict(topk_group=2), "topk_group"),
    (dict(group_score="max"), "group_score"),
    (dict(round_scores=True), "round_scores"),
    (dict(router="group_limited", group_score="sum"), "group_score"),
    (dict(router="llama4", scoring="sigmoid", apply_router_weight_on_input=True,
          renormalize=True), "renormalize"),  # llama4 weighs by sigmoid(logit): not ignored
    (dict(renormalize_over="all"), "renormalize_over"),
    (dict(renormalize_over="chosen"), "renormalize_over"),  # no effect without both below
    (dict(renormalize_over="chosen", renormalize=True), "renormalize_over"),
    (dict(capacity_factor=float("inf")), "capacity_factor"),
    (dict(capacity_factor=True), "capacity_factor"),
    (dict(capacity_factor=1.0, batch_invariant=True), "batch_invariant"),
    (dict(routed_scaling_factor=0.0), "routed_scaling_factor"),
    (dict(capacity_factor=0.0), "capacity_factor"),
    (dict(shared_intermediate_size=-2), "shared_intermediate_size"),
    (dict(shared_expert_gate=True), "shared_expert_gate"),
    (dict(dtype=torch.int32), "dtype"),
    (dict(quantization="int4"), "quantization"),
    (dict(block_size=0), "block_size"),
])
def test_invalid_config_names_the_field(changes, field):
    with pytest.raises(ValueError, match=field):
        MoEConfig(**{**BASE, **changes})


def test_capacity():
    cfg = MoEConfig(**BASE, top_k=2, capacity_factor=1.25)
    assert cfg.capacity(10) == 4  # ceil(1.25 * 10 * 2 / 8) = ceil(3.125)
    assert cfg.capacity(0) == 0
    assert MoEConfig(**BASE).capacity(10) is None


@pytest.mark.parametrize("cf, T, k, E, want", [
    # floats, left to right, gave one more: 0.1 * 12 * 5 / 6 = 1.0000000000000002 -> 2
    (0.1, 12, 5, 6, 1),
    (0.2, 6, 5, 6, 1),
    (1.1, 14, 5, 7, 11),
    (1.3, 36, 5, 6, 39),
    (0.9, 42, 5, 7, 27),
    (0.7, 10, 3, 7, 3),  # not a multiple: ceil(3 / 1) stays 3
    (2, 5, 1, 3, 4),  # an int factor: ceil(10 / 3)
    (1.25, 10, 2, 8, 4),
])
def test_capacity_is_exact(cf, T, k, E, want):
    cfg = MoEConfig(hidden_size=8, intermediate_size=4, num_experts=E, top_k=k, capacity_factor=cf)
    assert cfg.capacity(T) == want


def test_presets_shard_for_tensor_parallelism():
    full = preset("llama4-scout")
    shard = preset("llama4-scout", tp=8)
    assert (full.intermediate_size, shard.intermediate_size) == (8192, 1024)
    assert shard.shared_intermediate_size == 1024
    with pytest.raises(ValueError, match="tp=3"):
        preset("llama4-scout", tp=3)
    with pytest.raises(ValueError, match="unknown model"):
        preset("llama5")
