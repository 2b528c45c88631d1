"""shufflemoe inside HF transformers: tiny random models per model_type, patched vs unpatched.

float32: logits within the float32 table and 16 greedy tokens identical (float32 is the dtype for
token identity: its errors, ~1e-7 relative, do not move an argmax). bfloat16: one bf16 rounding
of a routing weight or an MoE output is enough to move a later layer's router input across a near
tie, after which that token legitimately runs other experts (measured: ~1 run in 8 of these tiny
models has one such token). So the bf16 checks are (1) every MoE block on the unpatched run's
exact inputs, within the bf16 table, and (2) the logits of every sequence in which transformers'
own router picks the same experts on the patched run's inputs as on the unpatched run's, within
the bf16 table; at least half the sequences must qualify.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from shufflemoe.integrations.transformers import (  # noqa: E402
    block_layer, patch, patch_model_type, register_experts_implementation, spec_for,
    spec_for_config, unpatch, unpatch_model_type)
from shufflemoe.integrations.transformers.models import build_model, tiny_config  # noqa: E402
from shufflemoe.testing import assert_close, compare, tolerance_for  # noqa: E402

B, S = 4, 12  # prompt batch and length
DEV = "cuda" if torch.cuda.is_available() else "cpu"  # where the kernels run (the CPU: interpreted)
CASES = [  # (model_type, config overrides): every router option each model has
    ("llama4_text", {}),
    ("llama4_text", dict(num_experts_per_tok=2)),
    ("qwen3_moe", dict(norm_topk_prob=True)),
    ("qwen3_moe", dict(norm_topk_prob=False)),
    ("qwen2_moe", dict(norm_topk_prob=False)),
    ("qwen2_moe", dict(norm_topk_prob=True)),
    ("mixtral", {}),
    ("olmoe", dict(norm_topk_prob=False)),
    ("olmoe", dict(norm_topk_prob=True)),
    ("deepseek_v3", dict(norm_topk_prob=True)),
    ("deepseek_v3", dict(norm_topk_prob=False, n_group=2, topk_group=1, routed_scaling_factor=1.0)),
    ("deepseek_v32", {}),
    ("qwen3_next", {}),
    ("glm4_moe", {}),
    ("glm4_moe", dict(n_group=2, topk_group=1, norm_topk_prob=False)),
    ("glm4_moe_lite", {}),
    ("dots1", {}),
    ("gpt_oss", {}),
    ("gpt_oss", dict(num_experts_per_tok=4)),
    ("qwen3_5_moe_text", {}),
    ("qwen3_vl_moe", {}),
    ("qwen3_omni_moe_thinker", dict(norm_topk_prob=False)),
    ("minimax", {}),
    ("flex_olmo", dict(norm_topk_prob=True)),
    ("granitemoe", {}),
    ("granitemoeshared", {}),
    ("granitemoehybrid", {}),
    ("solar_open", {}),
    ("glm_moe_dsa", {}),
    ("glm4v_moe", {}),
    ("exaone_moe", {}),
    ("kimi_linear", {}),
    ("hy_v4", {}),
    ("mimo_v2_flash", {}),
    ("deepseek_v2", {}),
    ("deepseek_v2", dict(topk_method="group_limited_greedy", n_group=4, topk_group=1)),
    ("minimax_m2", {}),
    ("hy_v3", {}),
    ("laguna", {}),
    ("afmoe", {}),
    ("ernie4_5_moe", {}),
    ("hunyuan_v1_moe", {}),
    ("lfm2_moe", {}),
    ("lfm2_moe", dict(norm_topk_prob=False, routed_scaling_factor=2.5)),
    ("cohere2_moe", {}),
    ("cohere2_moe", dict(expert_selection_fn="sigmoid", norm_topk_prob=False,
                         num_shared_experts=1, shared_expert_combination_strategy="sum")),
    ("cohere2_moe", dict(expert_selection_fn="sigmoid", norm_topk_prob=True)),
]
IDS = [f"{t}-" + ("-".join(f"{k}={v}" for k, v in o.items()) or "default") for t, o in CASES]
MODEL_TYPES = list(dict.fromkeys(t for t, _ in CASES))
# experts_implementation="shufflemoe" runs their experts (Llama 4's take none; gpt-oss's biased
# ones are refused; HY-V4's clamp gate and up, as its swiglu_limit of 0.05 makes count)
DECORATED = [t for t in MODEL_TYPES if t not in ("llama4_text", "gpt_oss")]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """These models are tiny: with two OpenMP threads every op pays a barrier (measured on the
    2-core CI machine under load: 1000 [4, 64] x [64, 64] linears take 2.3 s with 2 threads,
    4 ms with 1), which made this file 116 s instead of 18 s."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _prompt(seed: int = 1) -> torch.Tensor:
    return torch.randint(2, 128, (B, S), generator=torch.Generator().manual_seed(seed))


def _blocks(model) -> dict[str, torch.nn.Module]:
    base = spec_for_config(model.config)
    return {n: m for n, m in model.named_modules() if type(m).__name__.endswith(base.block)}


def _logits(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


def _run_recording(model, ids):
    """logits, and each MoE block's (input, output) on this run."""
    seen = {}

    def hook(name):
        def record(module, args, out):
            seen[name] = (args[0].detach().clone(), (out[0] if isinstance(out, tuple) else out).clone())
        return record

    handles = [m.register_forward_hook(hook(n)) for n, m in _blocks(model).items()]
    try:
        return _logits(model, ids), seen
    finally:
        for h in handles:
            h.remove()


def _route(model, block, x) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits [T, E] float32, chosen [T, E] bool): transformers' own router of ``block`` on x
    [.., D]. Routers return their logits, weights and ids in differing orders (Granite: ids
    first), so they are told apart by dtype and width."""
    spec = spec_for_config(model.config)
    E = block_layer(block).config.num_experts
    flat = x.reshape(-1, x.shape[-1])
    with torch.no_grad():
        out = getattr(block, spec.router_module)(flat[None] if spec.router_3d else flat,
                                                 *(getattr(block, p) for p in spec.router_args))
    if spec.returns == "out_and_logits":  # Llama 4: (scores, logits), unchosen: sigmoid(-inf)
        return out[1].float(), out[0] > 0
    ids = next(o for o in out if not o.is_floating_point())
    logits = next(o for o in out if o.is_floating_point() and o.shape[-1] == E)
    chosen = torch.zeros(ids.shape[0], E, dtype=torch.bool, device=ids.device).scatter_(
        1, ids.long(), True)
    return logits.float(), chosen


def _chosen(model, block, x) -> torch.Tensor:
    """[T, E] bool: the experts transformers' own router of ``block`` picks for x [.., D]."""
    return _route(model, block, x)[1]


def _tied(model, block, x) -> torch.Tensor:
    """[T] bool: tokens whose k-th and (k+1)-th router logits are equal (topk's pick is arbitrary)."""
    logits = _route(model, block, x)[0]
    k = block_layer(block).config.top_k
    top = logits.topk(min(k + 1, logits.shape[-1])).values
    return top[:, k - 1] == top[:, -1] if k < logits.shape[-1] else torch.zeros(len(top), dtype=torch.bool)


@pytest.mark.parametrize("model_type,overrides", CASES, ids=IDS)
def test_float32_logits_and_greedy_tokens(model_type, overrides):
    model = build_model(tiny_config(model_type, **overrides), torch.float32)
    ids = _prompt()
    ref = _logits(model, ids)
    gen = dict(max_new_tokens=16, min_new_tokens=16, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        ref_tokens = model.generate(ids, **gen)
    patch(model)
    blocks = _blocks(model)
    assert blocks and all(isinstance(b, type(b)._shufflemoe_base) for b in blocks.values())
    assert_close(_logits(model, ids), ref, torch.float32, "logits")
    with torch.no_grad():
        tokens = model.generate(ids, **gen)
    assert tokens.shape == (B, S + 16)
    assert torch.equal(tokens, ref_tokens), "greedy tokens differ"


@pytest.mark.parametrize("model_type,overrides", CASES, ids=IDS)
def test_bfloat16_blocks_and_logits(model_type, overrides):
    model = build_model(tiny_config(model_type, **overrides), torch.bfloat16)
    ids = _prompt()
    ref, hf = _run_recording(model, ids)
    patch(model)
    out, ours = _run_recording(model, ids)
    assert hf.keys() == ours.keys() and hf
    moved = torch.zeros(B, dtype=torch.bool)
    for name, (x, y_ref) in hf.items():
        block = model.get_submodule(name)
        with torch.no_grad():
            y = block(x)
        y = (y[0] if isinstance(y, tuple) else y).reshape(y_ref.shape)
        tied = _tied(model, block, x)  # exact ties: HF's topk order is not ours (nor CUDA's)
        assert tied.float().mean() < 0.1, f"{name}: {int(tied.sum())} tokens tie exactly"
        keep = ~tied.view(y_ref.shape[:-1]) if y_ref.dim() == 3 else ~tied
        assert_close(y[keep], y_ref[keep], torch.bfloat16, f"{name} on the unpatched run's input")
        moved |= (_chosen(model, block, x) != _chosen(model, block, ours[name][0])).any(-1).view(B, S).any(-1)
    assert moved.sum() <= B // 2, f"transformers' router moved {int(moved.sum())} of {B} sequences"
    # Whole-model logits: each block above is checked elementwise; through the layers after it
    # (attention, norms, the next blocks) one rounding difference in bf16 grows, by 0.11 rms on
    # 17 of the logits on an H100 (kernels round once per scatter-add, transformers rounds the
    # routing weights), so here the bound is the relative L2 of the bf16 row.
    c = compare(out[~moved], ref[~moved], torch.bfloat16)
    assert c.rel_l2 <= tolerance_for(torch.bfloat16).rel_l2, f"logits: relative L2 {c.rel_l2:.3g}"


def _first_block_on_the_kernels(model) -> torch.nn.Module:
    """Patches ``model`` (bf16, on DEV) and checks its first MoE block at decode sizes (T = 1, 2,
    5) on the kernels (the interpreter on the CPU) against transformers' block on the same
    input, tokens whose top-k ties exactly left out; returns the patched block."""
    from shufflemoe.ops import use_impl

    name, block = next(iter(_blocks(model).items()))
    D = model.config.get_text_config(decoder=True).hidden_size
    g = torch.Generator().manual_seed(5)
    xs = [torch.randn(1, T, D, generator=g).to(DEV, torch.bfloat16) for T in (1, 2, 5)]
    with torch.no_grad():
        refs = [block(x) for x in xs]
    patch(model, graph_buckets=None)
    block = model.get_submodule(name)
    with use_impl("triton"), torch.no_grad():
        for x, ref in zip(xs, refs):
            y, ref = ((t[0] if isinstance(t, tuple) else t) for t in (block(x), ref))
            y, ref = y.reshape(-1, D), ref.reshape(-1, D)
            keep = ~_tied(model, block, x)
            assert_close(y[keep], ref[keep], torch.bfloat16, f"T={x.shape[1]}")
    return block


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_blocks_at_decode_sizes_on_the_kernels(model_type):
    """Every mapped block at decode sizes on the kernels: the fused decode path and its routing
    kernel, with each model's router options, against transformers' block (bf16)."""
    _first_block_on_the_kernels(build_model(tiny_config(model_type), torch.bfloat16, DEV))


def test_deepseek_v2_group_limited_greedy():
    """DeepSeek-V2's topk_method="group_limited_greedy" (groups scored by their best expert):
    the patched block picks transformers' experts for 64 tokens, of which a plain top-k would
    move some (one group of two experts kept, top-2), and runs at decode sizes on the kernels."""
    model = build_model(tiny_config("deepseek_v2", topk_method="group_limited_greedy", n_group=4,
                                    topk_group=1), torch.float32, seed=1)
    block = next(iter(_blocks(model).values()))
    x = torch.randn(64, model.config.hidden_size, generator=torch.Generator().manual_seed(2))
    patch(model)
    logits, want = _route(model, block, x)  # transformers' router, still the block's
    r = block_layer(block).route(x)
    got = torch.zeros_like(want).index_put_((r.token_ids.long(), r.expert_ids.long()),
                                            torch.tensor(True))
    assert torch.equal(got, want)
    plain = torch.zeros_like(want).scatter_(1, logits.topk(2, 1).indices, True)
    assert (plain != want).any(1).sum() >= 4  # the groups decide for these tokens
    _first_block_on_the_kernels(build_model(
        tiny_config("deepseek_v2", topk_method="group_limited_greedy", n_group=4, topk_group=1),
        torch.bfloat16, DEV))


@pytest.mark.parametrize("model_type,shared", [("qwen2_moe", None), ("qwen3_next", None),
                                               ("qwen3_next", 40)])
def test_gated_shared_expert_at_decode_sizes(model_type, shared):
    """A gated shared expert (Qwen2-MoE, Qwen3-Next) at decode sizes on the kernels (the
    interpreter on the CPU): in its own fused launches beside the routed experts' (one launch
    plan), or, as wide as they are (shared = 40), in their two launches at T <= 2, against
    transformers' block on the same input, bf16 (tokens whose top-k ties exactly left out)."""
    from shufflemoe.ops.moe_decode import configs

    overrides = {} if shared is None else dict(shared_expert_intermediate_size=shared)
    model = build_model(tiny_config(model_type, **overrides), torch.bfloat16, DEV)
    block = _first_block_on_the_kernels(model)
    merged = {T for kind, T, *_ in block_layer(block)._hot().plans if kind == "merged"}
    fused = {T for kind, T, *_ in block_layer(block)._hot().plans if kind == "shared+routed"}
    want = ({T for T in (1, 2) if T <= configs.Switch().shared_max_tokens}
            if shared == model.config.moe_intermediate_size else set())
    assert merged == want and fused == {1, 2, 5} - want


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_checkpoint_round_trip(model_type, tmp_path):
    """Save unpatched, load into a patched model (class patched before building), same outputs
    and state_dict; save patched (its weights are views now), load unpatched, same outputs."""
    hf = build_model(tiny_config(model_type), torch.float32, seed=3)
    ids = _prompt(2)
    ref = _logits(hf, ids)
    hf.save_pretrained(tmp_path / "hf")
    patch_model_type(model_type)  # a vision-language model's type: its text model's blocks
    try:
        ours = type(hf).from_pretrained(tmp_path / "hf").eval()
    finally:
        unpatch_model_type(model_type)
    assert _blocks(ours) and all(hasattr(b, "_shufflemoe_base") for b in _blocks(ours).values())
    assert_close(_logits(ours, ids), ref, torch.float32, "logits after from_pretrained")
    mine, theirs = ours.state_dict(), hf.state_dict()
    assert list(mine) == list(theirs)
    assert all(mine[k].shape == theirs[k].shape and mine[k].dtype == theirs[k].dtype for k in mine)
    ours.save_pretrained(tmp_path / "ours")
    back = type(hf).from_pretrained(tmp_path / "ours").eval()
    assert not _blocks(back) or not hasattr(next(iter(_blocks(back).values())), "_shufflemoe_base")
    assert_close(_logits(back, ids), ref, torch.float32, "logits of the re-saved checkpoint")


@pytest.mark.parametrize("model_type", ["llama4_text", "qwen2_moe", "deepseek_v3"])
def test_load_state_dict_and_to_rebuild_the_layer(model_type):
    """In-place loads and dtype moves reach the shufflemoe layer; no weight is held twice."""
    cfg = tiny_config(model_type)
    model, other = build_model(cfg, torch.float32, seed=4), build_model(cfg, torch.float32, seed=5)
    ids = _prompt(3)
    patch(model)
    _logits(model, ids)  # builds the layers (Llama 4 experts converted, shared gate/up fused)
    hf_storage = {p.untyped_storage().data_ptr() for p in model.parameters()}
    for block in _blocks(model).values():
        layer = block_layer(block)
        for name in ("w13", "w2", "router_weight", "shared_w13", "shared_w2", "shared_gate"):
            t = getattr(layer, name)
            assert t is None or t.untyped_storage().data_ptr() in hf_storage, f"{name} is a copy"
    model.load_state_dict(other.state_dict())
    assert_close(_logits(model, ids), _logits(other, ids), torch.float32, "after load_state_dict")
    model.to(torch.bfloat16)
    other.to(torch.bfloat16)
    assert all(block_layer(b).config.dtype == torch.bfloat16 for b in _blocks(model).values())
    assert _logits(model, ids).dtype == torch.bfloat16


@pytest.mark.parametrize("model_type", ["llama4_text", "qwen3_moe", "gpt_oss", "minimax_m2",
                                        "hy_v3", "afmoe"])
def test_router_logits_are_recorded(model_type):
    """While transformers records router logits the patched block calls the HF router (with
    the block's bias: MiniMax-M2, HY-V3, AFMoE; AFMoE's on [1, T, D]) for them alone."""
    model = build_model(tiny_config(model_type), torch.float32)
    ids = _prompt()
    with torch.no_grad():  # the base model: Llama4ForCausalLM does not pass them on
        ref = model.model(ids, output_router_logits=True)["router_logits"]
        patch(model)
        out = model.model(ids, output_router_logits=True)["router_logits"]
        plain = model.model(ids)
    assert len(out) == len(ref) > 0
    for o, r in zip(out, ref):
        assert_close(o, r, torch.float32, "router logits")
    assert plain.get("router_logits") is None


@pytest.mark.parametrize("model_type", DECORATED)
def test_experts_implementation_registry(model_type, tmp_path):
    """transformers routes, shufflemoe runs the experts: set on a built model, or asked for in
    from_pretrained."""
    register_experts_implementation()
    model = build_model(tiny_config(model_type), torch.float32)
    ids = _prompt()
    ref = _logits(model, ids)
    model.save_pretrained(tmp_path)
    model.set_experts_implementation("shufflemoe")
    assert model.config._experts_implementation == "shufflemoe"
    assert_close(_logits(model, ids), ref, torch.float32, "logits (set_experts_implementation)")
    loaded = type(model).from_pretrained(tmp_path, experts_implementation="shufflemoe")
    assert loaded.config._experts_implementation == "shufflemoe"
    assert_close(_logits(loaded.eval(), ids), ref, torch.float32, "logits (from_pretrained)")


@pytest.mark.parametrize("model_type", ["qwen3_moe", "mixtral"])
def test_experts_implementation_replays_a_launch_plan(model_type, monkeypatch):
    """Launched from Python the experts replay a launch plan from a T's first call on: the same
    bits as running them (the interpreter on the CPU, the compiled kernels on a GPU), each module
    its own weights; routing tensors with other strides run unplanned, with the same result."""
    from shufflemoe import layer as moe_layer
    from shufflemoe.integrations.transformers.experts import shufflemoe_experts_forward
    from shufflemoe.ops import _launch, use_impl

    cfg = tiny_config(model_type)
    model = build_model(cfg, torch.bfloat16, DEV)
    modules = [m for m in model.modules() if type(m).__name__.endswith("Experts")][:2]
    E = getattr(cfg, "num_experts", None) or cfg.num_local_experts
    k, D = cfg.num_experts_per_tok, cfg.hidden_size
    g = torch.Generator().manual_seed(3)

    def inputs(T):
        ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)])
        w = torch.rand(T, k, generator=g).softmax(-1).to(torch.bfloat16)
        x = torch.randn(T, D, generator=g).to(torch.bfloat16)
        return x.to(DEV), ids.to(DEV), w.to(DEV)

    cases = [(m, inputs(T)) for T in (1, 5) for m in modules]
    with use_impl("triton"), torch.no_grad():
        monkeypatch.setattr(moe_layer, "PLAN_MAX_TOKENS", 0)
        monkeypatch.setattr(moe_layer, "PLAN_MAX_LARGE", 0)
        want = [shufflemoe_experts_forward(m, *args) for m, args in cases]
        for m in modules:
            m.__dict__.pop("_shufflemoe_experts")
        monkeypatch.undo()
        for _ in range(2):  # the first pass records (or binds), the second replays
            for (m, args), ref in zip(cases, want):
                assert torch.equal(shufflemoe_experts_forward(m, *args), ref)
        for m in modules:
            plans = m.__dict__["_shufflemoe_experts"].plans
            assert sorted(key[1] for key, p in plans.items() if isinstance(p, _launch.Plan)) == [1, 5]
        x, ids, w = cases[-1][1]
        strided = torch.empty(k, ids.shape[0], dtype=ids.dtype, device=DEV).t().copy_(ids)
        assert not strided.is_contiguous()
        assert torch.equal(shufflemoe_experts_forward(cases[-1][0], x, strided, w), want[-1])
    assert not torch.equal(want[0], want[1])  # the modules differ: each replays its own weights


def test_unpatch_restores_the_hf_forward():
    model = build_model(tiny_config("llama4_text"), torch.float32)
    ids = _prompt()
    ref = _logits(model, ids)
    unpatch(patch(model))
    assert all(type(b).__name__ == "Llama4TextMoe" for b in _blocks(model).values())
    assert_close(_logits(model, ids), ref, torch.float32, "logits (HF forward on converted weights)")


def test_every_mapping_has_a_tiny_model_under_test():
    """Every entry of SPECS is reached by a tiny model the tests above run (the multimodal
    llama4 shares llama4_text's), and every tiny model is one of CASES (so the demo's table is
    tested too)."""
    from shufflemoe.integrations.transformers import SPECS
    from shufflemoe.integrations.transformers.models import TINY

    assert set(TINY) == set(MODEL_TYPES)
    reached = {spec_for_config(tiny_config(t)) for t in TINY}
    assert [k for k, spec in SPECS.items() if spec not in reached] == []


def test_unknown_model_type_raises():
    model = build_model(tiny_config("mixtral"), torch.float32)
    model.config.model_type = "llama"
    with pytest.raises(ValueError, match="no transformers mapping for model_type 'llama'.*supported"):
        patch(model)
    with pytest.raises(ValueError, match="no transformers mapping for model_type 'not_a_model'"):
        patch_model_type("not_a_model")


def test_gpt_oss_weights_and_outputs():
    """gpt-oss: the down projection and biases are the HF tensors (down_proj a transposed view);
    gate/up alternate in HF, so w13 is the one converted copy; the block returns the router
    scores only while router logits are recorded (its decoder layer drops them)."""
    model = build_model(tiny_config("gpt_oss"), torch.float32)
    ids = _prompt()
    patch(model)
    _logits(model, ids)
    block = model.model.layers[0].mlp
    layer = block_layer(block)
    cfg = layer.config
    assert (cfg.activation, cfg.swiglu_alpha, cfg.swiglu_limit) == ("swiglu_oai", 1.702, 7.0)
    assert cfg.expert_bias and cfg.router_logits_bias and cfg.renormalize
    storage = lambda t: t.untyped_storage().data_ptr()  # noqa: E731
    assert storage(layer.w2) == storage(block.experts.down_proj)
    assert storage(layer.w2_bias) == storage(block.experts.down_proj_bias)
    assert storage(layer.router_logits_bias) == storage(block.router.bias)
    assert storage(layer.w13) != storage(block.experts.gate_up_proj)
    E, D, I = cfg.num_experts, cfg.hidden_size, cfg.intermediate_size
    hf = block.experts.gate_up_proj.detach()  # [E, D, 2I], columns gate0, up0, gate1, ...
    assert torch.equal(layer.w13[:, :I], hf[:, :, 0::2].transpose(1, 2))
    assert torch.equal(layer.w13[:, I:], hf[:, :, 1::2].transpose(1, 2))
    x = torch.randn(1, 5, D)
    with torch.no_grad():
        out, scores = block(x)
    assert out.shape == x.shape and scores is None


def test_gpt_oss_experts_implementation_is_refused_with_the_reason():
    """transformers routes and shufflemoe runs the experts: not for gpt-oss's biased experts
    (patch() runs its whole block instead)."""
    register_experts_implementation()
    model = build_model(tiny_config("gpt_oss"), torch.float32)
    model.set_experts_implementation("shufflemoe")
    with pytest.raises(NotImplementedError, match="expert biases"):
        _logits(model, _prompt())


def _experts_of(model) -> torch.nn.Module:
    return next(m for m in model.modules() if hasattr(m, "_apply_gate"))


def test_experts_implementation_finds_the_modules_own_glu():
    """transformers' experts backends apply module._apply_gate: shufflemoe runs it as the GLU
    it equals on a probe past every limit (module_glu), whatever the config calls its
    activation."""
    from shufflemoe.integrations.transformers.experts import module_glu

    cases = [("qwen3_moe", ("silu", None)), ("hy_v4", ("silu", 0.05)),
             ("gpt_oss", ("swiglu_oai", 7.0))]  # gpt-oss's is found, its biases refused
    for model_type, (act, limit) in cases:
        found = module_glu(_experts_of(build_model(tiny_config(model_type), torch.float32)))
        assert found is not None and (found[0], found[2]) == (act, limit), (model_type, found)
    assert module_glu(_experts_of(build_model(tiny_config("gpt_oss"), torch.float32)))[1] == 1.702


@pytest.mark.parametrize("model_type,act", [("qwen3_moe", "GELUActivation"),
                                            ("gemma4_text", "GELUTanh")])
def test_experts_implementation_refuses_a_glu_it_does_not_run(model_type, act):
    """A GELU GLU (a Qwen3 config with hidden_act="gelu"; Gemma 4, whose config names it
    hidden_activation) is refused, naming it: it ran as SwiGLU before (Gemma 4: 9e-2 off)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from shufflemoe.integrations.transformers.models import _COMMON

    register_experts_implementation()
    if model_type == "gemma4_text":
        cfg = AutoConfig.for_model("gemma4_text", **_COMMON, intermediate_size=96,
                                   moe_intermediate_size=32, num_experts=8, top_k_experts=2,
                                   enable_moe_block=True, global_head_dim=16,
                                   hidden_size_per_layer_input=0, vocab_size_per_layer_input=128,
                                   layer_types=["sliding_attention", "full_attention"])
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg).eval()
    else:
        model = build_model(tiny_config(model_type, hidden_act="gelu"), torch.float32)
    model.set_experts_implementation("shufflemoe")
    with pytest.raises(NotImplementedError, match=f"gate function .*{act}.* none of shufflemoe"):
        _logits(model, _prompt())


def test_a_failed_patch_leaves_every_block_as_it_was():
    """A block that cannot be built (a tensor its spec names is gone) makes patch() raise and
    undo what it did: HF blocks stay HF blocks, patched ones keep their state."""
    model = build_model(tiny_config("qwen2_moe"), torch.float32)
    ids = _prompt()
    ref = _logits(model, ids)
    second = model.model.layers[1].mlp
    gate = second.shared_expert_gate
    del second.shared_expert_gate
    with pytest.raises(AttributeError, match="shared_expert_gate"):
        patch(model)
    assert not any(hasattr(b, "_shufflemoe_base") or "_shufflemoe" in b.__dict__
                   for b in _blocks(model).values())
    second.shared_expert_gate = gate
    assert torch.equal(_logits(model, ids), ref)
    patch(model)
    before = {n: (type(b), b.__dict__["_shufflemoe"]) for n, b in _blocks(model).items()}
    del second.shared_expert_gate
    with pytest.raises(AttributeError, match="shared_expert_gate"):
        patch(model, experts="blockwise")
    second.shared_expert_gate = gate
    assert {n: (type(b), b.__dict__["_shufflemoe"]) for n, b in _blocks(model).items()} == before
    assert_close(_logits(model, ids), ref, torch.float32, "logits after the failed re-patch")


def test_multimodal_and_unsupported_model_types():
    """A multimodal model is patched by its text model's entry; a model type that shufflemoe
    cannot run says why."""
    from transformers import AutoConfig

    assert spec_for_config(tiny_config("qwen3_vl_moe")) is spec_for("qwen3_vl_moe_text")
    llava = AutoConfig.for_model("llava", text_config=dict(model_type="llama"))
    with pytest.raises(ValueError, match="model_type 'llama'.*the text model of a 'llava' model"):
        spec_for_config(llava)
    for call in (patch_model_type, spec_for):
        with pytest.raises(ValueError, match="cannot patch model_type 'mistral4': its router "
                                             "takes the softmax of the logits in the model dtype"):
            call("mistral4")


def test_unsupported_options_raise_before_patching():
    model = build_model(tiny_config("qwen3_moe", hidden_act="gelu"), torch.float32)
    with pytest.raises(ValueError, match="hidden_act='gelu'"):
        patch(model)
    assert not any(hasattr(b, "_shufflemoe_base") for b in _blocks(model).values())
    with pytest.raises(ValueError, match="unknown experts strategy 'nope'"):
        patch(build_model(tiny_config("mixtral"), torch.float32), experts="nope")
    bad = build_model(tiny_config("deepseek_v3"), torch.float32)
    bad.config.n_group = 3  # does not divide 8 experts
    with pytest.raises(ValueError, match="DeepseekV3MoE.*n_group"):
        patch(bad)
    bad = build_model(tiny_config("cohere2_moe", num_shared_experts=1), torch.float32)
    with pytest.raises(ValueError, match="shared_expert_combination_strategy='average'"):
        patch(bad)
    bad = build_model(tiny_config("deepseek_v2"), torch.float32)
    bad.config.topk_method = "noaux_tc"
    with pytest.raises(ValueError, match="topk_method='noaux_tc'"):
        patch(bad)


def test_llama4_multimodal_model_patches_its_text_blocks():
    from transformers import AutoConfig, Llama4ForConditionalGeneration

    vision = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                  image_size=28, patch_size=14, vision_output_dim=32, projector_input_dim=32,
                  projector_output_dim=32)
    cfg = AutoConfig.for_model("llama4", text_config=tiny_config("llama4_text").to_dict(),
                               vision_config=vision)
    torch.manual_seed(0)
    model = Llama4ForConditionalGeneration(cfg).eval()
    ids = _prompt()
    with torch.no_grad():
        ref = model(input_ids=ids).logits
        patch(model)
        out = model(input_ids=ids).logits
    assert len(_blocks(model)) == 2
    assert all(hasattr(b, "_shufflemoe_base") for b in _blocks(model).values())
    assert_close(out, ref, torch.float32, "logits")


@pytest.mark.parametrize("experts", ["blockwise", "concat", "all_experts", "selective", "padded", "sliced"])
def test_other_expert_strategies(experts):
    """patch(model, experts=...) runs any strategy; shuffled is covered by every test above."""
    model = build_model(tiny_config("qwen2_moe"), torch.float32)
    ids = _prompt()
    ref = _logits(model, ids)
    patch(model, experts=experts)
    assert_close(_logits(model, ids), ref, torch.float32, f"logits with experts={experts}")
    assert all(block_layer(b).experts.name == experts for b in _blocks(model).values())


# transformers 5.17 never compiles Llama 4 in generate (get_compiled_call returns the eager call
# for "llama4" model types) and its static cache fails there even unpatched
# (create_chunked_causal_mask gets an unexpected block_sequence_ids): its compiled forward is
# checked in test_patched_llama4_compiles instead. MiniMax's lightning attention keeps its own
# cache: its model class sets _can_compile_fullgraph = False, and generate does not compile it.
COMPILED_GENERATE = [t for t in MODEL_TYPES if t not in ("llama4_text", "minimax")]


def _cpu_compile_config():
    """transformers' CompileConfig for its auto-compiled generate, allowed on the CPU, with no
    graph break allowed. aot_eager: dynamo + AOT autograd with our ops' fakes, seconds per
    model; inductor (the default) adds ~25-45 s of C++ compilation per model on two cores, so
    tests/test_compile.py runs it on the layer and the GPU test on whole models."""
    from transformers import CompileConfig

    config = CompileConfig(fullgraph=True, backend="aot_eager", mode=None)
    config._compile_all_devices = True
    return config


@pytest.mark.parametrize("model_type", COMPILED_GENERATE)
def test_compiled_generate_matches_unpatched(model_type):
    """model.generate(cache_implementation="static") compiles the decode step (fullgraph: a
    graph break would raise) and gives the unpatched model's greedy tokens."""
    model = build_model(tiny_config(model_type), torch.float32)
    ids = _prompt()[:2, :6]
    gen = dict(max_new_tokens=3, min_new_tokens=3, do_sample=False, pad_token_id=0,
               cache_implementation="static")
    with torch.no_grad():
        ref = model.generate(ids, **gen)
        patch(model)
        torch._dynamo.reset()
        tokens = model.generate(ids, compile_config=_cpu_compile_config(), **gen)
    assert getattr(model, "_compiled_call", None) is not None, "generate did not compile"
    assert torch.equal(tokens, ref)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_patched_model_has_no_graph_breaks(model_type):
    """torch._dynamo.explain over a whole patched bfloat16 model: one graph, no break (float32
    is compiled with fullgraph=True in test_compiled_generate_matches_unpatched)."""
    model = patch(build_model(tiny_config(model_type), torch.bfloat16))
    torch._dynamo.reset()
    with torch.no_grad():
        explained = torch._dynamo.explain(model)(_prompt()[:2, :5])
    reasons = [str(b.reason).splitlines()[0] for b in explained.break_reasons]
    assert explained.graph_break_count == 0 and explained.graph_count == 1, reasons


def test_patched_llama4_compiles():
    model = build_model(tiny_config("llama4_text"), torch.float32)
    ids = _prompt()[:2, :7]
    ref = _logits(model, ids)
    patch(model)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        assert_close(compiled(ids).logits, ref, torch.float32, "compiled logits")


@pytest.mark.parametrize("model_type", ["qwen3_moe", "llama4_text"])
def test_compiled_patched_blocks_are_tag_safe(model_type):
    """Compiled, a patched block reads its layer from its own __dict__ (a module holding tensors
    and numbers; the config and strategies come from the module global _PATHS): with Dynamo's
    recursive dict tags on (torch 2.11's default) every block after the first is a tag-safe
    subtree, whose guards are skipped while its dicts are unchanged, as transformers' own
    blocks are. Through the block's state object (not a module) they were checked every call."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    model = patch(build_model(tiny_config(model_type), torch.float32))
    ids = _prompt()[:1, :4]
    torch._dynamo.reset()
    with torch.no_grad(), torch._dynamo.config.patch(use_recursive_dict_tags_for_guards=True):
        want = model(ids).logits
        compiled = torch.compile(model, fullgraph=True, backend="eager")
        for _ in range(2):
            assert torch.equal(compiled(ids).logits, want)
    guards = _debug_get_cache_entry_list(model.forward.__code__)[0].guard_manager
    stack, safe = [guards.root], {}
    while stack:
        m = stack.pop()
        safe[m.get_source()] = m.is_tag_safe()
        stack.extend(m.get_child_managers())
        if hasattr(m, "get_key_value_managers"):  # a dict's: its keys' and values' managers
            stack.extend(k for kv in m.get_key_value_managers().values() for k in kv if k)
    blocks = [s for s in safe if s.endswith(("_modules['mlp']", "_modules['feed_forward']"))]
    assert len(blocks) == model.config.num_hidden_layers >= 2, blocks
    assert all(safe[b] for b in sorted(blocks)[1:]), {b: safe[b] for b in blocks}


def test_model_built_patched_compiles_on_its_first_call():
    """A patch_model_type'd class builds its layers lazily; the first call being a compiled one
    builds them while tracing (_prepare_all), with no graph break."""
    cfg = tiny_config("qwen3_moe")
    ref = _logits(build_model(cfg, torch.float32), _prompt())
    patch_model_type("qwen3_moe")
    try:
        model = build_model(cfg, torch.float32)
    finally:
        unpatch_model_type("qwen3_moe")
    assert all(b.__dict__["_shufflemoe"].layer is None for b in _blocks(model).values())
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        assert_close(compiled(_prompt()).logits, ref, torch.float32, "logits")


def test_experts_implementation_compiles():
    """The experts_implementation path traces too (its cached canonical weights are derived in
    the graph under torch.compile), with no guard that calls Python at every check (torch 2.11
    guards a dataclass default read in the trace so: config.traced_config)."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    register_experts_implementation()
    model = build_model(tiny_config("qwen3_moe"), torch.float32)
    ids = _prompt()[:2, :5]
    ref = _logits(model, ids)
    model.set_experts_implementation("shufflemoe")
    torch._dynamo.reset()
    with torch.no_grad():
        explained = torch._dynamo.explain(model)(ids)
        assert explained.graph_break_count == 0, explained.break_reasons
        got = torch.compile(model, fullgraph=True, backend="aot_eager")(ids).logits
    assert_close(got, ref, torch.float32, "compiled logits")
    guards = _debug_get_cache_entry_list(model.forward.__code__)[0].guard_manager
    assert "PythonLambdaGuardAccessor" not in str(guards)


@pytest.mark.parametrize("bad", [(), (0, 4), (2.0,), "all"])
def test_graph_buckets_are_checked(bad):
    model = build_model(tiny_config("qwen3_moe"), torch.float32)
    with pytest.raises(ValueError, match="graph_buckets"):
        patch(model, graph_buckets=bad)
    with pytest.raises(ValueError, match="graph_buckets"):
        patch_model_type("qwen3_moe", graph_buckets=bad)
    assert not any("_shufflemoe" in b.__dict__ for b in model.modules()), "changed nothing"


def test_no_layer_graphs_off_cuda():
    """graph_buckets="auto" (the default) captures on CUDA only: on the CPU each block calls its
    layer directly."""
    model = patch(build_model(tiny_config("qwen3_moe"), torch.float32))
    states = [b.__dict__["_shufflemoe"] for b in _blocks(model).values()]
    assert all(s.graph_buckets == "auto" and s.run == s.layer.forward for s in states)


@pytest.mark.parametrize("how", ["patch", "experts_implementation"])
def test_train_mode_with_gradients_is_refused(how):
    """shufflemoe computes no gradients: a forward that would train raises instead of silently
    leaving the experts' gradients empty. Train mode under no_grad, and eval mode with
    gradients on (an ordinary HF forward), still run."""
    model = build_model(tiny_config("qwen3_moe"), torch.float32)
    ids = _prompt()
    if how == "patch":
        patch(model)
    else:
        register_experts_implementation()
        model.set_experts_implementation("shufflemoe")
    model.train()
    with pytest.raises(RuntimeError, match="inference only.*model.eval"):
        model(ids)
    with torch.no_grad():
        model(ids)
    model.eval()
    model(ids)


# ---- GPU: the lead runs these (PYTHONPATH=src python -m pytest -q tests/integrations) ----
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
_GEN = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0)


def _graph_runs(model) -> list:
    from shufflemoe.graph import GraphedMoE

    runs = [b.__dict__["_shufflemoe"].run for b in _blocks(model).values()]
    return [r for r in runs if isinstance(r, GraphedMoE)]


# The GPU's whole-model tests (graph capture, Inductor) take a model of each kind of block and
# router: the types mapped before 2026-12-05 and, of those mapped since (every one checked on the
# CPU above, its blocks on the kernels too), a hybrid with a gated shared expert, a hybrid
# DeepSeek-V3 block, clamped experts, a float32 router weight and a bias on the block (an
# Inductor compile is ~20 s a model: all of them would crowd the suite's one device call).
GPU_MODEL_TYPES = MODEL_TYPES[:MODEL_TYPES.index("gpt_oss") + 1] + [
    "qwen3_5_moe_text", "kimi_linear", "hy_v4", "ernie4_5_moe", "minimax_m2"]
GPU_COMPILED = [t for t in GPU_MODEL_TYPES if t in COMPILED_GENERATE]


@gpu
@pytest.mark.parametrize("model_type", GPU_MODEL_TYPES)
def test_gpu_eager_generate_with_per_layer_graphs(model_type):
    """Plain eager generate on CUDA: patch()'s default captures each MoE block per token bucket
    (decode here: 4 tokens a step), all blocks in one pool, the same greedy tokens as
    transformers; graph_buckets=None opts out."""
    model = build_model(tiny_config(model_type), torch.float32, "cuda")
    ids = _prompt().cuda()
    with torch.no_grad():
        ref = model.generate(ids, **_GEN)
        patch(model)
        tokens = model.generate(ids, **_GEN)
    runs = _graph_runs(model)
    assert len(runs) == len(_blocks(model)) and all(B in r._graphs for r in runs)
    assert len({id(r.pool) for r in runs}) == 1, "one memory pool for all blocks"
    assert torch.equal(tokens, ref)
    patch(model, graph_buckets=None)
    with torch.no_grad():
        assert torch.equal(model.generate(ids, **_GEN), ref)
    assert not _graph_runs(model)


@gpu
@pytest.mark.parametrize("model_type", GPU_COMPILED)
def test_gpu_compiled_generate(model_type):
    """transformers' own fast path on CUDA: cache_implementation="static" compiles the decode
    step with its default CompileConfig (inductor, mode="reduce-overhead"), here with
    fullgraph=True; the blocks capture no graphs of their own inside it."""
    from transformers import CompileConfig

    model = build_model(tiny_config(model_type), torch.float32, "cuda")
    ids = _prompt().cuda()
    gen = dict(_GEN, cache_implementation="static")
    with torch.no_grad():
        ref = model.generate(ids, disable_compile=True, **gen)
        patch(model)
        torch._dynamo.reset()
        tokens = model.generate(ids, compile_config=CompileConfig(fullgraph=True), **gen)
    assert getattr(model, "_compiled_call", None) is not None
    assert torch.equal(tokens, ref)
    # the prefill (B * S = 48 tokens) ran eagerly, with graphs; decode (B = 4) only compiled
    assert all(B not in r._graphs for r in _graph_runs(model))
