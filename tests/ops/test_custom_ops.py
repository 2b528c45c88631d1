"""Every op as a PyTorch custom op, Triton kernel and torch reference alike: schemas and fake
(meta) implementations (opcheck), a torch.compile(fullgraph=True) pipeline that matches eager, and on the GPU a CUDA graph of the
routing + token movement path whose replays follow a routing that changes between them."""

from __future__ import annotations

import pytest
import torch

from shufflemoe.ops import (combine_shuffling, gather_scale, grouped_gemm, index_shuffle,
                            scatter_add, silu_mul, sort_by_expert, split_shuffling)
from shufflemoe.testing import assert_close

pytest.importorskip("triton")

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
T, E, K, D, I = 12, 8, 2, 32, 24


def inputs(seed: int = 0, device: str = DEV, T: int = T, E: int = E, D: int = D, I: int = I):
    g = torch.Generator().manual_seed(seed)
    return dict(x=torch.randn(T, D, generator=g).to(device, torch.bfloat16),
                scores=torch.randn(T, E, generator=g).to(device, torch.bfloat16),
                w13=(torch.randn(E, 2 * I, D, generator=g) / D**0.5).to(device, torch.bfloat16),
                w2=(torch.randn(E, D, I, generator=g) / I**0.5).to(device, torch.bfloat16))


def pipeline(x, scores, w13, w2, impl="triton"):
    """index_shuffle -> gather_scale (token-major, bf16 and fp8) -> per-pair expert matmuls (torch) ->
    silu_mul -> scatter_add (atomic and token-major); then an EP-style combine/split round trip of the gathered rows."""
    r = index_shuffle(scores, K, scoring="softmax", renormalize=True, impl=impl)
    xs = gather_scale(x, r.token_ids, None, num_valid=r.num_valid, positions=r.positions,
                      impl=impl)
    q, s = gather_scale(x, r.token_ids, r.weights, num_valid=r.num_valid, quantize=True,
                        positions=r.positions, impl=impl)
    e = r.expert_ids.long().clamp(0, w13.shape[0] - 1)
    h = torch.bmm(w13[e], xs[:, :, None].to(w13.dtype))[:, :, 0]  # [A, 2I]
    a = silu_mul(h, num_valid=r.num_valid, impl=impl)
    y = torch.bmm(w2[e], a[:, :, None])[:, :, 0]  # [A, D]
    out = torch.zeros_like(x)
    scatter_add(out, y, r.token_ids, r.weights, num_valid=r.num_valid, impl=impl)
    out_tm = scatter_add(torch.zeros_like(x), y, r.token_ids, r.weights, num_valid=r.num_valid,
                         positions=r.positions, impl=impl)
    counts = r.counts.view(2, -1)  # two "ranks" of E / 2 local experts
    starts = torch.cat([torch.zeros_like(r.num_valid), counts[0].sum().view(1).int()])
    em, totals = combine_shuffling(xs, counts, starts, out_rows=xs.shape[0], impl=impl)
    back = split_shuffling(em, counts, starts, out=torch.zeros_like(xs), impl=impl)
    return dict(counts=r.counts, token_ids=r.token_ids, q=q.view(torch.uint8), s=s, out=out,
                out_tm=out_tm, totals=totals, back=back, xs=xs, nv=r.num_valid,
                positions=r.positions)


def check_same(got: dict, want: dict, same_weights: bool = True) -> None:
    """Indices and moved rows exactly; the fp8 rows exactly when both runs had the same routing
    weights (the torch softmax differs from the kernel's in the last bits), else within fp8."""
    n = int(want["nv"])
    for key in ("counts", "token_ids", "totals", "nv", "positions"):
        assert torch.equal(got[key], want[key]), key
    for key in ("xs", "back") + (("q", "s") if same_weights else ()):
        assert torch.equal(got[key][:n], want[key][:n]), key
    if not same_weights:
        deq = [d["q"][:n].view(torch.float8_e4m3fn).double() * d["s"][:n, None] for d in (got, want)]
        assert_close(deq[0], deq[1], "fp8_rowwise")
    assert_close(got["out"], want["out"].double(), torch.bfloat16)  # atomics: order may differ
    assert_close(got["out_tm"], want["out_tm"].double(), torch.bfloat16)
    if same_weights:  # token-major: a fixed order, so the same bits
        assert torch.equal(got["out_tm"], want["out_tm"])


def empty(*shape, dtype=torch.float32):
    """An uninitialised tensor on DEV (the ops under opcheck write it)."""
    return torch.empty(*shape, dtype=dtype, device=DEV)


def _opcheck_cases() -> dict[str, tuple]:
    """Arguments for every op shufflemoe registers, kernel and reference alike."""
    d = inputs(device=DEV)
    r = index_shuffle(d["scores"], K, impl="torch")
    A = r.num_pairs

    i32, fp8 = torch.int32, torch.float8_e4m3fn
    routing = (empty(E, dtype=i32), empty(A, dtype=i32), empty(A, dtype=i32), empty(A), empty(1, dtype=i32),
               empty(A, dtype=i32))
    h = torch.randn(A, 2 * I, device=DEV)
    counts = r.counts.view(2, -1)
    starts = torch.tensor([0, 5], device=DEV)
    x, w13 = d["x"].float(), d["w13"].float()
    y = h[:, :I].contiguous()
    topk = torch.randint(0, E, (T, K), device=DEV)
    scatter = (x[r.token_ids.long()], w13[:, :D].contiguous(), r.counts, None, None, None,
               r.weights, r.token_ids, torch.zeros(T, D, device=DEV))
    cases = {
        "route": (d["scores"], None, None, *routing, None, None, None, E, K, True, 1, True, 1.0,
                  None, 0, 0, 2, False, 16, 16, True, 4, 128),  # one program (16 tokens >= T): no scratch
        "index_shuffle_ref": (d["scores"], K, "softmax", True, 1.0, None, None, 0, 0, 2,
                              False, *routing),
        "sort_by_expert_ref": (topk, E, None, 1, False, *routing),
        "gather_scale": (d["x"], r.token_ids, r.weights, r.num_valid, r.positions,
                         empty(A, D, dtype=d["x"].dtype)),  # token-major
        "gather_scale_ref": (d["x"], r.token_ids, r.weights, r.num_valid,
                             empty(A, D, dtype=d["x"].dtype)),
        "gather_scale_fp8": (d["x"], r.token_ids, r.weights, r.num_valid, r.positions,
                             empty(A, D, dtype=fp8), empty(A)),  # token-major
        "gather_scale_fp8_ref": (d["x"], r.token_ids, None, r.num_valid, empty(A, D, dtype=fp8),
                                 empty(A), "rowwise"),
        "gather_scale_groups": (d["x"], r.token_ids, r.weights, r.num_valid,
                                empty(A, D, dtype=fp8), empty(A, -(-D // 128))),
        "gather_scale_fp8_ref": (d["x"], r.token_ids, None, r.num_valid, empty(A, D, dtype=fp8),
                                 empty(A, -(-D // 128)), "groups"),
        # x's rows gathered in the loads, the GLU in the epilogue: every argument set
        "grouped_gemm": (x, w13, r.counts, None, None, None, None, None, empty(A, I), "add",
                         "none", None, None, r.token_ids, "swiglu_oai", 1.702, 7.0),
        "grouped_gemm_ref": (*scatter, True, "none", torch.randn(E, D, device=DEV), None, False,
                             True, None, None, 1.0, None),
        "silu_mul": (h, r.num_valid, empty(A, I), "swiglu_oai", 1.702, 7.0),
        "silu_mul_fp8": (h, None, empty(A, I, dtype=fp8), empty(A), "silu", 1.0, None),
        "silu_mul_fp8_groups": (h, r.num_valid, empty(A, I, dtype=fp8), empty(A, 1), "swiglu_oai",
                                1.702, 7.0),
        "quantize_fp8_groups": (h, r.num_valid, empty(A, 2 * I, dtype=fp8), empty(A, 1), 128),
        "scatter_add": (torch.zeros(T, I, device=DEV), y, r.token_ids, r.weights, r.num_valid, None),
        "scatter_add_token_major": (torch.zeros(T, I, device=DEV), y, r.positions, r.weights,
                                    r.num_valid, torch.arange(A, dtype=i32, device=DEV), False),
        "combine_shuffling": (h, counts, starts, empty(A, 2 * I), empty(E // 2, dtype=i32)),
        "split_shuffling": (h, counts, starts, empty(A, 2 * I)),
        "decode_gate_up": (d["x"], d["w13"], None, r.counts, r.token_ids, r.weights,
                           empty(A, I, dtype=torch.bfloat16), None, None, None, 0, "none",
                           torch.randn(E, 2 * I, device=DEV).to(torch.bfloat16), "swiglu_oai",
                           1.702, 7.0, torch.zeros(1024, dtype=i32, device=DEV), None, False),
        "router_logits": (d["x"], torch.randn(E, D, device=DEV).to(d["x"].dtype),
                          torch.randn(E, device=DEV).to(d["x"].dtype), empty(T, E, dtype=d["x"].dtype)),
        "decode_down": (torch.randn(A, I, device=DEV).to(torch.bfloat16), None, None,
                        d["w13"][:, :D, :I].contiguous(), None, r.counts, r.token_ids,
                        r.positions, r.weights, torch.zeros(T, D, dtype=torch.bfloat16,
                                                            device=DEV), True, 1, "none",
                        torch.randn(E, D, device=DEV).to(torch.bfloat16),
                        torch.zeros(1024, dtype=i32, device=DEV), None, False,
                        torch.randn(T, D, device=DEV).to(torch.bfloat16),  # a gate on each row
                        torch.randn(1, D, device=DEV).to(torch.bfloat16)),
    }
    refs = {  # the references of the kernels above take the same arguments
        "silu_mul", "silu_mul_fp8", "silu_mul_fp8_groups",
        "quantize_fp8_groups", "scatter_add", "scatter_add_token_major", "combine_shuffling",
        "split_shuffling", "decode_gate_up", "decode_down"}
    cases.update({f"{name}_ref": cases[name] for name in refs})
    # Outside the interpreter each kernel op is also a triton_op for torch.compile to trace
    # (ops/_impl.py), with the same arguments.
    from torch._library.custom_ops import OPDEFS
    cases.update({f"{name}_kernels": cases[name] for name in list(cases)
                  if f"shufflemoe::{name}_kernels" in OPDEFS})
    return cases


def test_opcheck_every_op():
    """Schemas and fake implementations of every registered op (kernels run in the interpreter
    on the CPU), and no op left unchecked."""
    from torch._library.custom_ops import OPDEFS

    cases = _opcheck_cases()
    registered = {n.split("::")[1] for n in OPDEFS if n.startswith("shufflemoe::")}
    assert registered == set(cases), registered ^ set(cases)
    for name, args in cases.items():
        # test_schema compares values with arithmetic torch lacks for float8 on the CPU
        fp8 = any(isinstance(a, torch.Tensor) and a.dtype == torch.float8_e4m3fn for a in args)
        utils = ("test_faketensor",) if fp8 else ("test_schema", "test_faketensor")
        torch.library.opcheck(getattr(torch.ops.shufflemoe, name), args, test_utils=utils)


@pytest.mark.parametrize("grouped", [False, True])
def test_opcheck_route_in_blocks(grouped):
    """The routing in blocks of 4 tokens, with the scratch a single program goes without; and
    DeepSeek-V3's grouped selection (2 groups, 1 kept, a bias; DeepSeek-V2's group score, its
    best; the scores rounded) in them."""
    from torch._library.custom_ops import OPDEFS

    d = inputs(device=DEV)
    i32, nb, P = torch.int32, -(-T // 4), 4 * K
    A = T * K
    bias, groups = ((torch.randn(E, device=DEV), (2, 1, 1, True)) if grouped
                    else (None, (0, 0, 2, False)))
    args = (d["scores"], None, bias, empty(E, dtype=i32), empty(A, dtype=i32),
            empty(A, dtype=i32), empty(A), empty(1, dtype=i32), empty(A, dtype=i32),
            empty(2, nb * P, dtype=i32), empty(nb * P), empty(nb, 32, dtype=i32), E, K, True,
            2 if grouped else 1, True, 1.0, None, *groups, 4, 16, False, 4, 128)
    for name in ("route", "route_kernels"):
        if f"shufflemoe::{name}" in OPDEFS:
            torch.library.opcheck(getattr(torch.ops.shufflemoe, name), args,
                                  test_utils=("test_schema", "test_faketensor"))


def test_traced_kernels_op_has_the_opaque_ops_schema():
    """Each kernel launcher is also a triton_op whose body is static_sizes_only (made on any
    machine, registered outside the interpreter): torch.library infers its schema from that
    body's signature, which must be the opaque op's, its annotations resolved (string
    annotations would be evaluated in the wrong module: 2026-11-25, every import on a GPU)."""
    from torch._library.infer_schema import infer_schema

    from shufflemoe.ops._impl import KERNEL_OPS

    assert len(KERNEL_OPS) >= 10
    for name, call in KERNEL_OPS.items():
        got = infer_schema(call.static_sizes_only, mutates_args=call.mutates_args)
        want = str(call.op._opoverload._schema)
        assert want.endswith(got.split("(", 1)[1]), (name, got, want)


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_all_rows_hint(impl):
    """index_shuffle without a capacity says every pair is routed; grouped_gemm's all_rows (no
    tail: nothing to mask) then gives what the masked path gives."""
    d = inputs(seed=2, device=DEV)
    r = index_shuffle(d["scores"], K, scoring="softmax", impl="torch")
    assert r.all_routed and not index_shuffle(d["scores"], K, capacity=2, impl="torch").all_routed
    assert not sort_by_expert(r.expert_ids.view(T, K).long(), E, impl="torch").all_routed
    xs = gather_scale(d["x"], r.token_ids, impl=impl)
    outs = [grouped_gemm(xs, d["w13"][:, :D].contiguous(), r.counts, row_weights=r.weights,
                         scatter_ids=r.token_ids, out=torch.zeros_like(d["x"]), all_rows=full,
                         scatter="add", impl=impl) for full in (False, True)]
    assert_close(outs[1], outs[0].double(), torch.bfloat16)


@pytest.mark.parametrize("name", ["grouped_gemm", "grouped_gemm_ref"])
@pytest.mark.parametrize("quantization", ["fp8_w8a16", "fp8_block", "mxfp4"])
def test_opcheck_weight_formats(name, quantization):
    """The grouped GEMM ops' fake implementations and schemas with each weight format's
    operands and a bias."""
    from shufflemoe.ops.quantize import reference as qref
    from shufflemoe.ops.quantize.formats import FORMATS

    fmt = FORMATS[quantization]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(10, 64, generator=g).to(torch.bfloat16)
    wq, ws = fmt.quantize(torch.randn(3, 48, 64, generator=g), 24 if quantization == "fp8_block" else None)
    xs = None
    if fmt.activation == "groups":
        x, xs = qref.quantize_fp8_groups(x)
    args = (x, wq, torch.tensor([4, 0, 6], dtype=torch.int32), xs, ws, None, None, None,
            torch.empty(10, 48, dtype=torch.bfloat16), True if name == "grouped_gemm_ref" else "add",
            quantization, torch.randn(3, 48), 24 if quantization == "fp8_block" else None)
    if name == "grouped_gemm_ref":
        args += (False, False)  # all_rows, store
    args += (None, None if name == "grouped_gemm_ref" else "none", 1.0, None)  # no gather, GLU
    args = tuple(a.to(DEV) if isinstance(a, torch.Tensor) else a for a in args)
    torch.library.opcheck(getattr(torch.ops.shufflemoe, name), args, test_utils=("test_faketensor",))


def test_compile_fullgraph_matches_eager():
    d = inputs(seed=1)
    eager = pipeline(**d)
    check_same(eager, pipeline(**d, impl="torch"), same_weights=False)
    compiled = torch.compile(pipeline, fullgraph=True)(**d)
    check_same(compiled, eager)


def test_sort_by_expert_compiles():
    ids = torch.tensor([[0, 3], [3, 9], [1, 0]], device=DEV)
    f = torch.compile(lambda i: sort_by_expert(i, 4, capacity=1, impl="triton").token_ids,
                      fullgraph=True, backend="aot_eager")
    assert torch.equal(f(ids), sort_by_expert(ids, 4, capacity=1, impl="torch").token_ids)


@needs_cuda
def test_gpu_cuda_graph_replays_match_eager():
    big = dict(T=300, E=16, D=512, I=256)
    static = inputs(seed=0, **big)
    pipeline(**static)  # compile every kernel before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = pipeline(**static)
    for seed in (1, 2, 3):
        fresh = inputs(seed=seed, **big)
        if seed == 3:
            fresh["scores"][:, 5] += 20.0  # nearly every token on one expert
        for name in ("x", "scores"):
            static[name].copy_(fresh[name])
        graph.replay()
        torch.cuda.synchronize()
        check_same(captured, pipeline(**static))
