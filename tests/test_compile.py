"""torch.compile(fullgraph=True) of the MoE layer: zero graph breaks (torch._dynamo.explain) and
the eager result, for each dtype, each graph-safe expert strategy, the references and the Triton
kernels, and a batch size that changes between calls. On the CPU (the kernels interpreted), and on
CUDA where there is one (the lead runs PYTHONPATH=src python -m pytest -q tests/test_compile.py)."""

from __future__ import annotations

import logging
import re

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
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def assert_no_graph_breaks(fn, *args) -> None:
    explained = torch._dynamo.explain(fn)(*args)
    reasons = [str(b.reason).splitlines()[0] for b in explained.break_reasons]
    assert explained.graph_break_count == 0 and explained.graph_count == 1, reasons


def check_compiles(layer, sizes=(5, 9), backend="aot_eager") -> None:
    """No graph break, and the compiled layer returns the eager result at each T, bit for bit
    (every combine sums a token's rows in a fixed order: DESIGN.md, "Same input, same bits")."""
    torch._dynamo.reset()
    cfg = layer.config
    assert_no_graph_breaks(layer, make_input(cfg, sizes[0], device=DEV))
    compiled = torch.compile(layer, fullgraph=True, backend=backend)
    for T in sizes:
        x = make_input(cfg, T, seed=T, device=DEV)
        got, want = compiled(x), layer(x)
        assert torch.equal(got, want), f"T={T}"


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", CONFIGS)
def test_layer_compiles_without_graph_breaks(name, impl):
    with use_impl(impl):  # the interpreter is slow: one size for the kernels
        check_compiles(make_layer(CONFIGS[name], device=DEV),
                       sizes=(5, 9) if impl == "torch" or DEV == "cuda" else (5,))


@pytest.mark.parametrize("experts", [n for n in GRAPH_SAFE if n != "shuffled"])
def test_graph_safe_strategies_compile(experts):
    check_compiles(make_layer(CONFIGS["qwen2-fp32"], experts=experts, device=DEV), sizes=(7,))


def test_inductor_matches_eager():
    """Inductor fuses the torch code around the custom ops; the ops' results are unchanged."""
    layer = make_layer(CONFIGS["qwen2-fp32"], device=DEV)
    x = make_input(layer.config, 6, device=DEV)
    torch._dynamo.reset()
    got = torch.compile(layer, fullgraph=True)(x)
    torch.testing.assert_close(got, layer(x), rtol=1e-5, atol=1e-6)


KERNEL_CONFIGS = {  # static shapes through Inductor: every kernel family the layer launches
    "qwen2-fp32": CONFIGS["qwen2-fp32"],  # unfused: route, gather, grouped GEMMs, silu_mul
    "llama4-bf16": MoEConfig(hidden_size=64, intermediate_size=64, num_experts=8,
                             router="llama4", scoring="sigmoid",
                             apply_router_weight_on_input=True, shared_intermediate_size=64),
    "llama4-fp8": CONFIGS["llama4-fp8"],
    # a gated shared expert: merged at T = 1, beside the routed experts' launches at T = 3 and 6
    "qwen3-next-bf16": MoEConfig(hidden_size=64, intermediate_size=64, num_experts=16, top_k=2,
                                 renormalize=True, shared_intermediate_size=64,
                                 shared_expert_gate=True),
    "gpt-oss-mxfp4": CONFIGS["gpt-oss-mxfp4"],
    "qwen3-fp8-block": CONFIGS["qwen3-fp8-block"],
}


@pytest.mark.skipif(DEV != "cuda", reason="Inductor traces the kernels on a GPU only")
@pytest.mark.parametrize("name", KERNEL_CONFIGS)
def test_inductor_launches_the_kernels_itself(name):
    """At a static size Inductor sees the layer's Triton kernels (triton_op) and launches them
    from its own code: no shufflemoe op is called from the compiled code, the index shuffle's
    kernel is in it, and the result is eager's, bit for bit. Other sizes (T = 1 is specialized
    again; 6 is dynamic and takes the opaque ops) stay within the dtype's closeness: at T = 1
    Inductor may turn the router's and shared expert's [1, D] matmuls into reductions of its
    own (fp32 layer: last-bit differences, measured on an H100)."""
    from torch._inductor.utils import run_and_get_code

    layer = make_layer(KERNEL_CONFIGS[name], device=DEV)
    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True)
    x = make_input(layer.config, 3, seed=3, device=DEV)
    got, codes = run_and_get_code(compiled, x)
    code = "\n".join(codes)
    assert "torch.ops.shufflemoe" not in code and "_route_kernel" in code
    assert torch.equal(got, layer(x))
    for T in (1, 6):
        x = make_input(layer.config, T, seed=T, device=DEV)
        torch.testing.assert_close(compiled(x), layer(x), msg=f"T={T}")


@pytest.mark.skipif(DEV != "cuda", reason="Inductor traces the kernels on a GPU only")
def test_compiled_fused_decode_zeroes_no_arrival_words():
    """Compiled, the fused decode kernels get fresh arrival words (a fill each, every call) only
    where they read them: without split-K (small widths, one K step), bf16 and top-1, neither
    the shared expert's kernels nor the routed experts' read any."""
    from torch._inductor.utils import run_and_get_code

    layer = make_layer(KERNEL_CONFIGS["llama4-bf16"], device=DEV)
    torch._dynamo.reset()
    x = make_input(layer.config, 3, seed=5, device=DEV)
    got, codes = run_and_get_code(torch.compile(layer, fullgraph=True), x)
    code = "\n".join(codes)
    assert code.count("_gate_up_kernel_") >= 2 and code.count("_down_kernel_") >= 2
    fills = re.findall(r"triton_\w*zeros\w*\.run", code)
    assert not fills, fills
    assert torch.equal(got, layer(x))


def split_k():
    """16-wide tiles, K split 2 ways in both fused decode kernels (arrival words read)."""
    from shufflemoe.ops.moe_decode import configs

    gemm = configs.GemmConfig(16, 32, 2)
    return configs.DecodeConfig(gemm, gemm)


@pytest.mark.skipif(DEV != "cuda", reason="Inductor traces the kernels on a GPU only")
@pytest.mark.parametrize("name", ["llama4-bf16", "llama4-fp8"])
def test_compiled_fused_decode_fills_no_arrival_words(name):
    """Compiled with split-K (and fp8's row quantization), where the fused decode kernels read
    arrival words, they use the persistent buffer (kernel.held_words: a graph input they
    mutate in place and leave zero): no fill, copy or clone of it in the compiled code."""
    from torch._inductor.utils import run_and_get_code

    from shufflemoe.ops.moe_decode import configs

    layer = make_layer(KERNEL_CONFIGS[name], device=DEV)
    x = make_input(layer.config, 3, seed=7, device=DEV)
    with configs.override(split_k()), configs.override(configs.ALWAYS):
        want = layer(x)  # eager first: the buffer is sized for these tiles
        torch._dynamo.reset()
        got, codes = run_and_get_code(torch.compile(layer, fullgraph=True), x)
        again = torch.compile(layer, fullgraph=True)(x)  # the words came back to zero
    calls = "\n".join(c.split("def call(self, args)", 1)[1] for c in codes
                      if "def call(self, args)" in c)  # the code a call runs
    assert calls.count("_gate_up_kernel_") >= 2 and calls.count("_down_kernel_") >= 2
    extra = [line.strip() for line in calls.splitlines()
             if re.search(r"zeros|fill|copy|clone|arange|full", line)]
    assert not extra, extra[:20]
    assert torch.equal(got, want) and torch.equal(again, want)


@pytest.mark.skipif(DEV != "cuda", reason="CUDA-graph trees need a GPU")
def test_reduce_overhead_keeps_cuda_graphs():
    """mode="reduce-overhead" (transformers' compiled generate): the kernels mutate the arrival
    words, a static address (mark_static_address), so CUDA-graph trees still capture the
    layer; replays match eager with fresh inputs."""
    from torch._dynamo.utils import counters

    from shufflemoe.ops.moe_decode import configs

    layer = make_layer(KERNEL_CONFIGS["llama4-bf16"], device=DEV)
    with configs.override(split_k()), configs.override(configs.ALWAYS):
        layer(make_input(layer.config, 3, seed=8, device=DEV))
        torch._dynamo.reset()
        counters.clear()
        compiled = torch.compile(layer, mode="reduce-overhead", fullgraph=True)
        for seed in range(9, 14):
            x = make_input(layer.config, 3, seed=seed, device=DEV)
            got = compiled(x).clone()
            assert torch.equal(got, layer(x)), seed
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])


@pytest.mark.skipif(DEV != "cuda", reason="Inductor traces the kernels on a GPU only")
def test_compiled_fused_decode_leaves_pdl_out():
    """A tuning-table row with PDL launches without it when compiled: griddepcontrol's inline
    asm stops Inductor's analysis of what a kernel writes (it logs so on torch._dynamo's
    logger), which then copies every input."""
    from shufflemoe.ops.moe_decode import configs

    layer = make_layer(KERNEL_CONFIGS["llama4-bf16"], device=DEV)
    x = make_input(layer.config, 3, seed=6, device=DEV)
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logger = logging.getLogger("torch._dynamo")
    logger.addHandler(handler)
    try:
        with configs.override(lambda key: configs._choose(*key).with_(pdl=True)):
            want = layer(x)  # eager, with PDL
            torch._dynamo.reset()
            got = torch.compile(layer, fullgraph=True)(x)
    finally:
        logger.removeHandler(handler)
    assert not [r for r in records if "every input is mutated" in r.getMessage()]
    assert torch.equal(got, want)


def test_compiled_fused_shared_expert_makes_no_routing():
    """The fused shared expert's routing (every token on one expert) is views of the layer's
    persistent arange: a compiled graph makes no tensor for it (no arange or full node, which
    Inductor would launch as kernels every call)."""
    layer = make_layer(KERNEL_CONFIGS["llama4-bf16"], device=DEV)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    x = make_input(layer.config, 3, device=DEV)
    with use_impl("triton"):
        layer._hot()  # gathered for real first, as an eager call or patch() does
        got = torch.compile(layer, fullgraph=True, backend=backend)(x)
        want = layer(x)
    calls = [str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"]
    assert any("decode" in c for c in calls), "the fused decode kernels were not traced"
    assert not [c for c in calls if "arange" in c or "full" in c], calls
    assert torch.equal(got, want)


def _managers(root):
    """Every guard manager of a Dynamo guard tree (child managers and dict guards' keys and
    values)."""
    stack = [root]
    while stack:
        m = stack.pop()
        yield m
        stack.extend(m.get_child_managers())
        if hasattr(m, "get_key_value_managers"):
            stack.extend(k for kv in m.get_key_value_managers().values() for k in kv if k)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", ["qwen2-fp32", "llama4-fp8"])
def test_compiled_layers_of_one_config_are_guarded_once(name, impl):
    """Compiled, a layer reads its config and strategies through the module global _PATHS (one
    entry guarded once for every layer of a config) and only tensors and numbers through its
    module. With Dynamo's recursive dict tags on (torch 2.11's default) each layer's subtree is
    then tag safe, skipped while its dicts are unchanged; and no guard calls Python (a dataclass
    field left to its default in the trace, RouteConfig's or Routing's, is guarded through
    dataclasses.fields() on torch 2.11: ~20 us a step on an H200 host). On the GPU the "triton"
    rows trace the kernels' Python; on the CPU their interpreter path."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    def run(model, x):
        for layer in model:
            x = layer(x)
        return x

    model = torch.nn.ModuleList(make_layer(CONFIGS[name], device=DEV) for _ in range(3))
    x = make_input(CONFIGS[name], 2, device=DEV)
    torch._dynamo.reset()
    with use_impl(impl), torch._dynamo.config.patch(use_recursive_dict_tags_for_guards=True):
        want = run(model, x)  # gathered for real first, as an eager call or patch() does
        compiled = torch.compile(run, fullgraph=True, backend="eager")
        for _ in range(2):
            assert torch.equal(compiled(model, x), want)
        guards = _debug_get_cache_entry_list(run.__code__)[0].guard_manager
    assert "PythonLambdaGuardAccessor" not in str(guards)
    safe = {m.get_source(): m.is_tag_safe() for m in _managers(guards.root)}
    layers = [f"L['model']._modules['{i}']" for i in range(3)]
    assert all(safe[s] for s in layers), {s: safe[s] for s in layers}
