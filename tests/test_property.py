"""Property: every valid layer (any router, renormalization, capacity factor, shared expert, dtype,
fp8), with any expert strategy, dispatcher and implementation (torch references or Triton
kernels), matches the float64 reference on the layer's own routing, and (float32) that routing
matches the float64 one; in batch-invariant mode a row alone is the same bits as in its batch.

Runs for a fixed time budget (BUDGET_S; SHUFFLEMOE_PROPERTY_BUDGET_S=600 for a longer local
run), however fast the machine: examples drawn after it pass
without running (but never once a failure has been seen, so shrinking still works). On failure
hypothesis prints the falsifying case, whose ``seed`` draws the weights and tokens, and the
blob that replays it (@reproduce_failure). The distributed dispatchers run on a one-rank gloo
group in this process (their code paths; tests/dispatch runs 2 and 4 ranks on fixed cases).
On a GPU everything runs there (the group is NCCL).
"""

from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from factories import check_routing, configs, make_input, make_layer
from shufflemoe import DISPATCHERS, EXPERTS
from shufflemoe.ops import use_impl
from shufflemoe.parallel import parallelize
from shufflemoe.reference import naive_moe
from shufflemoe.testing import compare, tolerance_key

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
BUDGET_S = float(os.environ.get("SHUFFLEMOE_PROPERTY_BUDGET_S", "20"))
# running: an example started and has not passed (when the next one starts, it failed);
# failed: some example failed, so the budget no longer applies (hypothesis shrinks and replays).
_clock = {"start": None, "running": False, "failed": False}


def _within_budget() -> bool:
    if _clock["start"] is None:
        _clock["start"] = time.monotonic()
    _clock["failed"] |= _clock["running"]
    return _clock["failed"] or time.monotonic() - _clock["start"] < BUDGET_S


@pytest.fixture(scope="module", autouse=True)
def one_rank_group():
    """A group of one rank (gloo on the CPU, NCCL on a GPU) for tp / ep_alltoall /
    ep_allgather, torn down after."""
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    if CUDA:
        torch.cuda.set_device(0)
    dist.init_process_group("nccl" if CUDA else "gloo", store=dist.HashStore(), rank=0,
                            world_size=1)
    yield
    dist.destroy_process_group()


@st.composite
def cases(draw) -> dict:
    # The interpreter runs every Triton program on the CPU, one example in 4 (the kernels' own
    # tests cover them widely), on smaller layers and blocks; the references take a few ms.
    impl = draw(st.sampled_from(["torch", "torch", "torch", "triton"]))
    kernels = impl == "triton" and not CUDA
    cfg = draw(configs(dtypes=(torch.float32, torch.bfloat16, torch.float16),
                       max_experts=16 if kernels else 256))
    cfg = cfg.replace(block_size=draw(st.sampled_from([16, 32] if kernels else [16, 128])))
    case = dict(cfg=cfg, experts=draw(st.sampled_from(EXPERTS.names())),
                dispatch=draw(st.sampled_from(DISPATCHERS.names())), impl=impl,
                T=draw(st.integers(0, 24 if kernels else 40)),
                seed=draw(st.integers(0, 2**31 - 1)))
    invariant_ok = (cfg.capacity_factor is None and case["experts"] == "shuffled"
                    and case["dispatch"] == "local" and case["impl"] == "triton")
    if invariant_ok and draw(st.booleans()):
        case["cfg"] = cfg.replace(batch_invariant=True)
    return case


@settings(max_examples=400, deadline=None, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=cases())
def test_any_layer_strategy_dispatcher_and_dtype_matches_float64(case):
    if not _within_budget():
        return
    cfg, T, seed = case["cfg"], case["T"], case["seed"]
    note(f"{case['experts']} x {case['dispatch']} ({case['impl']}), T={T}, seed={seed}: {cfg}")
    _clock["running"] = True
    full = make_layer(cfg, seed, device=DEV)
    options = {"max_tokens": T} if case["dispatch"] == "ep_allgather" else {}
    try:
        layer = parallelize(full, case["dispatch"], **options)
        layer.set_experts(case["experts"])
    except ValueError as e:  # a combination some supports() refuses, with its reason
        note(f"refused: {e}")
        _clock["running"] = False
        return
    x = make_input(cfg, T, seed + 1, device=DEV)
    with use_impl(case["impl"]):
        routing = full.route(x)
        out = layer(x)
        alone = layer(x[:1]) if cfg.batch_invariant and T else None
    if cfg.dtype == torch.float32 and not CUDA:  # 16-bit logits round far from float64 ones
        check_routing(full, x, routing)
    ref, mag = naive_moe(full, x, routing, with_magnitude=True)
    c = compare(out, ref, tolerance_key(cfg), magnitude=mag)
    assert c.ok, c.why
    if alone is not None:
        assert torch.equal(alone, out[:1]), "batch_invariant: row 0 alone differs from its batch"
    _clock["running"] = False
