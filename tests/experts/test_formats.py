"""Every expert strategy with every weight format and gpt-oss's options (router bias, expert
biases, clamped GLU) against the float64 naive_moe: on the torch op references for all pairs, and
on the Triton kernels (interpreter on the CPU) for the strategies whose grouping differs most.
Strategies add into a random ``out``, so a pair written twice or not at all shows."""

import pytest
import torch

from factories import check_strategy, gpt_oss_config, make_input, make_layer
from shufflemoe import EXPERTS, MoE, naive_moe
from shufflemoe.ops import use_impl
from shufflemoe.ops.quantize.formats import FORMATS
from shufflemoe.testing import assert_close, tolerance_key

STRATEGIES = EXPERTS.names()


def check(name, layer, x, impl):
    with use_impl(impl):
        check_strategy(name, layer, x, layer.route(x))


@pytest.mark.parametrize("name", STRATEGIES)
@pytest.mark.parametrize("quantization", list(FORMATS))
@pytest.mark.parametrize("gpt_oss", [False, True], ids=["swiglu", "gpt-oss"])
def test_every_strategy_and_format(name, quantization, gpt_oss):
    cfg = gpt_oss_config(quantization=quantization, block_size=16)
    if not gpt_oss:
        cfg = cfg.replace(router_logits_bias=False, expert_bias=False, activation="silu",
                          swiglu_limit=None)
    layer = make_layer(cfg, seed=3)
    check(name, layer, make_input(cfg, 37, seed=4), "torch")


@pytest.mark.parametrize("name", ["shuffled", "all_experts", "blockwise"])
@pytest.mark.parametrize("quantization", [q for q in FORMATS if q != "none"])
def test_kernels_every_format(name, quantization):
    """The Triton kernels end to end: grouped GEMM format + bias, fused GLU (+ fp8 groups),
    gather (+ fp8 rows or groups), scatter; small shapes for the interpreter."""
    cfg = gpt_oss_config(quantization=quantization, num_experts=4, block_size=16)
    layer = make_layer(cfg, seed=5)
    check(name, layer, make_input(cfg, 9, seed=6), "triton")


def test_gpt_oss_options_change_the_output():
    """Each gpt-oss option matters on this layer (else the tests above could not catch it)."""
    cfg = gpt_oss_config(dtype=torch.float32)
    layer = make_layer(cfg)
    x = make_input(cfg, 30)
    full = naive_moe(layer, x)
    for change in (dict(swiglu_limit=None), dict(activation="silu")):
        other = MoE.from_weights(cfg.replace(**change), **_weights(layer))
        assert (naive_moe(other, x, layer.route(x)) - full).abs().max() > 1e-2, change
    for drop in ("w13_bias", "w2_bias", "router_logits_bias"):
        getattr(layer, drop).data.zero_()
        assert (naive_moe(layer, x) - full).abs().max() > 1e-2, drop
        full = naive_moe(layer, x)


def _weights(layer):
    names = ("router_weight", "router_logits_bias", "w13", "w2", "w13_bias", "w2_bias")
    return {n: getattr(layer, n).data for n in names}


def test_bias_with_weights_on_input_is_refused():
    with pytest.raises(ValueError, match="expert_bias cannot be combined"):
        gpt_oss_config(router="llama4", scoring="sigmoid", apply_router_weight_on_input=True,
                       top_k=1, renormalize=False)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("quantization", list(FORMATS))
def test_gpu_formats_eager_and_graphed(quantization):
    """gpt-oss-shaped layers (K multiples of 32, biases, clamped GLU) on the GPU: eager prefill
    with every graph-safe strategy, and CUDA-graph replays that follow a changing routing."""
    from shufflemoe import graphed

    cfg = gpt_oss_config(hidden_size=1024, intermediate_size=512, num_experts=32, top_k=4,
                         swiglu_limit=7.0, quantization=quantization)
    layer = make_layer(cfg, device="cuda")
    x = make_input(cfg, 300, device="cuda")
    ref, mag = naive_moe(layer, x, layer.route(x), with_magnitude=True)
    for name in ("shuffled", "blockwise", "all_experts", "selective"):
        layer.set_experts(name)
        assert_close(layer(x), ref, tolerance_key(cfg), name=name, magnitude=mag)
    layer.set_experts("shuffled")
    decode = graphed(layer, token_buckets=(1, 8, 64))
    for step, T in enumerate((1, 8, 5, 64)):
        x = make_input(cfg, T, seed=50 + step, device="cuda")
        ref, mag = naive_moe(layer, x, layer.route(x), with_magnitude=True)
        assert_close(decode(x), ref, tolerance_key(cfg), name=f"replay T={T}", magnitude=mag)
