"""MoE layers in every weight format: built from config (quantized once at load), wrapped from
tensors stored as a checkpoint stores them (no copy), and refused with a clear error when the
tensors do not match the format."""

import pytest
import torch

from factories import gpt_oss_config, make_input, make_layer
from shufflemoe import MoE, MoEConfig, naive_moe
from shufflemoe.ops.quantize.formats import FORMATS
from shufflemoe.planner import expert_bytes
from shufflemoe.testing import assert_close, tolerance_key

QUANTIZED = [q for q in FORMATS if q != "none"]
NAMES = ("router_weight", "router_logits_bias", "w13", "w2", "w13_scale", "w2_scale", "w13_bias",
         "w2_bias")


@pytest.mark.parametrize("quantization", QUANTIZED)
def test_layer_stores_the_format(quantization):
    cfg = gpt_oss_config(quantization=quantization)
    layer = make_layer(cfg)
    fmt = FORMATS[quantization]
    E, D, I = cfg.num_experts, cfg.hidden_size, cfg.intermediate_size
    split = I if quantization == "fp8_block" else None
    assert layer.w13.dtype == fmt.weight_dtype and layer.w13.shape == (E, *fmt.weight_shape(2 * I, D))
    assert layer.w13_scale.shape == (E, *fmt.scale_shape(2 * I, D, split))
    assert layer.w2_scale.shape == (E, *fmt.scale_shape(D, I))
    assert layer.expert_weights.intermediate_size == I
    assert layer.expert_weights.nbytes() == E * expert_bytes(cfg)  # what the planner charges
    x = make_input(cfg, 21)
    ref, mag = naive_moe(layer, x, layer.route(x), with_magnitude=True)
    assert_close(layer(x), ref, tolerance_key(cfg), magnitude=mag)


@pytest.mark.parametrize("quantization", QUANTIZED)
def test_from_weights_wraps_stored_tensors_without_copying(quantization):
    cfg = gpt_oss_config(quantization=quantization)
    src = make_layer(cfg)
    layer = MoE.from_weights(cfg, **{n: getattr(src, n).data for n in NAMES})
    for n in NAMES:
        assert getattr(layer, n).data_ptr() == getattr(src, n).data_ptr(), n
    x = make_input(cfg, 20)
    assert torch.equal(layer(x), src(x))


@pytest.mark.parametrize("quantization", QUANTIZED)
def test_from_weights_quantizes_model_dtype_weights(quantization):
    cfg = gpt_oss_config(quantization=quantization)
    plain = make_layer(cfg.replace(quantization="none"))
    layer = MoE.from_weights(cfg, **{n: getattr(plain, n).data for n in NAMES
                                     if getattr(plain, n) is not None})
    assert layer.w13.dtype == FORMATS[quantization].weight_dtype
    ref = make_layer(cfg)  # the same seed: the same weights, quantized by the constructor
    for n in ("w13", "w2", "w13_scale", "w2_scale"):
        assert torch.equal(_bits(getattr(layer, n)), _bits(getattr(ref, n))), n


def _bits(t):
    return t.view(torch.uint8) if t.element_size() == 1 else t


def test_from_weights_refuses_mismatched_tensors():
    cfg = gpt_oss_config(quantization="mxfp4")
    src = make_layer(cfg)
    given = {n: getattr(src, n).data for n in NAMES}
    with pytest.raises(ValueError, match="w13_scale must have shape"):
        MoE.from_weights(cfg, **{**given, "w13_scale": src.w13_scale.data[:, :, :1]})
    with pytest.raises(TypeError, match="w2_scale must have dtype"):
        MoE.from_weights(cfg, **{**given, "w2_scale": src.w2_scale.data.float()})
    with pytest.raises(ValueError, match="w13_bias is required"):
        MoE.from_weights(cfg, **{**given, "w13_bias": None})
    with pytest.raises(ValueError, match="quantized weights need"):
        MoE.from_weights(cfg.replace(quantization="none"), **{**given, "w13_scale": None,
                                                                "w2_scale": None})
    with pytest.raises(ValueError, match="w13_scale is only used"):
        MoE.from_weights(cfg.replace(quantization="fp8_block"), **{
            **given, "w13": torch.randn(8, 64, 64, dtype=torch.bfloat16),
            "w2": torch.randn(8, 64, 32, dtype=torch.bfloat16)})


@pytest.mark.parametrize("fields,match", [
    (dict(hidden_size=48, quantization="mxfp4"), "multiple of 32"),
    (dict(activation="gelu"), "activation must be one of"),
    (dict(swiglu_limit=0.0), "swiglu_limit must be"),
    (dict(quantization="int4"), "quantization must be one of"),
])
def test_config_refuses(fields, match):
    with pytest.raises(ValueError, match=match):
        MoEConfig(**{**dict(hidden_size=64, intermediate_size=32, num_experts=4), **fields})


def test_plan_command_knows_the_format(capsys):
    """``shufflemoe plan --quantization``: an mxfp4 gpt-oss-120b expert is 13.2 MB (0.53 bytes a
    weight with its e8m0 scales, plus bf16 biases), a bf16 one 49.8 MB."""
    from shufflemoe.cli import main

    assert main(["plan", "--model", "gpt-oss-120b", "--quantization", "mxfp4", "--tokens", "8"]) == 0
    assert "experts mxfp4 (13.2 MB each)" in capsys.readouterr().out
    assert main(["plan", "--model", "gpt-oss-120b", "--tokens", "8"]) == 0
    assert "experts none (49.8 MB each)" in capsys.readouterr().out
