"""The benchmark peers compute the same layer as shufflemoe (else a speedup means nothing).
They route with torch.topk, which breaks exact ties of bf16 logits its own way (shufflemoe picks
the lower expert id), so each is checked against naive_moe under the routing torch.topk gives."""

import pytest
import torch

from factories import make_input, make_layer
from shufflemoe import MoEConfig, naive_moe
from shufflemoe.bench.peers import _topk, hf_block, hf_block_forward, per_expert_loop, torch_pipeline
from shufflemoe.ops import sort_by_expert
from shufflemoe.testing import assert_close

LAYERS = {
    "llama4_text": MoEConfig(hidden_size=64, intermediate_size=32, num_experts=16, router="llama4",
                             scoring="sigmoid", apply_router_weight_on_input=True,
                             shared_intermediate_size=32),
    "qwen3_moe": MoEConfig(hidden_size=64, intermediate_size=32, num_experts=32, top_k=8,
                           renormalize=True),
    "mixtral": MoEConfig(hidden_size=64, intermediate_size=48, num_experts=8, top_k=2,
                         renormalize=True),
}


def check(out, layer, x):
    ids, weights = _topk(layer, x)
    routing = sort_by_expert(ids, layer.config.num_experts, weights)
    ref, mag = naive_moe(layer, x, routing, with_magnitude=True)
    assert_close(out, ref, layer.config.dtype, magnitude=mag)


@pytest.mark.parametrize("model_type", LAYERS)
@pytest.mark.parametrize("peer", ["per_expert_loop", "torch_pipeline", "hf_block"])
def test_peer_computes_the_layer(model_type, peer):
    layer = make_layer(LAYERS[model_type])
    x = make_input(layer.config, 41)
    if peer == "per_expert_loop":
        out = per_expert_loop(layer, x)
    elif peer == "torch_pipeline":
        out = torch_pipeline(layer, x)
    else:
        impl = None if model_type == "llama4_text" else "grouped_mm"
        out = hf_block_forward(hf_block(model_type, layer, impl), x)
    check(out, layer, x)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch._scaled_grouped_mm needs a GPU")
def test_fp8_torch_pipeline():
    layer = make_layer(LAYERS["mixtral"].replace(quantization="fp8_rowwise"), device="cuda")
    x = make_input(layer.config, 41, device="cuda")
    check(torch_pipeline(layer, x), layer, x)
