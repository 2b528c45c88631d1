"""CUDA-graph decode (shufflemoe.graphed, graph.GraphPool) and the no-host-sync promise of the
shuffled path. All but the argument checks need a GPU: the lead runs them there
(PYTHONPATH=src python -m pytest -q tests/test_graph.py)."""

import pytest
import torch

from factories import make_input, make_layer
from shufflemoe.testing import tolerance_key
from shufflemoe import MoEConfig, graphed, naive_moe
from shufflemoe.graph import GraphedMoE, GraphPool
from shufflemoe.testing import assert_close

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

CONFIGS = {
    "llama4-like": MoEConfig(hidden_size=256, intermediate_size=128, num_experts=16, router="llama4",
                             scoring="sigmoid", apply_router_weight_on_input=True,
                             shared_intermediate_size=128),
    "qwen3-like": MoEConfig(hidden_size=256, intermediate_size=96, num_experts=128, top_k=8,
                            renormalize=True),
    "mixtral-fp8": MoEConfig(hidden_size=256, intermediate_size=192, num_experts=8, top_k=2,
                             renormalize=True, quantization="fp8_rowwise"),
}


@gpu
@pytest.mark.parametrize("name", CONFIGS)
def test_graph_replays_follow_the_routing(name):
    cfg = CONFIGS[name]
    layer = make_layer(cfg, device="cuda")
    decode = graphed(layer, token_buckets=(1, 4, 16, 64))
    for step, T in enumerate((1, 3, 16, 64, 50, 1, 9)):  # new tokens, so new routing, each replay
        x = make_input(cfg, T, seed=100 + step, device="cuda")
        routing = layer.route(x)
        ref, mag = naive_moe(layer, x, routing, with_magnitude=True)
        assert_close(decode(x), ref, tolerance_key(cfg), name=f"replay {step} (T={T})", magnitude=mag)
    big = make_input(cfg, 100, device="cuda")  # above the largest bucket: runs eagerly
    ref, mag = naive_moe(layer, big, layer.route(big), with_magnitude=True)
    assert_close(decode(big), ref, tolerance_key(cfg), magnitude=mag)


@gpu
@pytest.mark.parametrize("name", CONFIGS)
def test_shuffled_forward_never_syncs(name):
    cfg = CONFIGS[name]
    layer = make_layer(cfg, device="cuda")
    x = make_input(cfg, 37, device="cuda")
    layer(x)  # compile the kernels first (compilation may sync)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        layer(x)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@gpu
def test_sync_detection_works():  # the check above can fail: a syncing strategy trips it
    layer = make_layer(CONFIGS["qwen3-like"], experts="sliced", device="cuda")
    x = make_input(layer.config, 8, device="cuda")
    layer(x)
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError):
            layer(x)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_graphed_rejects_what_it_cannot_capture():
    cfg = CONFIGS["qwen3-like"]
    with pytest.raises(ValueError, match="CUDA"):
        graphed(make_layer(cfg))
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="sliced syncs"):
            graphed(make_layer(cfg, experts="sliced", device="cuda"))
        with pytest.raises(ValueError, match="capacity"):
            graphed(make_layer(cfg.replace(capacity_factor=1.0), device="cuda"))
        with pytest.raises(ValueError, match="token_buckets"):
            graphed(make_layer(cfg, device="cuda"), token_buckets=(0, 4))
        with pytest.raises(ValueError, match="warmup"):
            graphed(make_layer(cfg, device="cuda"), warmup=0)


@gpu
def test_layers_share_one_pool():
    """Eight layers captured into one GraphPool: every replay follows its own layer and routing,
    and seven more layers add less memory than the first one took (each capture's intermediates
    return to the pool, where the next capture finds them; static inputs and outputs are shared
    per bucket). Without sharing, each layer would hold its own."""
    cfg, buckets = CONFIGS["qwen3-like"], (1, 16, 64)
    layers = [make_layer(cfg, seed=i, device="cuda") for i in range(8)]
    pool = GraphPool()
    torch.cuda.synchronize()
    base = torch.cuda.memory_reserved()
    graphs = [graphed(layers[0], buckets, pool=pool)]
    torch.cuda.synchronize()
    first = torch.cuda.memory_reserved() - base
    graphs += [graphed(layer, buckets, pool=pool) for layer in layers[1:]]
    torch.cuda.synchronize()
    rest = torch.cuda.memory_reserved() - base - first
    assert rest < first, f"7 more layers took {rest} bytes, the first {first}"
    assert pool.nbytes() == sum(3 * b * cfg.hidden_size * 2 for b in buckets)  # in, out, scratch
    for step, T in enumerate((1, 16, 9, 64, 1)):
        for i, (layer, g) in enumerate(zip(layers, graphs)):
            x = make_input(cfg, T, seed=10 * step + i, device="cuda")
            ref, mag = naive_moe(layer, x, layer.route(x), with_magnitude=True)
            assert_close(g(x), ref, tolerance_key(cfg), name=f"layer {i} T={T}", magnitude=mag)


@gpu
def test_replays_keep_the_input_shape_and_reject_what_the_layer_rejects():
    """[B, S, D] replays come back as [B, S, D]; an input the layer would refuse (wrong dtype,
    width or device) is never copied into a graph's buffer: the layer raises, naming x."""
    cfg = CONFIGS["llama4-like"]
    layer = make_layer(cfg, device="cuda")
    decode = graphed(layer, token_buckets=(4,))
    x = make_input(cfg, 3, device="cuda")
    ref, mag = naive_moe(layer, x, layer.route(x), with_magnitude=True)
    for shaped in (x, x.view(1, 3, -1), x.view(3, 1, -1)):
        y = decode(shaped)
        assert y.shape == shaped.shape
        assert_close(y.reshape(3, -1), ref, tolerance_key(cfg), magnitude=mag)
    for bad in (x.float(), x[:, :-1], x.cpu(), x.view(-1)):
        with pytest.raises((TypeError, ValueError), match="x"):
            decode(bad)
    flat = GraphedMoE(layer, token_buckets=(4,), flat=True)  # Llama 4's block: [T, D] out
    for shaped in (x, x.view(1, 3, -1), torch.cat([x, x]).view(2, 3, -1)):  # 6 > the bucket
        y = flat(shaped)
        assert y.shape == (shaped.numel() // cfg.hidden_size, cfg.hidden_size)
        assert_close(y[:3], ref, tolerance_key(cfg), magnitude=mag)


@gpu
def test_lazy_capture_and_a_callers_capture():
    """lazy: a bucket is captured on its first use only. Inside a graph the caller captures, the
    layer runs eagerly (captured into the caller's graph), and that graph replays correctly."""
    cfg = CONFIGS["mixtral-fp8"]
    layer = make_layer(cfg, device="cuda")
    lazy = GraphedMoE(layer, (1, 8), lazy=True)
    assert not lazy._graphs
    x = make_input(cfg, 5, device="cuda")
    y = lazy(x)
    assert set(lazy._graphs) == {8}
    ref, mag = naive_moe(layer, x, layer.route(x), with_magnitude=True)
    assert_close(y, ref, tolerance_key(cfg), magnitude=mag)
    static = x.clone()
    lazy(static)  # warm outside the capture
    outer = torch.cuda.CUDAGraph()
    with torch.cuda.graph(outer):
        out = lazy(static)
    assert set(lazy._graphs) == {8}  # no capture of its own inside the caller's
    fresh = make_input(cfg, 5, seed=9, device="cuda")
    static.copy_(fresh)
    outer.replay()
    ref, mag = naive_moe(layer, fresh, layer.route(fresh), with_magnitude=True)
    assert_close(out, ref, tolerance_key(cfg), magnitude=mag)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA streams")
def test_shared_expert_forks_a_stream_only_under_capture():
    """Eager decode is host-bound, so the shared expert stays on the caller's stream there; a
    captured graph forks it onto the side stream (free at replay), with the same bits: the same
    fused kernels (MoE._fused_shared), in their own split-K workspace beside the routed ones."""
    from shufflemoe import MoE, MoEConfig, graphed

    layer = MoE(MoEConfig(hidden_size=128, intermediate_size=64, num_experts=4, top_k=1, router="llama4",
                          scoring="sigmoid", apply_router_weight_on_input=True,
                          shared_intermediate_size=96), device="cuda")
    x = torch.randn(2, 128, device="cuda", dtype=torch.bfloat16)
    assert not layer._uses_side_stream(x)
    eager = layer(x)
    assert layer._side_stream is None
    assert torch.equal(graphed(layer, (2,))(x), eager)
    assert layer._side_stream is not None
    ref, mag = naive_moe(layer, x, layer.route(x), with_magnitude=True)
    assert_close(eager, ref, tolerance_key(layer.config), magnitude=mag)


@gpu
def test_a_callers_capture_waits_for_the_shared_expert_stream():
    """In a graph the caller captures around the layer, the shared expert runs on its side stream
    and the routed experts' combine must wait for it before adding into the output. A shared
    expert far heavier than the routed ones makes a missing wait show in every replay (9c5a82e
    had one: its launch-plan path dropped the wait)."""
    from shufflemoe import MoE, MoEConfig

    layer = MoE(MoEConfig(hidden_size=1024, intermediate_size=64, num_experts=4, top_k=1,
                          router="llama4", scoring="sigmoid", apply_router_weight_on_input=True,
                          shared_intermediate_size=16384), device="cuda")
    static = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        want = layer(static)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            layer(static)  # warm-up off the capture stream
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = layer(static)
        assert layer._side_stream is not None
        for _ in range(3):
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, want)


@gpu
def test_a_replay_is_one_allocation_and_one_graph_launch():
    """A replay launches no aten copy in, clone out or fill of the rows below the bucket: the
    graph's own copy kernels are pointed at the caller's x and at a fresh output. Each output is
    its own tensor (an earlier one keeps its values), inputs may be non-contiguous or overwritten
    right after the call, and zero tokens run the layer."""
    cfg = CONFIGS["llama4-like"]
    layer = make_layer(cfg, device="cuda")
    decode = graphed(layer, token_buckets=(1, 4))
    xs = [make_input(cfg, T, seed=s, device="cuda") for s, T in enumerate((1, 3, 4, 1))]
    refs = [naive_moe(layer, x, layer.route(x), with_magnitude=True) for x in xs]
    ys = [decode(x.clone()) for x in xs]  # each input freed (and its memory reused) at once
    for i, (y, (ref, mag)) in enumerate(zip(ys, refs)):
        assert_close(y, ref, tolerance_key(cfg), name=f"call {i}", magnitude=mag)
    assert len({y.data_ptr() for y in ys}) == len(ys)
    x = xs[1].clone()  # T = 3 in the bucket of 4: its last static row is zeroed by the copy in
    decode(x)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        y = decode(x)
        x.normal_()  # the caller overwrites its input after the call: stream order protects it
    torch.cuda.synchronize()
    ops = {e.name for e in prof.events()}
    assert not ops & {"aten::copy_", "aten::clone", "aten::contiguous", "aten::zero_",
                      "aten::fill_"}, ops
    assert_close(y, refs[1][0], tolerance_key(cfg), magnitude=refs[1][1])
    wide = torch.empty(cfg.hidden_size, 3, device="cuda", dtype=x.dtype).t()  # not contiguous
    wide.copy_(xs[1])
    assert_close(decode(wide), refs[1][0], tolerance_key(cfg), magnitude=refs[1][1])
    empty = decode(xs[0][:0])
    assert empty.shape == (0, cfg.hidden_size)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("n,size", [(1, 1), (300, 300), (2048, 4096), (2049, 6000), (0, 17)])
def test_copy_rows_copies_then_zeroes(device, dtype, n, size):
    """The graphs' copy kernel: dst[:size] = src[:n] then zeros, dst past size untouched, at
    sizes across program boundaries (COPY_BLOCK = 2048)."""
    from shufflemoe.graph import copy_rows

    src = torch.randn(max(n, 1) + 5, device=device).to(dtype)
    dst = torch.full((size + 7,), float("nan"), device=device, dtype=dtype)
    copy_rows(src, dst, n, size)
    want = torch.cat([src[:n], torch.zeros(size - n, dtype=dtype, device=device)])
    assert torch.equal(dst[:size], want)
    assert dst[size:].isnan().all()


@gpu
def test_inputs_and_outputs_at_any_alignment(monkeypatch):
    """The copy kernel is specialized on nothing, so one captured graph serves an input at any
    address: views one and three elements past an aligned block, then an aligned one, each
    against float64; the output (a fresh allocation) is moved off alignment with them."""
    cfg = CONFIGS["qwen3-like"]
    layer = make_layer(cfg, device="cuda")
    decode = graphed(layer, token_buckets=(4,))

    def misaligned_empty_like(t):
        return t.new_empty(t.numel() + 1)[1:].view(t.shape)

    for step, offset in enumerate((1, 3, 0)):
        x = make_input(cfg, 3, seed=step, device="cuda")
        buf = torch.empty(x.numel() + offset, device="cuda", dtype=x.dtype)
        shifted = buf[offset:].view(x.shape)
        shifted.copy_(x)
        size = x.element_size()
        assert shifted.data_ptr() % 16 == size * offset
        ref, mag = naive_moe(layer, x, layer.route(x), with_magnitude=True)
        with monkeypatch.context() as m:
            if offset:
                m.setattr(torch, "empty_like", misaligned_empty_like)
            y = decode(shifted)
        assert y.data_ptr() % 16 == (size if offset else 0)
        assert_close(y, ref, tolerance_key(cfg), name=f"offset {offset}", magnitude=mag)


@gpu
def test_a_replay_runs_on_the_callers_stream():
    """The graph is launched on the caller's current stream: work queued before the call on that
    stream (the input's fill) is done first, and the output is ready once that stream is."""
    cfg = CONFIGS["qwen3-like"]
    layer = make_layer(cfg, device="cuda")
    decode = graphed(layer, token_buckets=(4,))
    x = make_input(cfg, 4, device="cuda")
    ref, mag = naive_moe(layer, x, layer.route(x), with_magnitude=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(10_000_000)  # ~5 ms: a replay on another stream would read x first
        x2 = x.clone()
        y = decode(x2)
    side.synchronize()
    assert_close(y, ref, tolerance_key(cfg), magnitude=mag)


@gpu
def test_a_refused_retarget_falls_back_to_the_eager_layer(monkeypatch):
    """Where CUDA refuses to point a graph's copies at an input, the layer warns and runs
    eagerly from then on, with the same results."""
    from shufflemoe import graph as graph_module

    cfg = CONFIGS["qwen3-like"]
    layer = make_layer(cfg, device="cuda")
    decode = graphed(layer, token_buckets=(1, 4))
    x = make_input(cfg, 3, device="cuda")
    ref, mag = naive_moe(layer, x, layer.route(x), with_magnitude=True)
    monkeypatch.setattr(graph_module.KernelNode, "set", lambda *args: 1)  # CUDA_ERROR_INVALID_VALUE
    with pytest.warns(RuntimeWarning, match="without CUDA graphs"):
        y = decode(x)
    assert_close(y, ref, tolerance_key(cfg), magnitude=mag)
    assert not decode._graphs and not decode.buckets
    assert_close(decode(x), ref, tolerance_key(cfg), magnitude=mag)


@gpu
def test_copies_are_pointed_again_only_where_an_address_changed(monkeypatch):
    """A replay calls the runtime only for a copy whose address (or size) changed: the same
    input buffer, refilled, is read again without one and its new values followed; a new buffer,
    and fewer tokens of the same buffer (same address, fewer bytes), point the copy in again.
    Every call against float64."""
    from shufflemoe import graph as graph_module

    cfg = CONFIGS["qwen3-like"]
    layer = make_layer(cfg, device="cuda")
    decode = graphed(layer, token_buckets=(4,))
    into = []
    real = graph_module.KernelNode.set

    def counting(node, handle, *args):
        into.append(node is decode._graphs[4].into)
        return real(node, handle, *args)

    monkeypatch.setattr(graph_module.KernelNode, "set", counting)
    buf = torch.empty(3, cfg.hidden_size, device="cuda", dtype=cfg.dtype)
    other = torch.empty_like(buf)
    expected_copies_in = 0
    for step, (x, T) in enumerate(((buf, 3), (buf, 3), (buf, 3), (other, 3), (other, 3),
                                   (buf, 2), (buf, 2), (buf, 3))):
        x = x[:T]
        x.copy_(make_input(cfg, T, seed=step, device="cuda"))  # new values, same address
        ref, mag = naive_moe(layer, x, layer.route(x), with_magnitude=True)
        assert_close(decode(x), ref, tolerance_key(cfg), name=f"step {step}", magnitude=mag)
        expected_copies_in += step in (0, 3, 5, 7)  # first call, new buffer, new size (twice)
        assert sum(into) == expected_copies_in, (step, into)
