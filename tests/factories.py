"""Random MoE cases shared by the tests: hypothesis strategies and small builders."""

from __future__ import annotations

import pytest
import torch
from hypothesis import strategies as st

from shufflemoe import EXPERTS, MoE, MoEConfig, naive_moe
from shufflemoe.reference import naive_route, routing_triples
from shufflemoe.testing import assert_close, tolerance_key

QUANTIZED = ("fp8_rowwise", "fp8_w8a16", "fp8_block", "mxfp4")
DIVISORS_UP_TO_8 = {E: [g for g in (1, 2, 4, 8) if E % g == 0] for E in (1, 2, 3, 8, 16, 64, 128, 256)}


@st.composite
def configs(draw, *, dtypes=(torch.float32, torch.bfloat16), allow_fp8=True, allow_shared=True,
            allow_capacity=True, max_experts=256) -> MoEConfig:
    """Any valid MoEConfig with small, odd widths: E up to 256, k up to 8, every router."""
    E = draw(st.sampled_from([E for E in sorted(DIVISORS_UP_TO_8) if E <= max_experts]))
    router = draw(st.sampled_from(["topk", "llama4", "group_limited"]))
    fields: dict = dict(num_experts=E, router=router,
                        hidden_size=draw(st.sampled_from([1, 7, 24, 33])),
                        intermediate_size=draw(st.sampled_from([1, 5, 16, 19])),
                        dtype=draw(st.sampled_from(dtypes)))
    if router == "llama4":
        fields.update(scoring="sigmoid", apply_router_weight_on_input=True,
                      top_k=draw(st.integers(1, min(2, E))))
    elif router == "group_limited":
        n_group = draw(st.sampled_from(DIVISORS_UP_TO_8[E]))
        topk_group = draw(st.integers(1, n_group))
        fields.update(n_group=n_group, topk_group=topk_group,
                      top_k=draw(st.integers(1, min(8, topk_group * (E // n_group)))),
                      scoring=draw(st.sampled_from(["softmax", "sigmoid"])),
                      correction_bias=draw(st.booleans()),
                      group_score=draw(st.sampled_from(["top2", "max"])),
                      routed_scaling_factor=draw(st.sampled_from([1.0, 2.5])),
                      renormalize=draw(st.booleans()))
    else:
        fields.update(top_k=draw(st.integers(1, min(8, E))),
                      scoring=draw(st.sampled_from(["softmax", "sigmoid"])),
                      renormalize=draw(st.booleans()))
    if fields["dtype"] != torch.float32 and draw(st.booleans()):  # DeepSeek-V3's, in HF
        fields["router_logits_dtype"] = torch.float32
    if allow_capacity and draw(st.booleans()):
        fields["capacity_factor"] = draw(st.sampled_from([0.5, 1.0, 1.25]))
        if fields.get("renormalize"):
            fields["renormalize_over"] = draw(st.sampled_from(["kept", "chosen"]))
    if allow_shared and draw(st.booleans()):
        fields["shared_intermediate_size"] = draw(st.sampled_from([3, 16]))
        fields["shared_expert_gate"] = draw(st.booleans())
    if allow_fp8 and fields["dtype"] == torch.bfloat16 and fields["hidden_size"] > 1 and draw(st.booleans()):
        fields["quantization"] = draw(st.sampled_from(QUANTIZED))
        if fields["quantization"] == "mxfp4":  # K of both GEMMs a multiple of 32
            fields.update(hidden_size=draw(st.sampled_from([32, 64])), intermediate_size=32)
    if draw(st.booleans()):  # gpt-oss's options
        fields.update(activation=draw(st.sampled_from(["silu", "swiglu_oai"])),
                      swiglu_limit=draw(st.sampled_from([None, 1.0, 7.0])),
                      router_logits_bias=draw(st.booleans()),
                      expert_bias=not fields.get("apply_router_weight_on_input")
                      and draw(st.booleans()))
    return MoEConfig(**fields)


def make_layer(cfg: MoEConfig, seed: int = 0, experts: str = "shuffled", device: str = "cpu") -> MoE:
    torch.manual_seed(seed)
    layer = MoE(cfg, experts=experts, device=device)
    if layer.router_bias is not None:  # a real bias, so selection and weights differ
        layer.router_bias.data.normal_(0.0, 0.5)
    return layer


def gpt_oss_config(**overrides) -> MoEConfig:
    """A small layer with gpt-oss's options: router bias, softmax over the chosen top-k (= topk
    softmax renormalized), expert biases, the clamped GLU; widths that every format can store."""
    base = dict(hidden_size=64, intermediate_size=32, num_experts=8, top_k=2, renormalize=True,
                router_logits_bias=True, expert_bias=True, activation="swiglu_oai",
                swiglu_limit=1.5, dtype=torch.bfloat16)
    return MoEConfig(**{**base, **overrides})


def make_input(cfg: MoEConfig, T: int, seed: int = 1, device: str = "cpu") -> torch.Tensor:
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(T, cfg.hidden_size, generator=g).to(device=device, dtype=cfg.dtype)


def check_routing(layer: MoE, x: torch.Tensor, r) -> None:
    """Routing r of x matches the float64 routing of naive_route: the same pairs (or pairs that
    differ only where float32 and float64 logits rank two near-equal experts differently) and
    the same weights within float32."""
    got = {(t, e): w for t, e, w in routing_triples(r)}
    want = {(t, e): w for t, e, w in naive_route(layer, x)}
    if got.keys() != want.keys():
        logits = x.double() @ layer.router_weight.double().t()
        for t, e in got.keys() ^ want.keys():
            others = [ee for tt, ee in (got.keys() | want.keys()) if tt == t and ee != e]
            assert min(abs(logits[t, e] - logits[t, o]).item() for o in others) < 1e-4
        return
    for key, w in want.items():
        assert got[key] == pytest.approx(w, rel=2e-6, abs=1e-7), key


def check_strategy(name, layer, x, routing):
    """Expert strategy ``name`` adds the layer's routed output into a random ``out`` (never zeros,
    so a pair written twice or not at all shows), against the float64 naive_moe."""
    cfg = layer.config
    base = torch.randn(x.shape, generator=torch.Generator().manual_seed(7)).to(x.device, cfg.dtype)
    out = base.clone()
    EXPERTS.get(name).forward(x, routing, layer.expert_weights, out, cfg)
    ref, mag = naive_moe(layer, x, routing, with_magnitude=True)
    return assert_close(out, base.double() + ref, tolerance_key(cfg), name=f"{name} {cfg}",
                        magnitude=base.double().abs() + mag)
