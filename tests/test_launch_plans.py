"""Launch plans (ops/_launch.py): the layer's routing and experts recorded once per (T, stream),
replayed without argument binding or allocation. A replay must give the same bits as running
the region (the same kernels, the same order), for every layer that shares a template, and fall
back to running it whenever a replay could be wrong. On the CPU the kernels run in the
interpreter (use_impl("triton")), which replays through fn[grid] with rebuilt tensors; on a GPU
replays launch the compiled kernels with integer pointers."""

import dataclasses
import pathlib
import re

import pytest
import torch

from factories import gpt_oss_config, make_input, make_layer
from shufflemoe import MoEConfig, routing
from shufflemoe import layer as moe_layer
from shufflemoe.ops import _launch, use_impl
from shufflemoe.ops.moe_decode import configs

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

CONFIGS = {  # every decode flavour: fused (k = 1, k > 1, fp8, a shared expert, gated) and unfused
    "qwen3-like": MoEConfig(hidden_size=32, intermediate_size=16, num_experts=8, top_k=8,
                            renormalize=True, dtype=torch.bfloat16),
    "llama4-like": MoEConfig(hidden_size=32, intermediate_size=16, num_experts=4,
                             router="llama4", scoring="sigmoid", apply_router_weight_on_input=True,
                             shared_intermediate_size=16, dtype=torch.bfloat16),
    "mixtral-fp8": MoEConfig(hidden_size=32, intermediate_size=48, num_experts=8, top_k=2,
                             renormalize=True, quantization="fp8_rowwise",
                             dtype=torch.bfloat16),
    "gpt-oss-like": gpt_oss_config(hidden_size=32, intermediate_size=32, dtype=torch.bfloat16),
    "deepseek-like": MoEConfig(hidden_size=32, intermediate_size=16, num_experts=16, top_k=4,
                               router="group_limited", scoring="sigmoid", n_group=4,
                               topk_group=2, correction_bias=True, renormalize=True,
                               routed_scaling_factor=2.5, shared_intermediate_size=16,
                               dtype=torch.bfloat16),
    "qwen3-next-like": MoEConfig(hidden_size=32, intermediate_size=16, num_experts=16, top_k=4,
                                 renormalize=True, shared_intermediate_size=16,
                                 shared_expert_gate=True, dtype=torch.bfloat16),
}


def unplanned(layer, x):
    """The layer's output with plans off (the region runs as it always did)."""
    saved = moe_layer.PLAN_MAX_TOKENS, moe_layer.PLAN_MAX_LARGE
    moe_layer.PLAN_MAX_TOKENS = moe_layer.PLAN_MAX_LARGE = 0
    layer.__dict__["_hot_parts"] = None
    try:
        return layer(x)
    finally:
        moe_layer.PLAN_MAX_TOKENS, moe_layer.PLAN_MAX_LARGE = saved
        layer.__dict__["_hot_parts"] = None


def planned_tokens(layer, region: str = "routed") -> list[int]:
    return sorted(key[1] for key, plan in layer._hot().plans.items()
                  if isinstance(plan, _launch.Plan) and key[0] == region)


@pytest.mark.parametrize("name", CONFIGS)
def test_replays_are_bitwise_the_region(name):
    cfg = CONFIGS[name]
    a, b = (make_layer(cfg, seed=s, device=DEVICE) for s in (0, 1))
    Ts = (1, 3, 9)  # qwen3-like: A = 8, 24 (fused), 72 (unfused)
    with use_impl("triton"), torch.no_grad():
        want = {(T, i): unplanned(layer, make_input(cfg, T, seed=10 * T + i, device=DEVICE))
                for T in Ts for i, layer in enumerate((a, b))}
        for _ in range(2):  # the first pass records (a) and binds (b), the second replays both
            for T in Ts:
                for i, layer in enumerate((a, b)):
                    got = layer(make_input(cfg, T, seed=10 * T + i, device=DEVICE))
                    assert torch.equal(got, want[T, i]), f"T={T} layer {i}"
    # a shared expert joins the routed experts' launches up to Switch.shared_max_tokens
    # (MoE._merges_shared), their plan above it (MoE._fuses_shared)
    merge = configs.Switch().shared_max_tokens if cfg.shared_intermediate_size else 0
    region = "shared+routed" if cfg.shared_intermediate_size else "routed"
    for layer in (a, b):
        assert planned_tokens(layer, "merged") == [T for T in Ts if T <= merge]
        assert planned_tokens(layer, region) == [T for T in Ts if T > merge]
    assert not torch.equal(want[1, 0], want[1, 1])  # the layers differ: b replays its weights


def test_plans_follow_the_weights_they_were_bound_to():
    cfg = CONFIGS["qwen3-like"]
    layer = make_layer(cfg, device=DEVICE)
    x = make_input(cfg, 2, device=DEVICE)
    with use_impl("triton"), torch.no_grad():
        layer(x)
        assert planned_tokens(layer) == [2]
        plan = layer._hot().plans[next(iter(layer._hot().plans))]
        layer.w13.data = layer.w13.data.clone().mul_(2)  # moves the weights, keeps _hot
        assert layer._hot().plans  # the plan is still there: the call must not replay it
        assert not plan(x, torch.empty(0), torch.empty(0))
        assert torch.equal(layer(x), unplanned(layer, x))


def test_no_plan_where_the_region_computes_with_torch():
    cfg = CONFIGS["qwen3-like"]
    layer = make_layer(cfg, device=DEVICE)
    with torch.no_grad():
        with use_impl("torch"):  # the references: torch ops throughout
            layer(make_input(cfg, 1, device=DEVICE))
        assert planned_tokens(layer) == []


def _copy_region(src, dst, extra=None):
    """A region of one Triton launch (gather_scale copying rows) and optionally a torch op."""
    from shufflemoe.ops import gather_scale

    def region():
        ids = torch.empty(src.shape[0], dtype=torch.int32, device=src.device)
        ids.copy_(torch.arange(src.shape[0], dtype=torch.int32)) if extra == "copy" else None
        gather_scale(src, extra if isinstance(extra, torch.Tensor) else ids, out=dst)

    return region


def test_record_refuses_what_it_cannot_replay():
    x = torch.randn(4, 16, device=DEVICE)
    out = torch.empty_like(x)
    with use_impl("triton"):
        # a torch op besides allocations and views (here a copy into an allocation)
        assert _launch.record(_copy_region(x, out, "copy"), (x, out), 2) is None
        assert _launch.refusal == "ran aten.arange.default"  # the first such op
        # a tensor that is neither an input, an allocation of the region nor persistent
        foreign = torch.arange(4, dtype=torch.int32, device=DEVICE)
        assert _launch.record(_copy_region(x, out, foreign), (x, out), 2) is None
        assert _launch.refusal == "_gather_scale_kernel: ['ids_ptr']"
        # the same launch with the index tensor given as an input: recorded
        template = _launch.record(_copy_region(x, out, foreign), (x, out, foreign), 2)
        assert template is not None and len(template.launches) == 1
        assert _launch.record(lambda: None, (x, out), 2) is None  # nothing launched
        assert _launch.refusal == "no Triton launch"


def test_layers_share_a_recording_only_with_the_same_router(monkeypatch):
    """A layer gathered while ROUTERS held a torch-op router for its name records no plan; a
    layer of the same config gathered after must not take that refusal (2026-12-05: a probe
    that swapped the router this way timed the second layer unplanned)."""
    cfg = CONFIGS["deepseek-like"]
    a, b = (make_layer(cfg, seed=s, device=DEVICE) for s in (0, 1))
    x = make_input(cfg, 1, device=DEVICE)
    kernel = routing.ROUTERS._entries[cfg.router]
    with use_impl("triton"), torch.no_grad():
        monkeypatch.setitem(routing.ROUTERS._entries, cfg.router,
                            lambda logits, c, bias: kernel(logits.clone(), c, bias))
        a(x)
        monkeypatch.undo()
        b(x)
    assert planned_tokens(a, "merged") == [] and planned_tokens(b, "merged") == [1]


def test_every_kernel_launch_goes_through_launch():
    """A launch the recorder cannot see would be missing from every replay."""
    ops = pathlib.Path(__file__).parents[1] / "src" / "shufflemoe" / "ops"
    direct = [f"{p.relative_to(ops)}: {m.group(0)}" for p in ops.rglob("*.py")
              for m in re.finditer(r"\b\w+_kernel\[[^\]]+\]\(", p.read_text())]
    assert direct == []


@gpu
def test_misaligned_input_falls_back():
    cfg = CONFIGS["qwen3-like"]
    layer = make_layer(cfg, device="cuda")
    with torch.no_grad():
        layer(make_input(cfg, 1, device="cuda"))  # recorded with an aligned x
        flat = make_input(cfg, 2, device="cuda").view(-1)
        x = flat[1:1 + cfg.hidden_size].view(1, -1)  # 2 bytes past an aligned address
        assert x.data_ptr() % 16 and planned_tokens(layer) == [1]
        assert torch.equal(layer(x), unplanned(layer, x.clone()))


@gpu
def test_replays_on_a_side_stream_and_never_sync():
    cfg = CONFIGS["llama4-like"]
    layer = make_layer(cfg, device="cuda")
    x = make_input(cfg, 4, device="cuda")
    with torch.no_grad():
        want = unplanned(layer, x)
        layer(x)  # records on the default stream
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            layer(x)  # records its own plan and workspace on this stream
            torch.cuda.set_sync_debug_mode("error")
            try:
                got = layer(x)  # replays
            finally:
                torch.cuda.set_sync_debug_mode("default")
        torch.cuda.current_stream().wait_stream(side)
        assert len({key[2] for key, plan in layer._hot().plans.items() if plan}) == 2
        assert torch.equal(got, want)


def test_a_side_stream_join_reaches_the_routed_combine(monkeypatch):
    """When the shared expert runs on a side stream (inside a capture), its join must reach the
    routed experts' combine, which then waits before adding into out: never a launch plan,
    which has no join (a race at e2e_hf's Llama 4 step graph, batch 64, 9c5a82e)."""
    cfg = CONFIGS["llama4-like"]
    layer = make_layer(cfg, device=DEVICE)
    monkeypatch.setattr(moe_layer, "SHARED_FUSED_MAX_TOKENS", 0)  # the shared expert's own path
    joins = []
    start = layer.start_shared

    def side_stream_start(x, out=None):
        out, join = start(x, out)
        return out, (lambda: joins.append("joined"))

    monkeypatch.setattr(layer, "start_shared", side_stream_start)
    seen = []
    run = layer._route_and_run
    monkeypatch.setattr(layer, "_route_and_run",
                        lambda hot, x, logits, out, join=None, first=False: (
                            seen.append(join), run(hot, x, logits, out, join, first)))
    with use_impl("triton"), torch.no_grad():
        layer(make_input(cfg, 2, device=DEVICE))
    assert len(seen) == 1 and seen[0] not in (None, moe_layer._noop)
    assert joins == ["joined"] * 2  # the combine's wait, then the layer's own join
    assert planned_tokens(layer) == []


def test_no_replay_under_a_tile_override():
    """A plan recorded with the default tiles is not replayed inside an override (a tuning run
    or a benchmark that forces the fused path), and none is recorded there."""
    from shufflemoe.ops.grouped_gemm import configs as gemm_configs
    from shufflemoe.ops.moe_decode import configs as decode_configs

    cfg = CONFIGS["qwen3-like"]
    layer = make_layer(cfg, device=DEVICE)
    x = make_input(cfg, 9, device=DEVICE)  # A = 72: the unfused path by default
    with use_impl("triton"), torch.no_grad():
        layer(x)
        plan = layer._hot().plans[next(iter(layer._hot().plans))]
        calls = []
        plan.__class__.__call__, original = (lambda self, *t: calls.append(t) or False,
                                             plan.__class__.__call__)
        try:
            with decode_configs.override(decode_configs.ALWAYS):
                fused = layer(x)  # the fused kernels, run as the override says
            with gemm_configs.override(gemm_configs.TileConfig(16, 32, 32, tma="none")):
                layer(x)
        finally:
            plan.__class__.__call__ = original
        assert calls == [] and planned_tokens(layer) == [9]
        assert torch.equal(layer(x), unplanned(layer, x))
        assert fused.shape == x.shape


@pytest.mark.parametrize("name", ["qwen3-like", "llama4-like"])
def test_past_the_decode_sizes_a_plan_is_recorded_at_the_second_call(name, monkeypatch):
    """Past PLAN_MAX_TOKENS (prefill) a T's first call runs the region, its second records, the
    rest replay: the same bits each time (llama4-like: the routed experts overwrite out, the
    shared expert adds after, outside the plan)."""
    cfg = dataclasses.replace(CONFIGS[name], shared_stream_max_tokens=8)  # llama4: prefill's
    layer = make_layer(cfg, device=DEVICE)
    monkeypatch.setattr(moe_layer, "PLAN_MAX_TOKENS", 4)
    T = 21
    xs = [make_input(cfg, T, seed=s, device=DEVICE) for s in range(4)]
    with use_impl("triton"), torch.no_grad():
        want = [unplanned(layer, x) for x in xs]
        for i, x in enumerate(xs):
            got = layer(x)
            assert torch.equal(got, want[i]), f"call {i}"
            assert planned_tokens(layer) == ([] if i == 0 else [T]), f"call {i}"
        # llama4-like: the shared expert's SwiGLU between its cuBLAS GEMMs has a plan too
        assert planned_tokens(layer, "shared") == ([T] if cfg.shared_intermediate_size else [])


def test_plans_past_the_decode_sizes_are_bounded(monkeypatch):
    """At most PLAN_MAX_LARGE (region, T) past PLAN_MAX_TOKENS a layer, a T seen once giving its
    place to a new one, recorded plans keeping theirs; none whose workspace would pass
    PLAN_MAX_WORKSPACE; the calls past those bounds run the region."""
    cfg = CONFIGS["qwen3-like"]
    layer = make_layer(cfg, device=DEVICE)
    monkeypatch.setattr(moe_layer, "PLAN_MAX_TOKENS", 4)
    monkeypatch.setattr(moe_layer, "PLAN_MAX_LARGE", 2)
    xs = {T: make_input(cfg, T, seed=T, device=DEVICE) for T in (5, 6, 7, 8, 11)}
    with use_impl("triton"), torch.no_grad():
        want = {T: unplanned(layer, x) for T, x in xs.items()}  # (a fresh _Hot after this)
        # 7 takes 5's place, 7 records, 5 takes 6's place and records; then both places hold
        # plans: 6 and 8 are never recorded
        for T in (5, 6, 7, 7, 5, 5, 6, 8, 8, 8):
            assert torch.equal(layer(xs[T]), want[T]), f"T={T}"
        assert planned_tokens(layer) == [5, 7] and len(layer._hot().plans) == 2
        monkeypatch.setattr(moe_layer, "PLAN_MAX_LARGE", 16)
        monkeypatch.setattr(moe_layer, "PLAN_MAX_WORKSPACE", 1024)
        for _ in range(3):
            assert torch.equal(layer(xs[11]), want[11])
        plans = layer._hot().plans
        assert planned_tokens(layer) == [5, 7]
        assert [plans[k] for k in plans if k[1] == 11] == [None]  # recorded, too large: none
