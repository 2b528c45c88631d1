"""MoEConfig(batch_invariant=True): a row's output is the same bits alone, in a small batch, in a
large batch and at any position in it (the kernels: in the interpreter on the CPU, compiled on a
GPU). The default mode is checked to differ on the CPU, so the comparison can fail."""

from __future__ import annotations

import pytest
import torch

from factories import make_input, make_layer
from shufflemoe import MoE, MoEConfig
from shufflemoe.dispatch import LocalDispatch
from shufflemoe.ops import use_impl
from shufflemoe.reference import naive_moe
from shufflemoe.testing import assert_close, tolerance_key

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"

CONFIGS = {
    # k = 4: the token-major combine; E = 16 experts, softmax renormalized
    "qwen3-like-bf16": MoEConfig(hidden_size=48, intermediate_size=24, num_experts=16, top_k=4,
                                 renormalize=True),
    # weights on the input, a gated shared expert, fp8 experts
    "llama4-like-shared-gate-fp8": MoEConfig(hidden_size=64, intermediate_size=32, num_experts=8,
                                             router="llama4", scoring="sigmoid",
                                             apply_router_weight_on_input=True,
                                             shared_intermediate_size=32, shared_expert_gate=True,
                                             quantization="fp8_rowwise"),
    # group-limited routing, float32 router logits from bf16 rows
    "deepseek-like-fp32-logits": MoEConfig(hidden_size=32, intermediate_size=16, num_experts=16,
                                           top_k=4, router="group_limited", scoring="sigmoid",
                                           n_group=4, topk_group=2, correction_bias=True,
                                           renormalize=True, routed_scaling_factor=2.5,
                                           shared_intermediate_size=16,
                                           router_logits_dtype=torch.float32),
}
LARGE = 29  # tokens of the large batch (the interpreter runs every program on the CPU)
ROWS = (0, 28)  # rows checked alone and in the other batches


def _outputs(layer: MoE, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """The rows ROWS of x run alone, in small batches at other positions, in the large batch."""
    rows = list(ROWS)
    with use_impl("triton"):
        return {
            "alone": torch.cat([layer(x[i:i + 1]) for i in rows]),
            "in a small batch, reversed": layer(x[[5, *rows[::-1], 6]])[1:3].flip(0),
            "in the large batch": layer(x)[rows],
            "in the large batch, moved": layer(torch.cat([x[9:], x[:9]]))[[r - 9 for r in rows]],
        }


@pytest.mark.parametrize("name", CONFIGS)
def test_rows_are_bit_identical_in_any_batch(name):
    cfg = CONFIGS[name].replace(batch_invariant=True)
    layer = make_layer(cfg, seed=3, device=DEV)
    x = make_input(cfg, LARGE, seed=4, device=DEV)
    got = _outputs(layer, x)
    first = got["alone"]
    for where, y in got.items():
        assert torch.equal(y, first), f"{name}: rows {where} differ from the rows alone"
    # and right: within the dtype tolerance of the float64 layer on the layer's routing
    with use_impl("triton"):
        r = layer.route(x)
    ref, mag = naive_moe(layer, x, r, with_magnitude=True)
    assert_close(first, ref[list(ROWS)], tolerance_key(cfg), magnitude=mag[list(ROWS)])


@pytest.mark.skipif(not CUDA, reason="wgmma tiles: the interpreter has no MMA")
@pytest.mark.parametrize("name", CONFIGS)
def test_rows_keep_their_bits_across_the_tile_switch(name):
    """Up to BATCH_INVARIANT_ROWS rows the grouped GEMM takes the default mode's decode tiles
    (swap_ab, wide K steps), above them one wide tile: a row's bits must not change between
    them, for every k, bf16 and fp8 (the large batch passes the switch at k = 1 too)."""
    from shufflemoe.ops.grouped_gemm.configs import BATCH_INVARIANT_ROWS

    cfg = CONFIGS[name].replace(batch_invariant=True)
    layer = make_layer(cfg, seed=5, device=DEV)
    x = make_input(cfg, BATCH_INVARIANT_ROWS + 37, seed=6, device=DEV)
    rows = [0, 17, BATCH_INVARIANT_ROWS + 36]
    with use_impl("triton"):
        alone = torch.cat([layer(x[i:i + 1]) for i in rows])
        assert torch.equal(alone, layer(x)[rows]), name


@pytest.mark.skipif(CUDA, reason="the counter-check is for the interpreter's kernels")
def test_the_default_mode_is_not_batch_invariant():
    """Without the mode, rows alone and in the batch differ: the check has teeth (in float32,
    the router's F.linear alone differs between one row and many)."""
    cfg = CONFIGS["qwen3-like-bf16"].replace(dtype=torch.float32)
    layer = make_layer(cfg, seed=3)
    x = make_input(cfg, LARGE, seed=4)
    with use_impl("triton"):
        alone = torch.cat([layer(x[i:i + 1]) for i in ROWS])
        assert not torch.equal(alone, layer(x)[list(ROWS)])


class _OtherDispatch(LocalDispatch):
    name = "all_reduce_somewhere"  # any dispatcher but local: its sums follow message sizes


@pytest.mark.parametrize("change, match", [
    (dict(experts="padded"), "needs experts='shuffled'"),
    (dict(dispatch=_OtherDispatch()), "needs local dispatch"),
])
def test_unsupported_combinations_are_refused(change, match):
    cfg = CONFIGS["qwen3-like-bf16"].replace(batch_invariant=True)
    with pytest.raises(ValueError, match=match):
        MoE(cfg, **change)


def test_from_weights_needs_every_weight_contiguous():
    cfg = CONFIGS["llama4-like-shared-gate-fp8"].replace(quantization="none", batch_invariant=True)
    src = make_layer(cfg)
    weights = dict(router_weight=src.router_weight.data, w13=src.w13.data, w2=src.w2.data,
                   shared_w13=src.shared_w13.data, shared_gate=src.shared_gate.data,
                   shared_w2=src.shared_w2.data.t().contiguous().t())
    with pytest.raises(ValueError, match="shared_w2 must be contiguous"):
        MoE.from_weights(cfg, **weights)


@pytest.mark.skipif(CUDA, reason="on a GPU the kernels run without the interpreter")
def test_needs_the_kernels():
    layer = make_layer(CONFIGS["qwen3-like-bf16"].replace(batch_invariant=True))
    with use_impl("torch"), pytest.raises(ValueError, match="needs the Triton kernels"):
        layer(make_input(layer.config, 2))
