"""The MoE module: forward against naive_moe, input shapes, from_weights, fp8, bad input."""

import contextlib

import pytest
import torch

from factories import make_input, make_layer
from shufflemoe.testing import tolerance_key
from shufflemoe import EXPERTS, MoE, MoEConfig, naive_moe
from shufflemoe.layer import SHARED_FUSED_MAX_TOKENS
from shufflemoe.ops import use_impl
from shufflemoe.ops.moe_decode import configs
from shufflemoe.testing import assert_close

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CONFIGS = {
    "llama4-like": MoEConfig(hidden_size=40, intermediate_size=24, num_experts=16, router="llama4",
                             scoring="sigmoid", apply_router_weight_on_input=True,
                             shared_intermediate_size=24),
    "qwen3-like": MoEConfig(hidden_size=32, intermediate_size=16, num_experts=128, top_k=8,
                            renormalize=True),
    "qwen2-like": MoEConfig(hidden_size=32, intermediate_size=16, num_experts=8, top_k=4,
                            shared_intermediate_size=40, shared_expert_gate=True),
    "qwen3-next-like": MoEConfig(hidden_size=32, intermediate_size=16, num_experts=32, top_k=4,
                                 renormalize=True, shared_intermediate_size=16,
                                 shared_expert_gate=True),
    "deepseek-like": MoEConfig(hidden_size=32, intermediate_size=16, num_experts=32, top_k=4,
                               router="group_limited", scoring="sigmoid", correction_bias=True,
                               n_group=4, topk_group=2, routed_scaling_factor=2.5,
                               renormalize=True, shared_intermediate_size=16,
                               router_logits_dtype=torch.float32),  # as transformers computes
    # HY-V4: the routed experts clamp gate and up (a limit most products pass), the shared
    # expert of their width does not
    "hy-v4-like": MoEConfig(hidden_size=32, intermediate_size=16, num_experts=32, top_k=4,
                            router="group_limited", scoring="sigmoid", correction_bias=True,
                            n_group=4, topk_group=2, renormalize=True,
                            shared_intermediate_size=16, swiglu_limit=0.25),
    "mixtral-fp8": MoEConfig(hidden_size=48, intermediate_size=32, num_experts=8, top_k=2,
                             renormalize=True, quantization="fp8_rowwise"),
    "mixtral-fp32": MoEConfig(hidden_size=48, intermediate_size=32, num_experts=8, top_k=2,
                              renormalize=True, dtype=torch.float32),
}


def check_layer(layer, x):
    flat = x.reshape(-1, x.shape[-1])
    r = layer.route(flat)
    ref, mag = (t.view(x.shape) for t in naive_moe(layer, flat, r, with_magnitude=True))
    y = layer(x)
    assert y.shape == x.shape and y.dtype == x.dtype
    assert_close(y, ref, tolerance_key(layer.config), magnitude=mag)


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("experts", ["shuffled", "blockwise"])
def test_layer_matches_reference(name, experts):
    cfg = CONFIGS[name]
    check_layer(make_layer(cfg, experts=experts), make_input(cfg, 61))


@pytest.mark.parametrize("merge", [configs.Switch().shared_max_tokens, 16],
                         ids=["default", "merge-16"])
@pytest.mark.parametrize("name", ["llama4-like", "deepseek-like", "qwen2-like",
                                  "qwen3-next-like", "hy-v4-like"])
@pytest.mark.parametrize("T", [1, 5, 16, 17])
def test_eager_decode_fuses_a_shared_expert(name, T, merge):
    """Up to SHARED_FUSED_MAX_TOKENS tokens the Triton path runs a shared expert, gated
    (Qwen2-MoE, Qwen3-Next) or not, through the fused decode kernels: one of the routed
    experts' width up to Switch.shared_max_tokens (``merge``) in the routed experts' own two
    launches ("merged"), else in one launch plan with them ("shared+routed"); larger T keep
    the shared expert's own path. Each against float64 (the default Switch records launch
    plans: their names say which path ran)."""
    cfg = CONFIGS[name]
    layer = make_layer(cfg, device=DEVICE)
    default = merge == configs.Switch().shared_max_tokens
    switch = (contextlib.nullcontext() if default
              else configs.override(configs.Switch(shared_max_tokens=merge)))
    with use_impl("triton"), switch:
        for seed in (1, 2):  # the second call replays the plan the first recorded
            check_layer(layer, make_input(cfg, T, seed=seed, device=DEVICE))
        merged = layer._merges_shared(make_input(cfg, T, device=DEVICE), layer._hot())
    fused = T <= SHARED_FUSED_MAX_TOKENS
    # (qwen2-like's shared I is 40; merged, hy-v4-like's shared rows would be clamped)
    assert merged == (fused and T <= merge and name not in ("qwen2-like", "hy-v4-like"))
    if default:
        launches = {key[0]: len(plan.launches) for key, plan in layer._hot().plans.items()}
        if fused:  # one plan a call: the router GEMV, the routing, gate_up and down (and the
            # shared expert's own gate_up and down)
            assert launches == ({"merged": 4} if merged else {"shared+routed": 6})
        else:
            assert not {"merged", "shared+routed"} & launches.keys()


@pytest.mark.parametrize("quantization", ["fp8_rowwise", "fp8_w8a16", "mxfp4"])
@pytest.mark.parametrize("T", [1, 2, 3])
def test_quantized_experts_merge_a_plain_shared_expert(quantization, T):
    """Routed experts stored fp8 rowwise, fp8_w8a16 or mxfp4 take a bf16 shared expert into
    their two fused launches up to Switch.shared_quantized_max_tokens (the default: T = 1, fp8
    rowwise and fp8_w8a16; configs.ALWAYS: T <= 2, every format), eagerly and from the recorded
    plan; each call against float64."""
    cfg = CONFIGS["llama4-like"].replace(hidden_size=64, intermediate_size=32,
                                         shared_intermediate_size=32, quantization=quantization)
    layer = make_layer(cfg, device=DEVICE)
    x = make_input(cfg, T, device=DEVICE)
    with use_impl("triton"):
        assert layer._merges_shared(x, layer._hot()) == (T == 1 and quantization != "mxfp4")
        with configs.override(configs.ALWAYS):
            for seed in (1, 2):  # the second call replays the plan the first recorded
                check_layer(layer, make_input(cfg, T, seed=seed, device=DEVICE))
            assert layer._merges_shared(x, layer._hot()) == (T <= 2)


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("shared", [24, 0], ids=["shared", "no-shared"])
def test_prefill_top1_routed_experts_write_out_first(impl, shared):
    """Past shared_stream_max_tokens with top-1 routing, GEMM2 stores each token's row into out
    (poisoned with NaN: never read) and the shared expert adds into it; a capacity factor or
    top-2 keep the shared-expert-first flow. Without a shared expert the routed experts write
    out at every T and k (combined in a fixed order). Each against float64."""
    cfg = CONFIGS["llama4-like"].replace(shared_stream_max_tokens=8,
                                          shared_intermediate_size=shared)
    layer = make_layer(cfg, device=DEVICE)
    x = make_input(cfg, 61, device=DEVICE)
    r = layer.route(x)
    ref, mag = naive_moe(layer, x, r, with_magnitude=True)
    with use_impl(impl):
        assert layer._routed_first(x) and layer._routed_first(x[:8]) == (not shared)
        out = torch.full_like(x, float("nan"))
        assert layer.forward_into(x, out) is out
        assert_close(out, ref, tolerance_key(cfg), magnitude=mag)
        check_layer(layer, x)
    top2 = dict(top_k=2, router="topk", scoring="softmax")
    for change in (dict(capacity_factor=1.0), top2, dict(top2, deterministic=False)):
        want = not shared and "capacity_factor" not in change and change.get("deterministic", True)
        assert make_layer(cfg.replace(**change), device=DEVICE)._routed_first(x) == want


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("T", [1, 3, 61])
def test_no_shared_expert_top_k_writes_out_unread(impl, T):
    """No shared expert, k = 8: out (NaN) is written, never read or zero-filled, through the fused
    decode combine (small T) and the token-major sum (T = 61), against float64."""
    cfg = CONFIGS["qwen3-like"]
    assert cfg.shared_intermediate_size == 0 and cfg.top_k > 1
    layer = make_layer(cfg, device=DEVICE)
    x = make_input(cfg, T, seed=T, device=DEVICE)
    ref, mag = naive_moe(layer, x, layer.route(x), with_magnitude=True)
    with use_impl(impl):
        assert layer._routed_first(x)
        out = torch.full_like(x, float("nan"))
        assert layer.forward_into(x, out) is out
        assert_close(out, ref, tolerance_key(cfg), magnitude=mag)


def test_batched_input_and_tiny_batches():
    cfg = CONFIGS["qwen2-like"]
    layer = make_layer(cfg)
    check_layer(layer, make_input(cfg, 2 * 9).view(2, 9, cfg.hidden_size))
    for T in (0, 1):
        check_layer(layer, make_input(cfg, T))


def test_naive_routing_agrees_without_a_given_routing():
    cfg = CONFIGS["mixtral-fp32"]
    layer = make_layer(cfg)
    x = make_input(cfg, 30)
    ref, mag = naive_moe(layer, x, with_magnitude=True)
    assert_close(layer(x), ref, torch.float32, magnitude=mag)


def test_from_weights_wraps_without_copying():
    cfg = CONFIGS["qwen2-like"]
    src = make_layer(cfg)
    names = ("router_weight", "w13", "w2", "shared_w13", "shared_w2", "shared_gate")
    layer = MoE.from_weights(cfg, **{n: getattr(src, n).data for n in names})
    for n in names:
        assert getattr(layer, n).data_ptr() == getattr(src, n).data_ptr()
    x = make_input(cfg, 20)
    assert torch.equal(layer(x), src(x))


def test_from_weights_quantizes_bf16_weights_for_fp8():
    cfg = CONFIGS["mixtral-fp8"]
    bf16 = make_layer(cfg.replace(quantization="none"))
    layer = MoE.from_weights(cfg, router_weight=bf16.router_weight.data, w13=bf16.w13.data,
                             w2=bf16.w2.data)
    assert layer.w13.dtype == torch.float8_e4m3fn and layer.w13_scale.shape == (8, 64)
    assert layer.w2_scale.shape == (8, 48)
    check_layer(layer, make_input(cfg, 33))


@pytest.mark.parametrize("change, match", [
    (dict(w13=torch.zeros(8, 64, 47)), "w13 must have shape"),
    (dict(w2=torch.zeros(8, 48, 32, dtype=torch.float32)), "w2 must have dtype"),
    (dict(shared_w13=torch.zeros(4, 48)), "shared_w13 is not used"),
    (dict(w13_scale=torch.ones(8, 64)), "w13_scale is only used"),
    (dict(router_weight=torch.zeros(8, 48)), "router_weight must have dtype"),  # fp32, no
    # router_logits_dtype
])
def test_from_weights_rejects_bad_tensors(change, match):
    cfg = CONFIGS["mixtral-fp8"].replace(quantization="none")
    src = make_layer(cfg)
    given = dict(router_weight=src.router_weight.data, w13=src.w13.data, w2=src.w2.data)
    with pytest.raises((ValueError, TypeError), match=match):
        MoE.from_weights(cfg, **{**given, **change})


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("T", [1, 5, 80])
def test_float32_router_weight_in_a_bf16_layer(impl, T):
    """ERNIE 4.5 and Hunyuan-A13B keep their router weight in float32 in a bf16 model: with
    router_logits_dtype float32 the layer takes it as stored (no copy), and both impls route on
    its float32 logits (the kernel reads it as stored; F.linear past the GEMV, T = 80)."""
    cfg = CONFIGS["deepseek-like"]
    src = make_layer(cfg, device=DEVICE)
    w32 = src.router_weight.data.float()
    layer = MoE.from_weights(cfg, router_weight=w32, w13=src.w13.data, w2=src.w2.data,
                             router_bias=src.router_bias.data, shared_w13=src.shared_w13.data,
                             shared_w2=src.shared_w2.data)
    assert layer.router_weight.data_ptr() == w32.data_ptr()
    with use_impl(impl):
        check_layer(layer, make_input(cfg, T, seed=T, device=DEVICE))


@pytest.mark.parametrize("name", ["w13", "w2"])
def test_from_weights_refuses_non_contiguous_expert_weights(name):
    """Named at construction (it used to fail at the first forward naming the kernel's "w"),
    and never copied silently: the caller decides to pay for .contiguous()."""
    cfg = CONFIGS["mixtral-fp8"].replace(quantization="none")
    src = make_layer(cfg)
    given = dict(router_weight=src.router_weight.data, w13=src.w13.data, w2=src.w2.data)
    t = given[name]
    given[name] = t.transpose(1, 2).contiguous().transpose(1, 2)  # same values, strided
    with pytest.raises(ValueError, match=f"{name} must be contiguous.*{name}.contiguous"):
        MoE.from_weights(cfg, **given)
    given[name] = given[name].contiguous()
    layer = MoE.from_weights(cfg, **given)
    assert torch.equal(layer(make_input(cfg, 5)), src(make_input(cfg, 5)))


def test_from_weights_quantizing_accepts_strided_bf16_weights():
    cfg = CONFIGS["mixtral-fp8"]  # quantized at load: a new tensor, the layout given is free
    src = make_layer(cfg.replace(quantization="none"))
    w13 = src.w13.data.transpose(1, 2).contiguous().transpose(1, 2)
    layer = MoE.from_weights(cfg, router_weight=src.router_weight.data, w13=w13, w2=src.w2.data)
    assert layer.w13.is_contiguous()


def test_missing_required_weight():
    cfg = CONFIGS["llama4-like"]
    src = make_layer(cfg)
    with pytest.raises(ValueError, match="shared_w13 is required"):
        MoE.from_weights(cfg, router_weight=src.router_weight.data, w13=src.w13.data, w2=src.w2.data)


@pytest.mark.parametrize("x, error, match", [
    (torch.randn(4, 48), TypeError, "x must have dtype"),
    (torch.randn(4, 47, dtype=torch.bfloat16), ValueError, r"x must be \[T, 48\]"),
    (torch.randn(48, dtype=torch.bfloat16), ValueError, r"x must be \[T, 48\]"),
    (torch.randn(4, 48, dtype=torch.bfloat16, device="meta"), ValueError, "x must be on cpu"),
    ("not a tensor", TypeError, "x must be a torch.Tensor"),
])
def test_bad_input_raises(x, error, match):
    layer = make_layer(CONFIGS["mixtral-fp8"])
    with pytest.raises(error, match=match):
        layer(x)


def test_unknown_strategy_lists_the_choices():
    with pytest.raises(ValueError, match="choose one of"):
        MoE(CONFIGS["qwen3-like"], experts="magic")
    assert set(EXPERTS.names()) == {"shuffled", "padded", "sliced", "concat", "blockwise",
                                    "all_experts", "selective"}


def test_strategies_agree_with_each_other():
    cfg = CONFIGS["deepseek-like"]
    x = make_input(cfg, 50)
    outs = {n: make_layer(cfg, experts=n)(x) for n in EXPERTS.names()}
    first = outs.pop("shuffled").double()
    for n, y in outs.items():
        assert (y.double() - first).abs().max() < 0.05 * first.abs().max(), n


def test_layers_of_one_config_share_what_is_not_a_tensor():
    """Layers built from equal configs hold one MoEConfig, one _Paths and one local dispatcher
    (torch.compile then guards them once for a whole model); a config equal in value but
    written differently (1 for 1.0) keeps its own, and each layer keeps its own tensors."""
    base = dict(hidden_size=24, intermediate_size=16, num_experts=8, top_k=2,
                shared_intermediate_size=16)
    a, b = (MoE(MoEConfig(**base), device=DEVICE) for _ in range(2))
    assert a.config is b.config and a.dispatch is b.dispatch
    assert a._hot().paths is b._hot().paths
    assert a._hot().weights.w13 is not b._hot().weights.w13
    # a compiled forward reads the shared _Paths by this number (MoE._traced_hot)
    assert a._paths_key == b._paths_key is not None
    c = MoE(MoEConfig(**base, routed_scaling_factor=1), device=DEVICE)
    assert c.config == a.config and c.config is not a.config
    assert type(c.config.routed_scaling_factor) is int
    assert c._hot().paths is not a._hot().paths and c._paths_key != a._paths_key
    c.set_experts("sliced")  # a new strategy: gathered again, under its own number
    assert c._paths_key is None and c._hot().paths.experts.name == "sliced"
    assert c._paths_key not in (None, a._paths_key)


def test_a_copied_layer_gathers_anew():
    """deepcopy and pickle drop what belongs to the original (its launch plans, which replay its
    own tensors' addresses; its number in this process's _PATHS): the copy gathers its own,
    and changing its weights changes only its output."""
    import copy
    import io

    cfg = MoEConfig(hidden_size=24, intermediate_size=16, num_experts=8, top_k=2,
                    shared_intermediate_size=16)
    layer = MoE(cfg, device=DEVICE)
    x = make_input(cfg, 3, device=DEVICE)
    want = layer(x)
    assert layer._paths_key is not None
    buf = io.BytesIO()
    torch.save(layer, buf)
    buf.seek(0)
    for twin in (copy.deepcopy(layer), torch.load(buf, weights_only=False)):
        assert twin._hot_parts is None and twin._paths_key is None
        assert torch.equal(twin(x), want)
        with torch.no_grad():
            twin.w2.mul_(2)
        assert not torch.equal(twin(x), want) and torch.equal(layer(x), want)
