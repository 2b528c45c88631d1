import math

import pytest

from shufflemoe import MoEConfig, preset
from shufflemoe.cli import main
from shufflemoe.planner import (STRATEGIES, Layout, decode_strategy, expected_active_experts,
                                layer_cost, layouts, must_read_bytes, plan, recommend, skew_factor)


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
    one = layer_cost(cfg, 1024)
    tp2 = layer_cost(cfg, 1024, layout=Layout("tp", 1, 2))
    assert tp2.flops < one.flops and tp2.comm_bytes == pytest.approx(1024 * 4096 * 2)
    ep2 = layer_cost(cfg, 1024, layout=Layout("ep_alltoall", 2, 1, (("dedup", False),)))
    # pairs out and results back, half of them remote, plus the counts of 4 local experts
    assert ep2.comm_bytes == pytest.approx(2 * 1024 * 2 * 4096 * 2 / 2 + 4 * 4)
    assert ep2.host_syncs == 1 and tp2.host_syncs == 0
    with pytest.raises(ValueError):
        layer_cost(cfg, 16, layout=Layout("tp", 1, 3))


def test_layouts_are_exactly_the_buildable_ones():
    cfg = preset("qwen3-30b-a3b")  # E = 128, I = 768, no shared expert
    got = {l.describe() for l in layouts(cfg, 4)}
    assert got == {"tp ep=1 tp=4", "tp_sp ep=1 tp=4",
                   "ep_alltoall ep=4 tp=1", "ep_allgather ep=4 tp=1",
                   "ep_alltoall ep=2 tp=2", "ep_alltoall ep=2 tp=2 dedup",
                   "ep_allgather ep=2 tp=2", "ep_allgather ep=2 tp=2 dedup"}
    assert {l.describe() for l in layouts(cfg, 1)} == {"local ep=1 tp=1"}
    odd = preset("qwen3-30b-a3b", intermediate_size=770)  # tp = 4 cannot cut I
    assert {l.dispatch for l in layouts(odd, 4)} == {"ep_alltoall", "ep_allgather"}
    mixtral = {(l.dispatch, l.ep) for l in layouts(preset("mixtral-8x7b"), 16)}  # 8 experts
    assert ("ep_alltoall", 8) in mixtral and max(ep for _, ep in mixtral) == 8


def test_recommendation_follows_the_cost():
    # Scout (16 experts, I = 8192) decoding 64 tokens on one node: TP reads 1/8 of every expert,
    # no routing imbalance: TP. DeepSeek-V3 prefill over two nodes: expert parallelism.
    scout = recommend(preset("llama4-scout"), 64, 8)
    assert scout[0][0].kind == "TP"
    ds = recommend(preset("deepseek-v3"), 8192, 16)
    assert ds[0][0].kind in ("EP", "hybrid")
    assert [c.serial for _, c in ds] == sorted(c.serial for _, c in ds)
    # across nodes, dedup moves hybrid traffic off the slow links: it wins for the same mesh
    by_name = {l.describe(): c for l, c in ds}
    assert by_name["ep_alltoall ep=2 tp=8 dedup"].t_comm < by_name["ep_alltoall ep=2 tp=8"].t_comm


def test_skew_bound():
    cfg = preset("deepseek-v3")
    assert skew_factor(cfg, 8) == 8  # El = 32 >= k: every pair of every token can land on one rank
    assert skew_factor(preset("llama4-scout"), 8) == 8  # top-1
    lay = Layout("ep_alltoall", 8, 1, (("dedup", False),))
    mean, worst = layer_cost(cfg, 256, layout=lay), layer_cost(cfg, 256, layout=lay, bound=True)
    assert worst.rows == pytest.approx(8 * mean.rows) and worst.comm_bytes > mean.comm_bytes
    gather = Layout("ep_allgather", 8, 1, (("dedup", False),))  # padded: the bound is built in
    assert layer_cost(cfg, 256, layout=gather, bound=True).comm_bytes == \
        layer_cost(cfg, 256, layout=gather).comm_bytes


def test_plan_cli_refuses_unbuildable_layouts(capsys):
    with pytest.raises(SystemExit) as e:  # a usage error: one line, status 2
        main(["plan", "--model", "llama4-scout", "--ep", "3"])
    assert e.value.code == 2 and "cannot be built" in capsys.readouterr().err
    assert main(["plan", "--model", "qwen3-30b-a3b", "--tp", "2", "--ep", "2", "--dedup",
                 "--ep-mode", "allgather", "--gpus", "4"]) == 0
    out = capsys.readouterr().out
    assert "recommended:" in out and "ep_allgather ep=2 tp=2 dedup" in out


def test_decode_switch():
    cfg = preset("deepseek-v3")  # E=256, k=8, alpha 0.9: selective while T * 8 <= 230
    assert decode_strategy(cfg, 28) == "selective"
    assert decode_strategy(cfg, 29) == "all_experts"
    assert math.isfinite(layer_cost(cfg, 1, "selective").floor)


def test_layouts_cut_block_scales_on_their_boundaries_only():
    """fp8_block's 128 x 128 scales and mxfp4's 32-column ones are cut by TP only on whole
    blocks; the layouts that would split one are not listed (EP keeps experts whole)."""
    block = MoEConfig(hidden_size=128, intermediate_size=256, num_experts=8, top_k=2,
                      quantization="fp8_block")
    assert Layout("tp", 1, 2) in layouts(block, 2)
    narrow = {lay.describe() for lay in layouts(block.replace(intermediate_size=128), 2)}
    assert narrow == {"ep_alltoall ep=2 tp=1", "ep_allgather ep=2 tp=1"}, narrow
    mx = MoEConfig(hidden_size=64, intermediate_size=64, num_experts=8, top_k=2,
                   quantization="mxfp4")
    assert Layout("tp", 1, 2) in layouts(mx, 2) and Layout("tp", 1, 4) not in layouts(mx, 4)
