"""The ``shuffled`` strategy's fused decode path (ops.moe_decode) through the Triton kernels (the
interpreter on the CPU), against the float64 naive_moe: every router kind, fp32 / bf16 / fp8,
k up to 8 of E = 128, capacity drops, T = 1 and odd T, split-K forced on; and the switch: which
A takes the fused path, and that the layer's output does not depend on it beyond rounding."""

import dataclasses

import pytest
import torch

from factories import gpt_oss_config, make_input, make_layer
from shufflemoe import MoEConfig, naive_moe
from shufflemoe.ops import _impl, use_impl
from shufflemoe.ops.moe_decode import configs
from shufflemoe.testing import assert_close, tolerance_key

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def split_config(cfg: MoEConfig) -> configs.DecodeConfig:
    """16-wide tiles with K split 2 and 3 ways (fp8 dots need K steps of 32 on the GPU)."""
    bk = 32 if (cfg.quantized and DEV == "cuda") or cfg.quantization == "mxfp4" else 16
    return configs.DecodeConfig(configs.GemmConfig(16, bk, 2), configs.GemmConfig(16, bk, 3))


CONFIGS = {
    "llama4 (weights on input)": MoEConfig(hidden_size=40, intermediate_size=24, num_experts=16,
                                          router="llama4", scoring="sigmoid",
                                          apply_router_weight_on_input=True,
                                          shared_intermediate_size=24),
    "qwen3 (k=8 of 128)": MoEConfig(hidden_size=32, intermediate_size=16, num_experts=128,
                                    top_k=8, renormalize=True),
    "deepseek (group-limited)": MoEConfig(hidden_size=32, intermediate_size=16, num_experts=32,
                                          top_k=4, router="group_limited", scoring="sigmoid",
                                          correction_bias=True, n_group=4, topk_group=2,
                                          routed_scaling_factor=2.5, renormalize=True),
    "mixtral fp8": MoEConfig(hidden_size=48, intermediate_size=40, num_experts=8, top_k=2,
                             renormalize=True, quantization="fp8_rowwise"),
    "llama4 fp8": MoEConfig(hidden_size=40, intermediate_size=24, num_experts=16,
                            router="llama4", scoring="sigmoid",
                            apply_router_weight_on_input=True, quantization="fp8_rowwise"),
    "llama4 fp8_w8a16": MoEConfig(hidden_size=40, intermediate_size=24, num_experts=16,
                                  router="llama4", scoring="sigmoid",
                                  apply_router_weight_on_input=True, shared_intermediate_size=24,
                                  quantization="fp8_w8a16"),
    "qwen3 mxfp4 (k=8 of 64)": MoEConfig(hidden_size=64, intermediate_size=96, num_experts=64,
                                         top_k=8, renormalize=True, quantization="mxfp4"),
    "llama4 mxfp4": MoEConfig(hidden_size=64, intermediate_size=96, num_experts=16,
                              router="llama4", scoring="sigmoid",
                              apply_router_weight_on_input=True, shared_intermediate_size=32,
                              quantization="mxfp4"),
    # two 128-column scale blocks along D and along I, the last partial
    "qwen3 fp8_block (k=8 of 64)": MoEConfig(hidden_size=160, intermediate_size=144,
                                             num_experts=64, top_k=8, renormalize=True,
                                             quantization="fp8_block"),
    "llama4 fp8_block": MoEConfig(hidden_size=160, intermediate_size=144, num_experts=16,
                                  router="llama4", scoring="sigmoid",
                                  apply_router_weight_on_input=True,
                                  shared_intermediate_size=144, quantization="fp8_block"),
    "mixtral fp32 with capacity drops": MoEConfig(hidden_size=24, intermediate_size=20,
                                                  num_experts=8, top_k=2, dtype=torch.float32,
                                                  capacity_factor=0.5),
    # router bias, expert biases, the clamped swiglu_oai GLU
    "gpt-oss (k=4 of 16)": gpt_oss_config(num_experts=16, top_k=4),
    "gpt-oss mxfp4": gpt_oss_config(quantization="mxfp4"),
}


@pytest.fixture
def fused_calls(monkeypatch):
    """The strategy's calls into the fused kernels' entry point (each implementation's,
    which the strategy calls unchecked; the default switch fuses bf16 top-1 layers only: tests
    that need the others force it with configs.ALWAYS), each as its ``early`` flag. The routed
    experts' calls only: a shared expert's (MoE.shared_expert at decode sizes) use workspace 1."""
    calls = []

    def counted(real):
        def call(*a, **k):
            if (a[7] if len(a) > 7 else k.get("workspace", 0)) == 0:
                calls.append(k.get("early", False))
            return real(*a, **k)
        return call

    for impl, ops in list(_impl._OPS.items()):
        monkeypatch.setitem(_impl._OPS, impl,
                            dataclasses.replace(ops, decode_gate_up=counted(ops.decode_gate_up)))
    return calls


CASES = [(name, 5) for name in CONFIGS] + [
    ("llama4 (weights on input)", 1), ("qwen3 (k=8 of 128)", 1), ("llama4 fp8", 1),
    ("mixtral fp8", 1),
    ("gpt-oss mxfp4", 1), ("llama4 fp8_block", 1)]


@pytest.mark.parametrize("name,T", CASES, ids=[f"{n}-T={t}" for n, t in CASES])
def test_layer_through_fused_kernels(name, T, fused_calls):
    cfg = CONFIGS[name]
    layer = make_layer(cfg, seed=T, device=DEV)
    x = make_input(cfg, T, seed=T + 1, device=DEV)
    r = layer.route(x)
    ref, mag = naive_moe(layer, x, r, with_magnitude=True)
    with use_impl("triton"), configs.override(split_config(cfg)), configs.override(configs.ALWAYS):
        y = layer(x)
    assert fused_calls, "the fused path was not taken"
    assert_close(y, ref, tolerance_key(cfg), name=f"{name} T={T}", magnitude=mag)


def test_layer_says_x_is_ready(fused_calls):
    """The layer tells the fused gate_up that x is its input, written before the routing's
    launches (early: fp8 rowwise at T = 1 takes x's amax before the PDL wait); the strategy
    called by itself, whose caller's last kernel might write x, does not."""
    cfg = CONFIGS["mixtral fp8"]
    layer = make_layer(cfg, device=DEV)
    x = make_input(cfg, 1, seed=3, device=DEV)
    r = layer.route(x)
    ref, mag = naive_moe(layer, x, r, with_magnitude=True)
    with use_impl("triton"), configs.override(configs.ALWAYS):
        y = layer(x)
        assert fused_calls == [True]
        out = torch.full_like(x, float("nan"))
        layer.experts.forward(x, r, layer.expert_weights, out, cfg, overwrite=True)
        assert fused_calls == [True, False]
    assert_close(y, ref, tolerance_key(cfg), magnitude=mag)
    assert_close(out, ref, tolerance_key(cfg), magnitude=mag)


def test_switch_picks_the_path(fused_calls):
    """With the kernels, by default: bf16 layers of any k while T * k <= 64, fp8_w8a16 layers
    while T <= 4, or T <= 8 with 2 T k <= E, fp8_block layers of 16 experts or more while T <= 4,
    mxfp4 top-1 layers while T <= 8 (others at T = 1);
    fp8 rowwise top-1 layers of 16 experts or more only on a GPU named in Switch.fp8_top1_tokens
    (the H100 and the H200: T <= 8); a Switch in force decides otherwise. The
    torch references always run the unfused ops."""
    gpu = torch.cuda.get_device_name() if DEV == "cuda" else ""
    most = dict(configs.Switch().fp8_top1_tokens).get(gpu, 0)  # fp8 rowwise top-1
    cases = [("llama4 (weights on input)", 64, True), ("llama4 (weights on input)", 65, False),
             ("qwen3 (k=8 of 128)", 1, True), ("qwen3 (k=8 of 128)", 9, False),
             ("llama4 fp8", 1, most >= 1), ("llama4 fp8", most + 1, False),
             ("llama4 fp8_w8a16", 8, True),
             ("llama4 fp8_w8a16", 9, False), ("llama4 mxfp4", 8, True),
             ("llama4 mxfp4", 9, False), ("qwen3 mxfp4 (k=8 of 64)", 1, True),
             ("qwen3 mxfp4 (k=8 of 64)", 2, False), ("gpt-oss (k=4 of 16)", 16, True),
             ("gpt-oss (k=4 of 16)", 17, False), ("qwen3 fp8_block (k=8 of 64)", 4, True),
             ("qwen3 fp8_block (k=8 of 64)", 5, False)]
    qwen, llama4 = CONFIGS["qwen3 (k=8 of 128)"], CONFIGS["llama4 (weights on input)"]
    layer = make_layer(qwen, device=DEV)
    with use_impl("triton"):
        for name, T, fused in cases:
            cfg = CONFIGS[name]
            fused_calls.clear()
            make_layer(cfg, device=DEV)(make_input(cfg, T, device=DEV))
            assert bool(fused_calls) == fused, (name, T)
        for T, fused in ((8, True), (9, False)):  # A = 64 fuses, A = 72 does not
            fused_calls.clear()
            with configs.override(configs.Switch(max_top_k=8)):  # in force: it decides
                layer(make_input(qwen, T, device=DEV))
            assert bool(fused_calls) == fused, T
        fused_calls.clear()
        with configs.override(configs.NEVER):
            make_layer(llama4, device=DEV)(make_input(llama4, 1, device=DEV))
        layer(make_input(qwen, 0, device=DEV))  # T = 0 never launches anything
        assert not fused_calls
    with use_impl("torch"), configs.override(configs.ALWAYS):
        make_layer(llama4)(make_input(llama4, 1))
    assert not fused_calls
    assert not fused_calls


# every distinct GEMM tiling of the tuning table's fp8_w8a16 rows (bf16 and fp8 rowwise's:
# tests/ops/test_moe_decode.py)
W8A16_TUNED = sorted({(gemm, fields) for table in (configs.TABLE, *configs.BY_DEVICE.values())
                      for key, rows in table.items()
                      if key[4] == "fp8_w8a16" for gemm, fields in zip(("gate_up", "down"), rows)})
W8A16_QWEN3 = CONFIGS["qwen3 (k=8 of 128)"].replace(quantization="fp8_w8a16")


@pytest.mark.parametrize("gemm,fields", W8A16_TUNED, ids=[f"{g}-{f}" for g, f in W8A16_TUNED])
def test_w8a16_tuned_tilings_match_float64(gemm, fields):
    """The fp8_w8a16 tilings the table picked (one-pair rows 4..64 wide with K steps up to 4 KB,
    16-pair MMA tiles converting e4m3 in registers, their splits) in the layer on small shapes
    (masks past D and I, partial K steps): Llama 4 at T = 1 (its shared expert in the same
    launches) and Qwen3's k = 8 of 128 at T = 3, the other GEMM on 16-wide split tiles."""
    for cfg, T in ((CONFIGS["llama4 fp8_w8a16"], 1), (W8A16_QWEN3, 3)):
        layer = make_layer(cfg, seed=T, device=DEV)
        x = make_input(cfg, T, seed=T + 1, device=DEV)
        ref, mag = naive_moe(layer, x, layer.route(x), with_magnitude=True)
        tiles = split_config(cfg).with_(**{gemm: configs.GemmConfig(*fields)})
        with use_impl("triton"), configs.override(tiles), configs.override(configs.ALWAYS):
            y = layer(x)
        assert_close(y, ref, tolerance_key(cfg), name=f"{gemm} {fields} T={T}", magnitude=mag)


@pytest.mark.parametrize("name", ["llama4 (weights on input)", "mixtral fp8", "llama4 fp8_w8a16",
                                  "qwen3 fp8_block (k=8 of 64)", "qwen3 mxfp4 (k=8 of 64)",
                                  "gpt-oss (k=4 of 16)"])
def test_fused_and_unfused_paths_agree(name):
    """The two paths differ only in rounding (the fused one keeps gate/up in float32)."""
    cfg = CONFIGS[name]
    layer = make_layer(cfg, device=DEV)
    x = make_input(cfg, 6, device=DEV)
    r = layer.route(x)
    _, mag = naive_moe(layer, x, r, with_magnitude=True)
    with use_impl("triton"), configs.override(split_config(cfg)):
        with configs.override(configs.ALWAYS):
            fused = layer(x)
        with configs.override(configs.NEVER):
            unfused = layer(x)
    assert_close(fused, unfused.double(), tolerance_key(cfg), magnitude=mag)


@pytest.mark.parametrize("name,T", [("llama4 fp8", 1), ("llama4 fp8", 5), ("mixtral fp8", 1),
                                    ("mixtral fp8", 5), ("llama4 fp8 + shared", 1),
                                    ("llama4 fp8 + shared", 2)])
def test_fp8_rows_quantized_in_down(name, T, monkeypatch):
    """Where down's tiles hold one pair (configs.down_quantizes), gate_up leaves fp8 rowwise's
    rows of a in float32 and down quantizes them in its loads: bit for bit the layer's output
    with gate_up quantizing them (q, scale), and against float64 (+ shared: the shared expert
    merged into the same launches, its rows in sa)."""
    cfg = CONFIGS[name.removesuffix(" + shared")]
    if name.endswith("+ shared"):
        cfg = cfg.replace(shared_intermediate_size=cfg.intermediate_size)
    layer = make_layer(cfg, seed=T, device=DEV)
    x = make_input(cfg, T, seed=T + 1, device=DEV)
    ref, mag = naive_moe(layer, x, layer.route(x), with_magnitude=True)
    bk = 32 if DEV == "cuda" else 16
    tiles = configs.DecodeConfig(configs.GemmConfig(8, bk, 2, block_m=1),
                                 configs.GemmConfig(8, bk, 3, block_m=1))
    asked, real = [], configs.down_quantizes
    with use_impl("triton"), configs.override(tiles), configs.override(configs.ALWAYS):
        monkeypatch.setattr(configs, "down_quantizes",
                            lambda *args: asked.append(real(*args)) or asked[-1])
        in_down = layer(x)
        monkeypatch.setattr(configs, "down_quantizes", lambda *args: False)
        in_gate_up = layer(x)
    assert asked and all(asked), "the layer did not leave a's rows to down"
    assert torch.equal(in_down, in_gate_up)
    assert_close(in_down, ref, tolerance_key(cfg), name=f"{name} T={T}", magnitude=mag)
