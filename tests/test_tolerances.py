"""The tolerance table is tight: the measured error uses a real share of the bound (a bound 100x
the error could not catch a rounding bug), and never exceeds it. The largest errors relative to
the magnitude of the terms come from the narrowest layers (I = 1: nothing averages), so those are
the cases measured here."""

import torch

from factories import gpt_oss_config, make_input, make_layer
from shufflemoe.testing import tolerance_key
from shufflemoe import MoEConfig
from shufflemoe.reference import naive_moe
from shufflemoe.testing import compare, tolerance_for

CASES = [
    MoEConfig(hidden_size=7, intermediate_size=inter, num_experts=8, top_k=2, renormalize=True,
              dtype=dtype, quantization=q)
    for dtype, q, inter in [(torch.float32, "none", 1), (torch.bfloat16, "none", 1),
                            (torch.bfloat16, "fp8_rowwise", 16), (torch.bfloat16, "fp8_w8a16", 1),
                            (torch.bfloat16, "fp8_block", 16)]
] + [
    # mxfp4 stores K in groups of 32; gpt-oss's options (biases, clamped GLU: its own magnitude)
    MoEConfig(hidden_size=32, intermediate_size=32, num_experts=8, top_k=2, renormalize=True,
              dtype=torch.bfloat16, quantization="mxfp4"),
    gpt_oss_config(hidden_size=7, intermediate_size=1, dtype=torch.float32),
    gpt_oss_config(hidden_size=7, intermediate_size=1, dtype=torch.bfloat16),
]


def test_tolerances_are_tight_and_hold():
    for cfg in CASES:
        worst = 0.0
        for seed in range(10):
            layer = make_layer(cfg, seed)
            x = make_input(cfg, 150, seed)
            r = layer.route(x)
            ref, mag = naive_moe(layer, x, r, with_magnitude=True)
            worst = max(worst, ((layer(x).double() - ref).abs() / mag).max().item())
        bound = tolerance_for(tolerance_key(cfg)).mag
        assert worst <= bound, (cfg.dtype, cfg.quantization, worst, bound)
        assert worst >= bound / 40, f"{tolerance_key(cfg)} bound {bound} is loose: error {worst:.3g}"


def test_subnormal_outputs_get_two_steps_of_their_spacing():
    """fp16 below its normal range (spacing 2^-24): the correctly rounded output of 2.7 steps is
    off by 11% of itself, which no relative bound allows; three steps off still fails the
    magnitude bound."""
    step = 2.0 ** -24
    ref = torch.tensor([2.7 * step, 1.0], dtype=torch.float64)
    mag = ref.abs()
    assert compare(ref.half(), ref, "float16", magnitude=mag).ok
    assert compare(ref.half(), ref, "float16").ok
    off = torch.tensor([5.7 * step, 1.0], dtype=torch.float64).half()
    assert not compare(off, ref, "float16", magnitude=mag).ok
    assert not compare(ref.half() + 2e-3, ref, "float16", magnitude=mag).ok  # above: relative
