import math

import pytest

from shufflemoe import preset
from shufflemoe.planner import (STRATEGIES, decode_strategy, expected_active_experts, layer_cost,
                                must_read_bytes, plan)


def test_scout_decode_bytes_match_the_spec_trace():
    # The spec's Llama 4 Scout BF16 decode trace (TP8 shard, T=64, all 16 experts active):
    # router 163,840 + shared 31,457,280 + routed 503,316,480 = 534,937,600 bytes.
    cfg = preset("llama4-scout", tp=8)
    assert must_read_bytes(cfg, 16) == 534_937_600


def test_expected_active_experts():
    assert expected_active_experts(128, 8, 1) == pytest.approx(8)
    assert expected_active_experts(16, 1, 10_000) == pytest.approx(16)
    assert expected_active_experts(16, 1, 2) == pytest.approx(16 * (1 - (15 / 16) ** 2))


def test_decode_is_memory_bound_and_prefill_compute_bound():
    scout, maverick = preset("llama4-scout", tp=8), preset("llama4-maverick", tp=8)
    assert layer_cost(scout, 8).bound == "memory"
    assert layer_cost(scout, 16384).bound == "compute"
    # 128 experts of 31 MB each: even 16K tokens (128 per expert) stay weight-bound, as in the
    # spec's table (975 us at 2,993 GB/s for G=128, M=128)
    assert layer_cost(maverick, 16384).bound == "memory"


def test_strategy_costs_order_as_expected():
    cfg = preset("qwen3-30b-a3b")
    costs = {c.strategy: c for c in plan(cfg, 4)}
    assert set(costs) == set(STRATEGIES)
    assert costs["selective"].weight_bytes < costs["all_experts"].weight_bytes
    assert costs["padded"].rows >= costs["shuffled"].rows
    assert costs["shuffled"].host_syncs == 0 and costs["sliced"].host_syncs == 1
    assert costs["shuffled"].flops == pytest.approx(6 * 32 * 2048 * 768 + 2 * 4 * 2048 * 128)


def test_parallel_layouts_divide_work_and_add_communication():
    cfg = preset("mixtral-8x7b")
    one, tp2 = layer_cost(cfg, 1024), layer_cost(cfg, 1024, tp=2)
    assert tp2.flops < one.flops and tp2.comm_bytes == pytest.approx(1024 * 4096 * 2)
    ep2 = layer_cost(cfg, 1024, ep=2)
    assert ep2.comm_bytes == pytest.approx(2 * 1024 * 2 * 4096 * 2 / 2)
    with pytest.raises(ValueError):
        layer_cost(cfg, 16, tp=3)


def test_decode_switch():
    cfg = preset("deepseek-v3")  # E=256, k=8, alpha 0.9: selective while T * 8 <= 230
    assert decode_strategy(cfg, 28) == "selective"
    assert decode_strategy(cfg, 29) == "all_experts"
    assert math.isfinite(layer_cost(cfg, 1, "selective").floor)
