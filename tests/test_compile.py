"""torch.compile(fullgraph=True) of the MoE layer: zero graph breaks (torch._dynamo.explain) and
the eager result, for each dtype, each graph-safe expert strategy, the references and the Triton
kernels (interpreted on the CPU), and a batch size that changes between calls."""

from __future__ import annotations

import pytest
import torch

from factories import gpt_oss_config, make_input, make_layer
from shufflemoe import EXPERTS, MoEConfig
from shufflemoe.ops import triton_available, use_impl

CONFIGS = {  # one router kind and one dtype each
    "qwen2-fp32": MoEConfig(hidden_size=32, intermediate_size=16, num_experts=8, top_k=2,
                            shared_intermediate_size=24, shared_expert_gate=True,
                            dtype=torch.float32),
    "deepseek-bf16": MoEConfig(hidden_size=32, intermediate_size=16, num_experts=16, top_k=4,
                               router="group_limited", scoring="sigmoid", correction_bias=True,
                               n_group=4, topk_group=2, routed_scaling_factor=2.5,
                               renormalize=True, shared_intermediate_size=16),
    "llama4-fp8": MoEConfig(hidden_size=32, intermediate_size=32, num_experts=8, router="llama4",
                            scoring="sigmoid", apply_router_weight_on_input=True,
                            shared_intermediate_size=32, quantization="fp8_rowwise"),
    # the other formats' ops (fp8 groups, mxfp4 weights) and gpt-oss's biases and GLU
    "gpt-oss-mxfp4": gpt_oss_config(num_experts=8, quantization="mxfp4"),
    "qwen3-fp8-block": MoEConfig(hidden_size=32, intermediate_size=16, num_experts=8, top_k=2,
                                 renormalize=True, quantization="fp8_block"),
}
GRAPH_SAFE = [n for n in EXPERTS.names() if EXPERTS.get(n).graph_safe]
IMPLS = ["torch", "triton"] if triton_available() else ["torch"]


def assert_no_graph_breaks(fn, *args) -> None:
    explained = torch._dynamo.explain(fn)(*args)
    reasons = [str(b.reason).splitlines()[0] for b in explained.break_reasons]
    assert explained.graph_break_count == 0 and explained.graph_count == 1, reasons


def check_compiles(layer, sizes=(5, 9), backend="aot_eager") -> None:
    """No graph break, and the compiled layer returns the eager result bit for bit at each T."""
    torch._dynamo.reset()
    assert_no_graph_breaks(layer, make_input(layer.config, sizes[0]))
    compiled = torch.compile(layer, fullgraph=True, backend=backend)
    for T in sizes:
        x = make_input(layer.config, T, seed=T)
        assert torch.equal(compiled(x), layer(x)), f"T={T}"


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", CONFIGS)
def test_layer_compiles_without_graph_breaks(name, impl):
    with use_impl(impl):  # the interpreter is slow: one size for the kernels
        check_compiles(make_layer(CONFIGS[name]), sizes=(5, 9) if impl == "torch" else (5,))


@pytest.mark.parametrize("experts", [n for n in GRAPH_SAFE if n != "shuffled"])
def test_graph_safe_strategies_compile(experts):
    check_compiles(make_layer(CONFIGS["qwen2-fp32"], experts=experts), sizes=(7,))


def test_inductor_matches_eager():
    """Inductor fuses the torch code around the custom ops; the ops' results are unchanged."""
    layer = make_layer(CONFIGS["qwen2-fp32"])
    x = make_input(layer.config, 6)
    torch._dynamo.reset()
    got = torch.compile(layer, fullgraph=True)(x)
    torch.testing.assert_close(got, layer(x), rtol=1e-5, atol=1e-6)
