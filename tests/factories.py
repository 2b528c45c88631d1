"""Random MoE cases shared by the tests: hypothesis strategies and small builders."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from shufflemoe import MoE, MoEConfig

DIVISORS_UP_TO_8 = {E: [g for g in (1, 2, 4, 8) if E % g == 0] for E in (1, 2, 3, 8, 16, 64, 128, 256)}


@st.composite
def configs(draw, *, dtypes=(torch.float32, torch.bfloat16), allow_fp8=True, allow_shared=True,
            allow_capacity=True) -> MoEConfig:
    """Any valid MoEConfig with small, odd widths: E up to 256, k up to 8, every router."""
    E = draw(st.sampled_from(sorted(DIVISORS_UP_TO_8)))
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
                      routed_scaling_factor=draw(st.sampled_from([1.0, 2.5])),
                      renormalize=draw(st.booleans()))
    else:
        fields.update(top_k=draw(st.integers(1, min(8, E))),
                      scoring=draw(st.sampled_from(["softmax", "sigmoid"])),
                      renormalize=draw(st.booleans()))
    if allow_capacity and draw(st.booleans()):
        fields["capacity_factor"] = draw(st.sampled_from([0.5, 1.0, 1.25]))
        if fields.get("renormalize"):
            fields["renormalize_over"] = draw(st.sampled_from(["kept", "chosen"]))
    if allow_shared and draw(st.booleans()):
        fields["shared_intermediate_size"] = draw(st.sampled_from([3, 16]))
        fields["shared_expert_gate"] = draw(st.booleans())
    if allow_fp8 and fields["dtype"] == torch.bfloat16 and fields["hidden_size"] > 1 and draw(st.booleans()):
        fields["quantization"] = "fp8_rowwise"
    return MoEConfig(**fields)


def make_layer(cfg: MoEConfig, seed: int = 0, experts: str = "shuffled", device: str = "cpu") -> MoE:
    torch.manual_seed(seed)
    layer = MoE(cfg, experts=experts, device=device)
    if layer.router_bias is not None:  # a real bias, so selection and weights differ
        layer.router_bias.data.normal_(0.0, 0.5)
    return layer


def make_input(cfg: MoEConfig, T: int, seed: int = 1, device: str = "cpu") -> torch.Tensor:
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(T, cfg.hidden_size, generator=g).to(device=device, dtype=cfg.dtype)
