"""Quantized checkpoints loaded as stored (integrations/transformers/quantized.py) and run by
patched blocks, without a model-dtype copy of the experts.

MXFP4 (gpt-oss): transformers cannot quantize to MXFP4 without its hub kernels, so the checkpoint
is written in gpt-oss's exact layout and names (``*_blocks`` [E, N, K/32, 16], ``*_scales``
[E, N, K/32], gate/up rows alternating, ``quantization_config.quant_method = "mxfp4"``) from a
tiny bf16 model, then loaded twice: by transformers' own MXFP4 dequantizer (the reference: its
weights are exactly the MXFP4 values) and as stored. FineGrainedFP8: a tiny bf16 model quantized
by transformers' own FP8 quantizer (128 x 128 blocks) on the CPU, saved, reloaded as stored.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from transformers import AutoModelForCausalLM, FineGrainedFP8Config, Mxfp4Config  # noqa: E402

from shufflemoe import naive_moe  # noqa: E402
from shufflemoe.integrations.transformers import (Mxfp4Experts, block_layer,  # noqa: E402
                                                  load_as_stored, patch)
from shufflemoe.integrations.transformers.quantized import save_mxfp4_checkpoint  # noqa: E402
from shufflemoe.integrations.transformers.models import build_model, tiny_config  # noqa: E402
from shufflemoe.testing import assert_close, compare, tolerance_for  # noqa: E402

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
GEN = dict(max_new_tokens=12, min_new_tokens=12, do_sample=False, pad_token_id=0)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _ids(seed=1):
    return torch.randint(2, 128, (3, 10), generator=torch.Generator().manual_seed(seed)).to(DEV)


def _mlps(model):
    return [layer.mlp for layer in model.model.layers]


@pytest.fixture(scope="module")
def mxfp4_checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt_oss_mxfp4")
    return path, save_mxfp4_checkpoint(build_model(tiny_config("gpt_oss"), torch.bfloat16, seed=2),
                                       path)


def _load(path, dtype, as_stored):
    if as_stored:
        with load_as_stored():
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    else:  # transformers' own MXFP4 dequantization (to bf16), then the model dtype
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype, quantization_config=Mxfp4Config(dequantize=True))
        model.to(dtype)
    return model.to(DEV).eval()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_mxfp4_checkpoint_matches_transformers_dequantized(mxfp4_checkpoint, dtype):
    """The same MXFP4 values either way: float32 logits within the float32 table and greedy
    tokens identical; bf16 logits within the bf16 table's relative L2."""
    path, _ = mxfp4_checkpoint
    ref, ours = _load(path, dtype, False), _load(path, dtype, True)
    assert all(isinstance(m.experts, Mxfp4Experts) for m in _mlps(ours))
    patch(ours)
    ids = _ids()
    with torch.no_grad():
        want, got = ref(ids).logits, ours(ids).logits
        if dtype == torch.float32:
            assert torch.equal(ours.generate(ids, **GEN), ref.generate(ids, **GEN))
    if dtype == torch.float32:
        assert_close(got, want, torch.float32, "logits")
    else:
        c = compare(got, want, torch.bfloat16)
        assert c.rel_l2 <= tolerance_for(torch.bfloat16).rel_l2, c
    assert block_layer(_mlps(ours)[0]).config.quantization == "mxfp4"


def test_mxfp4_experts_are_held_as_stored(mxfp4_checkpoint):
    """No model-dtype copy of the experts anywhere: the layer wraps the checkpoint's bytes (in
    gate-then-up row order), and state_dict() gives back the checkpoint's tensors bit for bit."""
    path, stored = mxfp4_checkpoint
    model = _load(path, torch.bfloat16, True)
    patch(model)
    with torch.no_grad():
        model(_ids())
    for i, mlp in enumerate(_mlps(model)):
        layer, experts = block_layer(mlp), mlp.experts
        E, D, I = layer.config.num_experts, layer.config.hidden_size, layer.config.intermediate_size
        for name, held in (("w13", experts.gate_up_proj_blocks), ("w2", experts.down_proj_blocks),
                           ("w13_scale", experts.gate_up_proj_scales),
                           ("w13_bias", experts.gate_up_proj_bias)):
            assert getattr(layer, name).data_ptr() == held.data_ptr(), name
        assert layer.w13.dtype == torch.uint8 and layer.w13.shape == (E, 2 * I, D // 2)
        big = [n for n, t in list(model.named_parameters()) + list(model.named_buffers())
               if t.is_floating_point() and t.numel() >= E * I * D]
        assert not [n for n in big if ".experts." in n], big
        prefix = f"model.layers.{i}.mlp.experts."
        state = model.state_dict()
        for name in Mxfp4Experts.TENSORS:
            assert torch.equal(state[prefix + name].cpu(), stored[prefix + name]), name
    # the rows are gate rows then up rows in memory: the up half of row 0 is stored row 1
    assert torch.equal(experts.gate_up_proj_blocks[:, I].cpu(),
                       stored[prefix + "gate_up_proj_blocks"][:, 1])


def test_mxfp4_load_state_dict_converts_the_row_order(mxfp4_checkpoint):
    """load_state_dict of checkpoint tensors (alternating rows) into Mxfp4Experts, and back."""
    _, stored = mxfp4_checkpoint
    cfg = tiny_config("gpt_oss")
    experts = Mxfp4Experts.for_config(cfg)
    prefix = "model.layers.0.mlp.experts."
    experts.load_state_dict({n: stored[prefix + n] for n in Mxfp4Experts.TENSORS})
    I = cfg.intermediate_size
    assert torch.equal(experts.gate_up_proj_bias[:, :I], stored[prefix + "gate_up_proj_bias"][:, 0::2])
    back = experts.state_dict()
    assert all(torch.equal(back[n], stored[prefix + n]) for n in Mxfp4Experts.TENSORS)
    with pytest.raises(RuntimeError, match="run its block patched"):
        experts(torch.zeros(1, cfg.hidden_size))
    with pytest.raises(ValueError, match="multiples of 32"):
        Mxfp4Experts(4, 48, 64)


# ---------------------------------------------------------------- FineGrainedFP8 (128 x 128)

FP8_KEEP = ["model.layers.*.self_attn", "model.layers.*.mlp.gate", "lm_head"]


@pytest.fixture(scope="module")
def fp8_checkpoint(tmp_path_factory):
    """A tiny Qwen3-MoE (D = I = 256: whole 128 x 128 blocks, as transformers' quantizer needs)
    quantized by transformers' FineGrainedFP8 on the CPU and saved; and its bf16 original."""
    bf16_path, fp8_path = tmp_path_factory.mktemp("qwen3_bf16"), tmp_path_factory.mktemp("qwen3_fp8")
    model = build_model(tiny_config("qwen3_moe", hidden_size=256, moe_intermediate_size=256),
                        torch.bfloat16, seed=6)
    model.save_pretrained(bf16_path)
    config = FineGrainedFP8Config(weight_block_size=[128, 128], modules_to_not_convert=FP8_KEEP)
    with load_as_stored():
        quantized = AutoModelForCausalLM.from_pretrained(bf16_path, quantization_config=config,
                                                         dtype=torch.bfloat16)
    quantized.save_pretrained(fp8_path)
    return fp8_path, model.to(DEV)


def test_fp8_checkpoint_runs_as_stored(fp8_checkpoint):
    path, bf16 = fp8_checkpoint
    with load_as_stored():
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(DEV).eval()
    experts = [m.experts for m in _mlps(model)]
    assert all(e.gate_up_proj.dtype == torch.float8_e4m3fn for e in experts)
    seen = {}
    hooks = [m.register_forward_hook(lambda mod, a, out, i=i: seen.__setitem__(i, (a[0], out)))
             for i, m in enumerate(_mlps(model))]
    patch(model)
    ids = _ids(2)
    with torch.no_grad():
        logits = model(ids).logits
    for h in hooks:
        h.remove()
    for i, mlp in enumerate(_mlps(model)):
        layer = block_layer(mlp)
        assert layer.config.quantization == "fp8_block"
        assert layer.w13.data_ptr() == mlp.experts.gate_up_proj.data_ptr()  # no copy
        assert layer.w13_scale.data_ptr() == mlp.experts.gate_up_proj_scale_inv.data_ptr()
        wide = [n for n, t in model.named_parameters() if ".experts." in n
                and t.dtype in (torch.bfloat16, torch.float16, torch.float32)
                and t.numel() >= layer.w2.numel()]
        assert not wide, wide  # no model-dtype copy of the experts
        x, y = seen[i]
        x = x.reshape(-1, x.shape[-1])
        ref, mag = naive_moe(layer, x, layer.route(x), with_magnitude=True)
        assert_close(y.reshape(ref.shape), ref, "fp8_block", f"block {i}", magnitude=mag)
    # against the bf16 model it was quantized from: fp8 weights and activations
    with torch.no_grad():
        c = compare(logits, bf16(ids).logits, "fp8_block")
    assert c.rel_l2 <= tolerance_for("fp8_block").rel_l2, c


def test_fp8_experts_other_than_128_blocks_are_refused(fp8_checkpoint):
    path, _ = fp8_checkpoint
    with load_as_stored():
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    model.model.layers[0].mlp.experts.block_size = (64, 64)
    patch(model)
    with pytest.raises(NotImplementedError, match="block_size=\\(64, 64\\)"), torch.no_grad():
        model(_ids().cpu())
